"""The page of a `MemWatch`, from its public methods: what
`MemWatch.report_html`, the demo and the out-of-memory guard write."""

from __future__ import annotations

import sys
from typing import Any, Optional

import pandas as pd

from keras_memwatch.explain.html.identity import process_versions
from keras_memwatch.explain.html.write import PathLike, write_html_report

__all__ = ["watch_options", "write_watch_report"]

#: The options of a watch the page lists (its public attributes).
OPTIONS = ("every_n_batches", "window", "threshold", "min_delta_mb", "warmup",
           "log_path", "add_to_logs", "verbose", "max_rows", "memory_config",
           "compilation_cache")


def watch_options(watch: Any) -> dict[str, Any]:
    """The options a watch was made with, as its attributes give them."""
    return {name: getattr(watch, name) for name in OPTIONS if hasattr(watch, name)}


def write_watch_report(watch: Any, path: PathLike, *,
                       by_layer: Optional[pd.DataFrame] = None,
                       capacity: Any = None, ways: Optional[pd.DataFrame] = None,
                       overwrite: bool = False) -> str:
    """Writes the page of a watch's record (see `write_html_report`): its
    rows, spikes, breakdown (with the model's weights and optimizer state),
    summary, sources, options, the backend and this process's versions.

    Args:
        watch: the `MemWatch`.
        path: the new file, ending in `.html`.
        by_layer: its by-layer table, where computed. Defaults to `None`.
        capacity: a `CapacityEstimate` of the model. Defaults to `None`.
        ways: `ways_to_fit(...)` of the model. Defaults to `None`.
        overwrite: replace an existing file. Defaults to `False`.

    Returns:
        `path`, as a string.

    Raises:
        ImportError: without plotly (`pip install 'keras-memwatch[html]'`).
        FileExistsError: for an existing `path` unless `overwrite`.
        ValueError, TypeError: for a bad `path` or table.
    """
    keras = sys.modules.get("keras")
    backend = keras.backend.backend() if keras is not None else None
    return write_html_report(
        path, watch.to_dataframe(), watch.spikes, breakdown=watch.breakdown(),
        by_layer=by_layer, capacity=capacity, ways=ways, sources=watch.sources,
        summary=watch.summary(),
        identity={"backend": backend, "versions": process_versions(),
                  "options": watch_options(watch)},
        overwrite=overwrite)
