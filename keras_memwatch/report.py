"""The text summary: where the memory went, per device.

`summarize` renders a fit's record for a person. `spikes_from_frame` and
`drift_from_frame` rebuild the spike table and drift events from a record
alone, for a streamed log read without its `MemWatch`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import pandas as pd

from keras_memwatch.breakdown import device_memory, format_breakdown, memory_breakdown
from keras_memwatch.columns import HOST_DEVICE
from keras_memwatch.units import format_bytes

SPIKE_COLUMNS = ("step", "epoch", "batch", "device", "peak_bytes",
                 "baseline_bytes", "ratio", "working_bytes",
                 "usual_working_bytes")

_MAX_LISTED = 12  # spikes listed by place before "... and N more"


def _where(spikes: pd.DataFrame) -> str:
    places = [f"{e}/{b}" for e, b in zip(spikes["epoch"], spikes["batch"])]
    text = ", ".join(places[:_MAX_LISTED])
    if len(places) > _MAX_LISTED:
        text += f", ... and {len(places) - _MAX_LISTED} more"
    return text


def _strip(name: str, note: str) -> str:
    prefix = f"{name}:"
    return note[len(prefix):].strip() if note.startswith(prefix) else note


def _device_lines(device: str, info: dict, spikes: pd.DataFrame) -> list[str]:
    lines = [
        f"{device}: peak {format_bytes(info['peak_bytes'])}, typical step peak "
        f"{format_bytes(info['typical_peak_bytes'])}, in use between steps "
        f"{format_bytes(info['in_use_bytes'])}"
    ]
    limit, peak = info["limit_bytes"], info["peak_bytes"]
    if limit is not None and peak is not None:
        lines.append(
            f"  limit {format_bytes(limit)}, headroom at peak "
            f"{format_bytes(max(limit - peak, 0))} ({1 - peak / limit:.0%})")
    elif device == HOST_DEVICE:
        lines.append("  limit: not recorded for the host, so no headroom")
    else:
        lines.append("  limit: no source reported one, so no headroom")
    mine = spikes[spikes["device"].astype(str) == device] if len(spikes) else spikes
    if len(mine):
        worst = mine.loc[mine["peak_bytes"].astype("float64").idxmax()]
        ratio = worst.get("ratio")
        why = "" if ratio is None or pd.isna(ratio) else (
            f" ({float(ratio):.1f}x the usual step)")
        lines.append(
            f"  {len(mine)} spike(s); worst {format_bytes(worst['peak_bytes'])} "
            f"at epoch {worst['epoch']} batch {worst['batch']}{why}; "
            f"at epoch/batch: {_where(mine)}")
    else:
        lines.append("  no spikes")
    return lines


def summarize(
    frame: pd.DataFrame,
    spikes: pd.DataFrame,
    drift: Sequence[tuple] = (),
    sources: Mapping[str, str] = {},
    breakdown: Optional[Mapping[str, Any]] = None,
) -> str:
    """Renders a short report of one fit.

    First where the memory went (weights, optimizer state, a step's working
    memory, see `memory_breakdown`), then per device the peak, the typical
    step peak, the memory in use between steps, the limit and headroom and
    the spikes; then drift, and which sources could see what (and which
    were unavailable, and why).

    Args:
        frame: the record (`MemWatch.to_dataframe()` or `load_log(...)`).
        spikes: the spike events (`MemWatch.spikes` or `spikes_from_frame`).
        drift: `(device, epoch, DriftEvent)` tuples. Defaults to `()`.
        sources: probe name -> what it could or could not see; a note that
            starts with "unavailable:" lists the probe as not available.
            Defaults to `{}`.
        breakdown: `memory_breakdown(...)` of the fit. Defaults to `None`:
            computed from `frame` alone (weights and optimizer state then
            read as unknown without the model).

    Returns:
        Lines of text for a person.
    """
    if frame.empty:
        return "keras_memwatch: no samples recorded."
    train = frame[frame["phase"] == "train"]
    steps = train[train["batch"].notna()]
    lines = [
        f"keras_memwatch summary: {steps['step'].nunique()} training steps "
        f"sampled over {int(train['epoch'].max()) + 1} epoch(s)",
        "",
    ]
    if breakdown is None:
        breakdown = memory_breakdown(None, frame)
    lines.append(format_breakdown(breakdown))
    lines += ["", "Memory per device:"]
    devices = breakdown.get("devices") or device_memory(frame)
    for device, info in devices.items():
        lines.extend("  " + line for line in _device_lines(device, info, spikes))
    if drift:
        lines.append("Drift (steady growth of memory in use, a leak?):")
        lines.extend(f"  {device} in epoch {epoch}: {event.message}"
                     for device, epoch, event in drift)
    else:
        lines.append("Drift: none")
    available = {k: v for k, v in sources.items() if not v.startswith("unavailable:")}
    missing = {k: v[len("unavailable:"):].strip() for k, v in sources.items()
               if v.startswith("unavailable:")}
    if available:
        lines.append("Sources:")
        lines.extend(f"  {name}: {_strip(name, note)}" for name, note in available.items())
    if missing:
        lines.append("Not available:")
        lines.extend(f"  {name}: {note}" for name, note in missing.items())
    return "\n".join(lines)


def spikes_from_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The spike table of a record, as `MemWatch.spikes` gives it.

    A row's working memory is its peak minus the memory in use at the
    previous sample of its device; its usual working memory is its
    baseline minus that same memory in use.

    Args:
        frame: a record, e.g. `load_log(path)`.

    Returns:
        One row per spiking sample, with `SPIKE_COLUMNS`.
    """
    parts = []
    for _, rows in frame.groupby("device", observed=True, sort=False):
        rows = rows.sort_values("step")
        before = rows["current_bytes"].shift(1)
        hit = rows[rows["spike"]].copy()
        if hit.empty:
            continue
        hit["working_bytes"] = hit["peak_bytes"] - before[hit.index]
        hit["usual_working_bytes"] = hit["baseline_bytes"] - before[hit.index]
        hit["ratio"] = (hit["working_bytes"].astype("float64")
                        / hit["usual_working_bytes"].astype("float64").clip(lower=1))
        parts.append(hit)
    if not parts:
        return pd.DataFrame(columns=list(SPIKE_COLUMNS))
    out = pd.concat(parts).sort_values(["step", "device"], kind="stable")
    out["device"] = out["device"].astype(str)
    return out[list(SPIKE_COLUMNS)].reset_index(drop=True)


