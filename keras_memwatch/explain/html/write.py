"""`write_html_report`: the arguments checked, the page built, the file
written (created, never replaced unless asked)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Optional, Union

import pandas as pd

from keras_memwatch import options
from keras_memwatch.explain.html.identity import run_identity
from keras_memwatch.explain.html.library import plotly_objects
from keras_memwatch.files import open_new, place_problem, refuse_existing
from keras_memwatch.judge.derived import SPIKE_COLUMNS

__all__ = ["html_path_problem", "write_html_report"]

logger = logging.getLogger("keras_memwatch")

PathLike = Union[str, "os.PathLike[str]"]

#: The columns the page reads from each table.
RECORD_COLUMNS = ("step", "epoch", "batch", "phase", "device", "peak_bytes",
                  "current_bytes", "baseline_bytes", "spike", "call", "process",
                  "hostname")
BY_LAYER_COLUMNS = ("layer", "class", "output_shape", "activation_bytes",
                    "grad_bytes", "working_bytes")
WAYS_COLUMNS = ("lever", "change", "need_bytes", "saved_bytes", "largest_batch",
                "step_time_ratio", "fits", "how", "notes")
EXTENSIONS = (".html", ".htm")


def html_path_problem(path: PathLike, overwrite: bool = False,
                      argument: str = "path",
                      replace: str = "overwrite=True") -> Optional[str]:
    """Why the report cannot be written at `path`, or `None`; creates nothing.

    Refused: a name without `.html` (or `.htm`), a folder, a missing or
    read-only folder, an existing file unless `overwrite`.

    Args:
        path: where the page is to go.
        overwrite: an existing file may be replaced. Defaults to `False`.
        argument: how the message names the path. Defaults to `"path"`.
        replace: how the message says to replace an existing file. Defaults
            to `"overwrite=True"`.

    Returns:
        One sentence naming the argument and the fix, or `None`.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        return (f"{argument} {path} is a folder: give a file name, e.g. "
                f"{os.path.join(path, 'memwatch.html')}")
    if not path.lower().endswith(EXTENSIONS):
        return (f"{argument} {path} does not end in .html: name the page e.g. "
                f"{os.path.splitext(path)[0] or 'memwatch'}.html")
    return place_problem(argument, path, overwrite, replace)


def _table(name: str, value: Any, needed: tuple[str, ...], what: str,
           optional: bool = True) -> Optional[pd.DataFrame]:
    if value is None and optional:
        return None
    if not isinstance(value, pd.DataFrame):
        raise options.expected(name, f"{what} (a pandas.DataFrame)"
                               + (" or None" if optional else ""),
                               type(value).__name__, TypeError)
    missing = [c for c in needed if c not in value.columns]
    if missing:
        raise ValueError(f"Expected `{name}` to be {what}, with the columns "
                         f"{', '.join(needed)}. Received: a DataFrame without "
                         f"{', '.join(missing)}")
    return value


def _mapping(name: str, value: Any) -> Optional[Mapping]:
    if value is not None and not isinstance(value, Mapping):
        raise options.expected(name, "a dict or None", type(value).__name__, TypeError)
    return value


def _capacity(value: Any) -> tuple[Optional[Mapping[str, Any]], Optional[str]]:
    """`(to_dict(), explanation)` of a `CapacityEstimate`, or of its
    `to_dict()` as given."""
    if value is None:
        return None, None
    if isinstance(value, Mapping):
        return value, None
    if callable(getattr(value, "to_dict", None)):
        return value.to_dict(), getattr(value, "explanation", None)
    raise options.expected("capacity", "a CapacityEstimate, its to_dict(), or None",
                           type(value).__name__, TypeError)


