"""The text summary: where the memory went, per device."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

import pandas as pd

from keras_memwatch.units import format_bytes


def _value(series: pd.Series, how: str) -> Optional[int]:
    series = series.dropna()
    if series.empty:
        return None
    return int(getattr(series, how)())


def _fmt(n: Optional[int]) -> str:
    return "n/a" if n is None else format_bytes(n)


def summarize(
    frame: pd.DataFrame,
    spikes: pd.DataFrame,
    drift: Sequence[tuple] = (),
    sources: Mapping[str, str] = {},
) -> str:
    """Renders a short report of one fit.

    Args:
        frame: the record (`MemWatch.to_dataframe()` or `load_log(...)`).
        spikes: the spike events (`MemWatch.spikes`).
        drift: `(device, epoch, DriftEvent)` tuples.
        sources: probe name -> what it could or could not see.

    Returns:
        Lines of text for a person.
    """
    if frame.empty:
        return "keras_memwatch: no samples recorded."
    train = frame[frame["phase"] == "train"]
    lines = [
        f"keras_memwatch summary: {train['step'].nunique()} training samples, "
        f"{int(train['epoch'].max()) + 1} epoch(s)"
    ]
    for device, rows in train.groupby("device", observed=True, sort=False):
        peak = _value(rows["peak_bytes"], "max")
        typical = _value(rows["peak_bytes"], "median")
        lines.append(f"{device}: peak {_fmt(peak)}, typical step peak {_fmt(typical)}")
        limit = _value(rows["allocator_limit_bytes"], "max") or _value(
            rows["nvml_total_bytes"], "max")
        if limit is not None and peak is not None:
            lines.append(
                f"  limit {format_bytes(limit)}, headroom at peak "
                f"{format_bytes(max(limit - peak, 0))} ({1 - peak / limit:.0%})")
        device_spikes = spikes[spikes["device"] == device] if len(spikes) else spikes
        if len(device_spikes):
            worst = device_spikes.loc[device_spikes["peak_bytes"].idxmax()]
            where = ", ".join(
                f"{e}/{b}" for e, b in zip(device_spikes["epoch"], device_spikes["batch"])
            )
            lines.append(
                f"  {len(device_spikes)} spike(s); worst {format_bytes(worst['peak_bytes'])} "
                f"at epoch {worst['epoch']} batch {worst['batch']} "
                f"({worst['ratio']:.1f}x the usual step); at epoch/batch: {where}")
        else:
            lines.append("  no spikes")
    for device, epoch, event in drift:
        lines.append(f"drift on {device} in epoch {epoch}: {event.message}")
    if sources:
        lines.append("sources:")
        lines.extend(f"  {name}: {note}" for name, note in sources.items())
    return "\n".join(lines)
