"""The run's identity on the page: backend, devices, processes, versions,
options and sources."""

from __future__ import annotations

import datetime
import platform
import sys
from collections.abc import Mapping
from typing import Any, Optional

import pandas as pd

from keras_memwatch import columns as C
from keras_memwatch.judge.derived import log_sources

__all__ = ["process_versions", "run_identity"]

#: The frameworks whose version is given where this process imported them.
_FRAMEWORKS = ("keras", "tensorflow", "jax", "jaxlib", "torch", "plotly")

#: What a record read from a log cannot say.
NOT_IN_LOG = "not recorded in a log"


def process_versions() -> dict[str, str]:
    """The versions of Python, keras_memwatch and each framework this
    process has imported (none is imported here)."""
    from keras_memwatch.version import __version__

    out = {"keras_memwatch": __version__, "python": platform.python_version(),
           "platform": platform.platform(terse=True)}
    for name in _FRAMEWORKS:
        module = sys.modules.get(name)
        version = getattr(module, "__version__", None)
        if version is not None:
            out[name] = str(version)
    return out


def _record(frame: pd.DataFrame, backend: Optional[str]) -> dict[str, Any]:
    devices = [str(d) for d in pd.unique(frame["device"].astype(str))] if len(frame) else []
    processes = frame["process"].nunique() if len(frame) else 0
    hosts = sorted(str(h) for h in frame["hostname"].dropna().unique()) if len(frame) else []
    phases = frame.drop_duplicates(C.CALL)[[C.CALL, "phase"]] if len(frame) else frame
    out: dict[str, Any] = {
        "backend": backend or NOT_IN_LOG,
        "devices": ", ".join(devices) or "none",
        "processes": f"{processes} on {', '.join(hosts) or 'an unknown host'}",
        "calls": ", ".join(f"{int(c)}: {'fit' if p == 'train' else p}"
                           for c, p in zip(phases[C.CALL], phases["phase"])),
        "rows": f"{len(frame):,} (one per sampled batch per device)",
    }
    if "log" in frame.columns:
        out["logs"] = ", ".join(str(v) for v in pd.unique(frame["log"]))
    out["report written"] = datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC")
    return out


def run_identity(frame: pd.DataFrame, *, backend: Optional[str] = None,
                 versions: Optional[Mapping[str, Any]] = None,
                 options: Optional[Mapping[str, Any]] = None,
                 sources: Optional[Mapping[str, str]] = None
                 ) -> dict[str, dict[str, Any]]:
    """The run's identity, in sections of names and values.

    Args:
        frame: the record.
        backend: the Keras backend. Defaults to `None`: not recorded (a log).
        versions: name -> version. Defaults to `None`: this process's
            (`process_versions`), labelled as the report's.
        options: the watch's options. Defaults to `None`: not recorded.
        sources: probe -> what it could see. Defaults to `None`: what the
            record's columns say (`derived.log_sources`).

    Returns:
        Section title -> {name: value}.
    """
    out = {"Run": _record(frame, backend)}
    if versions is None:
        out["Versions (of the process that wrote this report)"] = process_versions()
    else:
        out["Versions"] = dict(versions)
    out["Options"] = dict(options) if options else {"options": NOT_IN_LOG}
    out["Sources"] = dict(sources) if sources else log_sources(frame)
    return out
