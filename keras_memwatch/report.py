"""The text summary: where the memory went, per device."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import pandas as pd

from keras_memwatch.breakdown import device_memory, format_breakdown, memory_breakdown
from keras_memwatch.columns import HOST_DEVICE
from keras_memwatch.derived import drift_from_frame, log_sources, spikes_from_frame
from keras_memwatch.units import format_bytes

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
    spikes: Optional[pd.DataFrame] = None,
    drift: Optional[Sequence[tuple]] = None,
    sources: Optional[Mapping[str, str]] = None,
    breakdown: Optional[Mapping[str, Any]] = None,
) -> str:
    """Renders a short report of one fit.

    First where the memory went (weights, optimizer state, a step's working
    memory, see `memory_breakdown`), then per device the peak, the typical
    step peak, the memory in use between steps, the limit and headroom and
    the spikes; then drift, and which sources could see what (and which
    were unavailable, and why).

    What is not given is replayed from `frame` alone, as for a streamed
    log read without its `MemWatch`.

    Args:
        frame: the record (`MemWatch.to_dataframe()` or `load_log(...)`).
        spikes: the spike table (`MemWatch.spikes`). Defaults to `None`:
            `derived.spikes_from_frame(frame)`.
        drift: `(device, epoch, DriftEvent)` tuples. Defaults to `None`:
            `derived.drift_from_frame(frame)`.
        sources: probe name -> what it could or could not see; a note that
            starts with "unavailable:" lists the probe as not available.
            Defaults to `None`: `derived.log_sources(frame)`.
        breakdown: `memory_breakdown(...)` of the fit. Defaults to `None`:
            computed from `frame` alone (weights and optimizer state then
            read as unknown without the model).

    Returns:
        Lines of text for a person.
    """
    if frame.empty:
        return "keras_memwatch: no samples recorded."
    spikes = spikes_from_frame(frame) if spikes is None else spikes
    drift = drift_from_frame(frame) if drift is None else drift
    sources = log_sources(frame) if sources is None else sources
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