def drift_from_frame(frame: pd.DataFrame, window: int = 50,
                     min_delta_mb: float = 64) -> list[tuple]:
    """Replays drift detection over a record, as MemWatch ran it: on the
    rolling median of the memory in use after each judged step.

    Args:
        frame: a record, e.g. `load_log(path)`.
        window: the rolling window, in samples. Defaults to `50`.
        min_delta_mb: the growth a leak exceeds, in MiB. Defaults to `64`.
            (MemWatch's defaults; a log does not record its options.)

    Returns:
        `(device, epoch, DriftEvent)` tuples.
    """
    from keras_memwatch.detector import DriftMonitor

    events = []
    for device, rows in frame.groupby("device", observed=True, sort=False):
        rows = rows.sort_values("step")
        before = rows["current_bytes"].shift(1)
        monitor = DriftMonitor(min_delta_mb, smooth=window)
        judged = ((rows["phase"] == "train") & rows["batch"].notna()
                  & before.notna() & rows["peak_bytes"].notna()
                  & rows["current_bytes"].notna())
        for epoch in sorted(rows["epoch"].unique()):
            for current in rows.loc[judged & (rows["epoch"] == epoch), "current_bytes"]:
                monitor.update(float(current))
            event = monitor.end_epoch()
            if event is not None:
                events.append((str(device), int(epoch), event))
    return events


def log_sources(frame: pd.DataFrame) -> dict[str, str]:
    """What a record alone says about its sources: the columns with values."""
    from keras_memwatch import columns as C

    seen = [c for c in C.SOURCE_COLUMNS if frame[c].notna().any()]
    empty = [c for c in C.SOURCE_COLUMNS if c not in seen]
    notes = {"log": "columns with values: " + (", ".join(seen) or "none")}
    if empty:
        notes["log (empty columns)"] = (
            "unavailable: no values for " + ", ".join(empty)
            + " (the probes' reasons are not kept in a log)")
    return notes
