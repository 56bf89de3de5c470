"""What is derived from a record: each figure defined once, for every output.

The callback, the summary, the plot, the OOM report and the command line
all take these from here, so they always agree:

- the memory *in use before* a step: the previous sample's
  `current_bytes` on the same device; where the step's peak comes from
  XLA's plan (a JAX GPU), the lowest reading since the call began
  (`SettledInUse`), since later readings may hold steps still in flight;
- a step's *working memory*: its peak minus the memory in use before it;
- a device's *limit*: the allocator's limit where the framework has one,
  else the device's total (NVML);
- the *main device*: the first accelerator, else the host;
- the *spike table*: one row per spike, `SPIKE_COLUMNS`;
- drift and sources, replayed from a record alone (a streamed log read
  without its `MemWatch`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

import numpy as np
import pandas as pd

from keras_memwatch import columns as C
from keras_memwatch.judge.events import ratio

#: The sources of a device's limit, best first.
LIMIT_SOURCES = (C.ALLOCATOR_LIMIT, C.NVML_TOTAL)

#: The columns of the spike table (`MemWatch.spikes`).
SPIKE_COLUMNS = ("step", "epoch", "batch", "device", "peak_bytes",
                 "baseline_bytes", "ratio", "working_bytes",
                 "usual_working_bytes", "phase", "call", "layer")

class SettledInUse:
    """The memory in use between steps on a device whose step peaks come
    from XLA's plan (JAX): the lowest reading since the call began.

    With asynchronous dispatch a reading taken after a step can hold the
    buffers of steps still in flight, and on a busy accelerator every
    reading after the first steps may hold one: adding a plan to such a
    reading counts a step twice. The call's first reading, at its start,
    holds no step, so the lowest reading since then holds the least in
    flight. A step's planned peak is that plus the plan: its own need over
    what stayed in use, never above its reading plus the plan. A rise in
    what stays in use during a call shows in `current_bytes` and the drift
    and rise reports, not in the peaks.
    """

    __slots__ = ("_lowest",)

    def __init__(self) -> None:
        self._lowest: Optional[int] = None

    def push(self, current: Optional[int]) -> Optional[int]:
        """Takes the next reading (`None` or negative: missing, skipped);
        returns the memory in use between steps at it, or `None` before any
        reading."""
        if current is not None and current >= 0 and (
                self._lowest is None or current < self._lowest):
            self._lowest = current
        return self._lowest

    def push_many(self, current: np.ndarray) -> np.ndarray:
        """`push` of each value of an int64 array (-1: missing); -1 where
        there is none yet."""
        push = self.push
        return np.fromiter((-1 if v is None else v
                            for v in map(push, current.tolist())),
                           np.int64, len(current))


def working_memory(peak: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Steps' working memory: their peak above the memory in use before."""
    return np.maximum(peak - before, 0)


def in_use_before(rows: pd.DataFrame) -> pd.Series:
    """The memory in use before each row's step, per call: the previous
    row's current bytes, or where the call's peaks come from XLA's plan,
    the memory in use between steps (`SettledInUse`). `rows` are one
    device's, in step order within each call."""
    if rows.empty:
        return rows["current_bytes"].astype("Int64")
    parts = []
    calls = rows[C.CALL] if C.CALL in rows.columns else pd.Series(0, rows.index)
    for _, part in rows.groupby(calls, sort=False):
        current = part["current_bytes"]
        if peaks_from_plan(part, str(part["device"].iloc[0])):
            values = current.fillna(-1).to_numpy(np.int64)
            settled = SettledInUse().push_many(values)
            parts.append(pd.Series(pd.arrays.IntegerArray(settled, settled < 0),
                                   index=part.index))
        else:
            parts.append(current.shift(1))
    return pd.concat(parts).reindex(rows.index)


def working_memory_of(rows: pd.DataFrame) -> pd.Series:
    """`working_memory` of each of one device's rows, in step order
    (missing where the peak or the memory before is)."""
    return (rows["peak_bytes"] - in_use_before(rows)).clip(lower=0)


def reserved_unallocated(rows: pd.DataFrame) -> pd.Series:
    """What the framework's allocator holds from the device but has not
    handed out (fragmentation, its cache), per row; missing where the
    framework gives no reserve."""
    return (rows[C.ALLOCATOR_RESERVED] - rows[C.ALLOCATOR_CURRENT]).clip(lower=0)


def peaks_from_plan(rows: pd.DataFrame, device: str) -> bool:
    """Whether a device's peaks are XLA's plan of each step (a JAX GPU)."""
    return device != C.HOST_DEVICE and bool(rows[C.PLAN].notna().any())


def device_limit(row: Mapping[str, Any]) -> tuple[Optional[int], Optional[str]]:
    """`(bytes, column)` of a device's limit in one row, or `(None, None)`."""
    for column in LIMIT_SOURCES:
        try:
            value = int(row.get(column))  # None, NaN and NA raise
        except (TypeError, ValueError):
            continue
        if value > 0:
            return value, column
    return None, None