def write_html_report(
    path: PathLike,
    frame: pd.DataFrame,
    spikes: Optional[pd.DataFrame] = None,
    *,
    breakdown: Optional[Mapping[str, Any]] = None,
    by_layer: Optional[pd.DataFrame] = None,
    capacity: Any = None,
    ways: Optional[pd.DataFrame] = None,
    identity: Optional[Mapping[str, Any]] = None,
    sources: Optional[Mapping[str, str]] = None,
    summary: Optional[str] = None,
    overwrite: bool = False,
) -> str:
    """Writes one self-contained HTML page of a run (needs plotly).

    The page holds the timeline of every device (per process, for the
    record of several): the peak and the memory in use per step, the
    baseline band, the spikes marked, each point's epoch, batch, phase,
    call and bytes on hover; the spikes with their alert text and layer;
    where the memory went; and, where given, the by-layer table, the
    capacity estimate, the ways to fit, and the run's identity. plotly.js
    and the record are embedded: the page loads nothing from the network.
    Every row of the record is in the page; only the drawing is decimated,
    for a long record, to what the range in view needs.

    Args:
        path: the new file, ending in `.html`.
        frame: the record (`MemWatch.to_dataframe()` or `load_log(...)`).
        spikes: the spike table (`MemWatch.spikes`; a `layer` or
            `input_shape` column is shown where it has one). Defaults to
            `None`: replayed from `frame`, per process.
        breakdown: `memory_breakdown(...)`. Defaults to `None`: from
            `frame` alone (weights and optimizer state unknown).
        by_layer: the by-layer table. Defaults to `None`: not shown.
        capacity: a `CapacityEstimate`, or its `to_dict()`. Defaults to
            `None`: not shown.
        ways: `ways_to_fit(...)`. Defaults to `None`: not shown.
        identity: `backend`, `versions` and `options` of the run (see
            `explain.html.identity.run_identity`). Defaults to `None`:
            what the record says, and this process's versions.
        sources: probe -> what it could see (`MemWatch.sources`). Defaults
            to `None`: read from the record's columns.
        summary: the text summary shown at the end (`MemWatch.summary()`,
            or the `report` command's text). Defaults to `None`: the summary
            of `frame` (drift replayed from it).
        overwrite: replace an existing file. Defaults to `False`.

    Returns:
        `path`, as a string.

    Raises:
        ImportError: without plotly (`pip install 'keras-memwatch[html]'`).
        TypeError: for an argument of the wrong type.
        ValueError: for a table without the columns the page reads, or a
            path that does not end in `.html` or lies in a missing folder.
        FileExistsError: for an existing `path` unless `overwrite`.

    Example:

    ```python
    from keras_memwatch import load_log
    from keras_memwatch.explain.html import write_html_report

    write_html_report("memwatch.html", load_log("mem.csv"))
    ```
    """
    options.path("path", path)
    options.boolean("overwrite", overwrite)
    frame = _table("frame", frame, RECORD_COLUMNS, "a MemWatch record", optional=False)
    spikes = _table("spikes", spikes, SPIKE_COLUMNS, "a spike table")
    by_layer = _table("by_layer", by_layer, BY_LAYER_COLUMNS, "a by-layer table")
    ways = _table("ways", ways, WAYS_COLUMNS, "a ways-to-fit table")
    breakdown = _mapping("breakdown", breakdown)
    identity = _mapping("identity", identity)
    sources = _mapping("sources", sources)
    if summary is not None and not isinstance(summary, str):
        raise options.expected("summary", "a str or None", type(summary).__name__,
                               TypeError)
    capacity, explanation = _capacity(capacity)
    known = dict(identity or {})
    unknown = set(known) - {"backend", "versions", "options"}
    if unknown:
        raise ValueError("Expected `identity` to hold backend, versions or options. "
                         f"Received: identity keys {sorted(unknown)}")
    problem = html_path_problem(path, overwrite=True)
    if problem:
        raise ValueError(f"Expected `path` to be a new .html file in an existing "
                         f"folder. Received: {problem}")
    refuse_existing(path, overwrite)
    plotly_objects()
    from keras_memwatch.explain.html.page import build_page

    page = build_page(frame, spikes, breakdown=breakdown, by_layer=by_layer,
                      capacity=capacity, explanation=explanation, ways=ways,
                      identity=run_identity(frame, sources=sources, **known),
                      sources=sources, summary=summary)
    with open_new(path, overwrite) as f:
        f.write(page)
    logger.debug("HTML report written to %s", os.fspath(path))
    return os.fspath(path)