def limit_of(rows: pd.DataFrame) -> Optional[int]:
    """A device's limit over its rows: the largest of the best source."""
    for column in LIMIT_SOURCES:
        values = rows[column].dropna()
        if not values.empty and values.max() > 0:
            return int(values.max())
    return None


def main_device(devices: Iterable[str]) -> Optional[str]:
    """The first accelerator among `devices`, else the host (or None)."""
    devices = [str(d) for d in devices]
    return next((d for d in devices if d != C.HOST_DEVICE),
                devices[0] if devices else None)


def spike_table(events: Sequence[Any]) -> pd.DataFrame:
    """The spike table of `SpikeEvent`s, one row each."""
    return pd.DataFrame([[getattr(e, c) for c in SPIKE_COLUMNS] for e in events],
                        columns=list(SPIKE_COLUMNS))


def spikes_from_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The spike table of a record, as `MemWatch.spikes` gives it.

    A row's usual working memory is its baseline minus the memory in use
    before its step.

    Args:
        frame: a record, e.g. `load_log(path)`.

    Returns:
        One row per spiking sample, with `SPIKE_COLUMNS`.
    """
    parts = []
    for _, rows in frame.groupby("device", observed=True, sort=False):
        rows = rows.sort_values([C.CALL, "step"], kind="stable")
        before = in_use_before(rows)
        hit = rows[rows["spike"]].copy()
        if hit.empty:
            continue
        hit["working_bytes"] = working_memory_of(rows)[hit.index]
        hit["usual_working_bytes"] = hit["baseline_bytes"] - before[hit.index]
        hit["ratio"] = [ratio(w, u) for w, u in
                        zip(hit["working_bytes"].astype("float64"),
                            hit["usual_working_bytes"].astype("float64"))]
        hit["layer"] = None  # a log does not say which layer grew
        parts.append(hit)
    if not parts:
        return pd.DataFrame(columns=list(SPIKE_COLUMNS))
    out = pd.concat(parts).sort_values([C.CALL, "step", "device"], kind="stable")
    out["device"] = out["device"].astype(str)
    out["phase"] = out["phase"].astype(str)
    return out[list(SPIKE_COLUMNS)].reset_index(drop=True)


def drift_from_frame(frame: pd.DataFrame, window: int = 50,
                     min_delta_mb: float = 64) -> list[tuple]:
    """Replays drift detection over a record, as MemWatch ran it: on the
    rolling median of the memory in use after each training step.

    Args:
        frame: a record, e.g. `load_log(path)`.
        window: the rolling window, in samples. Defaults to `50`.
        min_delta_mb: the growth a leak exceeds, in MiB. Defaults to `64`.
            (MemWatch's defaults; a log does not record its options.)

    Returns:
        `(device, epoch, DriftEvent)` tuples.
    """
    return replay_drift(frame, window, min_delta_mb)[0]


def rises_from_frame(frame: pd.DataFrame, window: int = 50,
                     min_delta_mb: float = 64) -> list[tuple]:
    """The one-off rises (not leaks) that `drift_from_frame` sets apart:
    `(device, epoch, RiseEvent)` tuples."""
    return replay_drift(frame, window, min_delta_mb)[1]


def replay_drift(frame: pd.DataFrame, window: int = 50,
                 min_delta_mb: float = 64) -> tuple[list[tuple], list[tuple]]:
    """`(drift_from_frame(...), rises_from_frame(...))` in one replay."""
    from keras_memwatch.judge.drift import DriftMonitor

    drift, rises = [], []
    for device, rows in frame.groupby("device", observed=True, sort=False):
        rows = rows.sort_values("step")
        monitor = DriftMonitor(min_delta_mb, smooth=window)
        judged = ((rows["phase"] == "train") & rows["batch"].notna()
                  & rows["current_bytes"].notna())
        for epoch in sorted(rows["epoch"].unique()):
            for current in rows.loc[judged & (rows["epoch"] == epoch), "current_bytes"]:
                monitor.update(float(current))
            seen = len(monitor.rises)
            event = monitor.end_epoch()
            rises.extend((str(device), int(epoch), r) for r in monitor.rises[seen:])
            if event is not None:
                drift.append((str(device), int(epoch), event))
    return drift, rises


def log_sources(frame: pd.DataFrame) -> dict[str, str]:
    """What a record alone says about its sources: the columns with values."""
    seen = [c for c in C.SOURCE_COLUMNS if frame[c].notna().any()]
    empty = [c for c in C.SOURCE_COLUMNS if c not in seen]
    notes = {"log": "columns with values: " + (", ".join(seen) or "none")}
    if empty:
        notes["log (empty columns)"] = (
            "unavailable: no values for " + ", ".join(empty)
            + " (the probes' reasons are not kept in a log)")
    return notes
