"""The text summary: where the memory went, per device."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import pandas as pd

from keras_memwatch.explain.breakdown import device_memory, format_breakdown, memory_breakdown
from keras_memwatch.explain.ways_text import HINT, NEAR_LIMIT, format_ways
from keras_memwatch import columns as C
from keras_memwatch.columns import HOST_DEVICE
from keras_memwatch.judge.derived import log_sources, replay_drift, spikes_from_frame
from keras_memwatch.judge.events import against_usual
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


def _of_phase(spikes: pd.DataFrame, phase: str) -> pd.DataFrame:
    """The spikes of one phase (a table without phases: all training)."""
    if not len(spikes) or "phase" not in spikes.columns:
        return spikes if phase == "train" else spikes.iloc[:0]
    return spikes[spikes["phase"].astype(str) == phase]


def _spike_line(spikes: pd.DataFrame, device: str, phase: str) -> str:
    """"N spike(s); worst ... at ..." of a device's spikes of one phase (the
    training ones listed by place), or "no spikes"."""
    spikes = _of_phase(spikes, phase)
    mine = spikes[spikes["device"].astype(str) == device] if len(spikes) else spikes
    if not len(mine):
        return "no spikes"
    worst = mine.loc[mine["peak_bytes"].astype("float64").idxmax()]
    working, usual = worst.get("working_bytes"), worst.get("usual_working_bytes")
    why = "" if working is None or usual is None or pd.isna(working) or pd.isna(
        usual) else (f" (it needed {format_bytes(working)}, "
                     f"{against_usual(working, usual)})")
    call = "" if phase == "train" else f"call {worst['call']} "
    listed = f"; at epoch/batch: {_where(mine)}" if phase == "train" else ""
    return (f"{len(mine)} spike(s); worst {format_bytes(worst['peak_bytes'])} at "
            f"{call}epoch {worst['epoch']} batch {worst['batch']}{why}{listed}")


def _headroom(limit: Optional[int], peak: Optional[int]) -> str:
    return (f"limit {format_bytes(limit)}, headroom at peak "
            f"{format_bytes(max(limit - peak, 0))} ({1 - peak / limit:.0%})")


def _near_limit(info: dict) -> bool:
    """Whether a device's training peak came within `NEAR_LIMIT` of its limit."""
    limit, peak = info.get("limit_bytes"), info.get("peak_bytes")
    return limit is not None and peak is not None and peak >= (1 - NEAR_LIMIT) * limit


def _device_lines(device: str, info: dict, spikes: pd.DataFrame) -> list[str]:
    lines = [
        f"{device}: peak {format_bytes(info['peak_bytes'])}, typical step peak "
        f"{format_bytes(info['typical_peak_bytes'])}, in use between steps "
        f"{format_bytes(info['in_use_bytes'])}"
    ]
    limit, peak = info["limit_bytes"], info["peak_bytes"]
    if limit is not None and peak is not None:
        lines.append("  " + _headroom(limit, peak))
    elif device == HOST_DEVICE:
        lines.append("  limit: not recorded for the host, so no headroom")
    else:
        lines.append("  limit: no source reported one, so no headroom")
    if info.get("plan_bytes") is not None:
        lines.append(
            f"  XLA plan of a step: {format_bytes(info['plan_bytes'])} typical, "
            f"{format_bytes(info['plan_max_bytes'])} at most "
            f"({info['plan_shapes']} distinct plan(s))")
    if info.get("reserved_bytes") is not None:
        lines.append(
            f"  reserved by the allocator: {format_bytes(info['reserved_bytes'])} "
            f"at most; reserved but unallocated: "
            f"{format_bytes(info['unallocated_bytes'])} at most (its cache, block "
            "rounding and fragmentation, or a pool it preallocated: free to "
            "this framework only)")
    lines.append("  " + _spike_line(spikes, device, "train"))
    return lines


#: The phases besides training, and what runs them.
_OTHER_PHASES = {"test": " (validation and evaluate)", "predict": ""}


def _batches(frame: pd.DataFrame, phase: str) -> int:
    """Sampled batches of a phase (of one device: all have the same)."""
    rows = frame[(frame["phase"] == phase) & frame["batch"].notna()]
    return int(rows[[C.CALL, "step"]].drop_duplicates().shape[0]) if len(rows) else 0


def _phase_lines(frame: pd.DataFrame, spikes: pd.DataFrame) -> list[str]:
    """Per phase other than training and per device: batches, peak,
    typical peak, headroom and spikes."""
    lines = []
    for phase, what in _OTHER_PHASES.items():
        if not _batches(frame, phase):
            continue
        for device, info in device_memory(frame, phase).items():
            if not info["steps"]:
                continue
            line = (f"  {phase} on {device}: {info['steps']} batches{what}, "
                    f"peak {format_bytes(info['peak_bytes'])}, typical step peak "
                    f"{format_bytes(info['typical_peak_bytes'])}")
            if info["limit_bytes"] is not None and info["peak_bytes"] is not None:
                line += "; " + _headroom(info["limit_bytes"], info["peak_bytes"])
            lines += [line, "    " + _spike_line(spikes, device, phase)]
    if lines:
        lines.insert(0, "Evaluation and prediction (each phase judged against "
                        "its own baseline):")
    return lines


def _headline(frame: pd.DataFrame) -> str:
    """What the record holds: training steps, and the other phases' batches."""
    train = frame[frame["phase"] == "train"]
    steps = train[train["batch"].notna()]
    parts = [f"{steps['step'].nunique()} training steps sampled over "
             f"{int(train['epoch'].max()) + 1} epoch(s)" if len(steps)
             else "no training steps"]
    for phase, what in _OTHER_PHASES.items():
        n = _batches(frame, phase)
        if n:
            parts.append(f"{n} {phase} batches{what}")
    return "keras_memwatch summary: " + ", ".join(parts)


def summarize(
    frame: pd.DataFrame,
    spikes: Optional[pd.DataFrame] = None,
    drift: Optional[Sequence[tuple]] = None,
    sources: Optional[Mapping[str, str]] = None,
    breakdown: Optional[Mapping[str, Any]] = None,
    rises: Optional[Sequence[tuple]] = None,
    by_layer: Optional[pd.DataFrame] = None,
    ways: Optional[pd.DataFrame] = None,
) -> str:
    """Renders a short report of a record: one fit, and the `evaluate` and
    `predict` calls recorded with it.

    First where the memory went (weights, optimizer state, a step's working
    memory, see `memory_breakdown`), then per device the peak, the typical
    step peak, the memory in use between steps, the limit and headroom and
    the spikes of the training steps; then the same for each other phase
    (`test`: validation and `evaluate`; `predict`), apart; then drift, and
    which sources could see what (and which were unavailable, and why).

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
        rises: `(device, epoch, RiseEvent)` tuples, one-off rises that are
            not leaks. Defaults to `None`: `derived.rises_from_frame(frame)`.
        by_layer: the by-layer table (`MemWatch.by_layer()`), shown as
            "Where a step's working memory goes". Defaults to `None`: not
            shown.
        ways: the ways-to-fit table (`keras_memwatch.ways_to_fit`), shown
            after where the memory went. Defaults to `None`: not shown, and
            where a training peak came within 10% of a device's limit, how
            to measure it is.

    Returns:
        Lines of text for a person.
    """
    if frame.empty:
        return "keras_memwatch: no samples recorded."
    spikes = spikes_from_frame(frame) if spikes is None else spikes
    if drift is None or rises is None:
        replayed_drift, replayed_rises = replay_drift(frame)
        drift = replayed_drift if drift is None else drift
        rises = replayed_rises if rises is None else rises
    sources = log_sources(frame) if sources is None else sources
    lines = [_headline(frame), ""]
    if breakdown is None:
        breakdown = memory_breakdown(None, frame)
    lines.append(format_breakdown(breakdown))
    if by_layer is not None:
        from keras_memwatch.explain.layers import format_by_layer

        lines += ["", format_by_layer(by_layer)]
    if ways is not None:
        lines += ["", format_ways(ways)]
    devices = breakdown.get("devices") or device_memory(frame)
    trained = {d: info for d, info in devices.items() if info.get("steps", 1)}
    if trained:
        lines += ["", "Memory per device:"]
    else:
        lines.append("")
    for device, info in trained.items():
        lines.extend("  " + line for line in _device_lines(device, info, spikes))
    if ways is None and any(_near_limit(info) for info in trained.values()):
        lines += ["", HINT]
    lines += _phase_lines(frame, spikes)
    if drift:
        lines.append("Drift (steady growth of memory in use, a leak?):")
        lines.extend(f"  {device} in epoch {epoch}: {event.message}"
                     for device, epoch, event in drift)
    else:
        lines.append("Drift: none")
    if rises:
        lines.append("One-off rises (not leaks):")
        lines.extend(f"  {device} in epoch {epoch}: {event.message}"
                     for device, epoch, event in rises)
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


# -- several processes ------------------------------------------------------


def process_groups(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The record cut into one part per process of a distributed run (and
    per log, where one process wrote several: one per fit), in process
    order: `[(label, rows)]`, the label reading "process N on HOST"
    (with the log's name when `load_log` read several files)."""
    if frame.empty:
        return []
    keys = ["process", "hostname"] + (["log"] if "log" in frame.columns else [])
    parts = list(frame.groupby(keys, sort=False, observed=True, dropna=False))
    parts.sort(key=lambda part: int(part[0][0]))  # stable: files keep their order
    groups = []
    for key, rows in parts:
        label = _process_label(key[0], key[1])
        if len(key) > 2:
            label += f" ({key[2]})"
        groups.append((label, rows))
    return groups


def _process_label(process: Any, host: Any) -> str:
    return f"process {int(process)} on {host or 'an unknown host'}"


def report_text(frame: pd.DataFrame) -> str:
    """The report of one or several logs (`load_log(...)`), as
    `python -m keras_memwatch report` prints it.

    One process and one log: `summarize(frame)`. Several: one section per
    process ("process N on HOST", with its summary), then, with more than
    one process, `compare_processes(frame)`.

    Args:
        frame: the record of one or several processes.

    Returns:
        Lines of text for a person.
    """
    groups = process_groups(frame)
    if len(groups) <= 1:
        return summarize(frame)
    processes = frame["process"].nunique()
    hosts = frame["hostname"].nunique()
    logs = frame["log"].nunique() if "log" in frame.columns else len(groups)
    lines = [f"keras_memwatch report: {processes} process(es) on {hosts} "
             f"host(s), {logs} log(s)", ""]
    for label, rows in groups:
        lines += [f"== {label} ==", summarize(rows), ""]
    if processes > 1:
        lines.append(compare_processes(frame))
    return "\n".join(lines).rstrip("\n")


def _peak_at(rows: pd.DataFrame) -> str:
    """Where a device's training-step peak happened: "epoch/batch (step)"."""
    steps = rows[(rows["phase"] == "train") & rows["batch"].notna()]
    peak = steps["peak_bytes"].astype("float64").dropna()
    if peak.empty:
        return "n/a"
    row = steps.loc[peak.idxmax()]
    return f"{row['epoch']}/{row['batch']} ({row['step']})"


def _table(rows: list[list[str]], indent: str = "    ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
            for r in rows]


def compare_processes(frame: pd.DataFrame) -> str:
    """Compares the processes of a distributed run, from their logs.

    For each process and device: the highest peak of a training step, where
    it happened (epoch/batch and step), the device's limit and the share of
    it used at the peak, and the spikes; then the spikes per process, the
    imbalance between processes (the largest process peak over the
    smallest, a process's peak being that of its accelerators, else of the
    host) and which process came closest to its device's limit.

    The figures come from `breakdown.device_memory` and
    `derived.spikes_from_frame`, per process, as in each process's summary.

    Args:
        frame: the record of several processes (`load_log("mem.rank*.csv")`).

    Returns:
        Lines of text for a person.
    """
    groups = process_groups(frame)
    if not groups:
        return "Across processes: no samples recorded."
    table = [["process", "host", "device", "peak", "at epoch/batch (step)",
              "limit", "used at peak", "spikes"]]
    spike_lines: list[str] = []
    process_peak: dict[int, tuple[int, str]] = {}
    closest: Optional[tuple[float, str]] = None
    largest: Optional[tuple[int, str]] = None
    fits = pd.Series([int(rows["process"].iloc[0]) for _, rows in groups]).value_counts()
    for label, rows in groups:
        process, host = int(rows["process"].iloc[0]), rows["hostname"].iloc[0]
        # The log's name only where one process wrote several (several fits).
        who = label if fits[process] > 1 else _process_label(process, host)
        spikes = _of_phase(spikes_from_frame(rows), "train")
        counts = spikes["device"].astype(str).value_counts() if len(spikes) else {}
        devices = device_memory(rows)
        for device, info in devices.items():
            peak, limit = info["peak_bytes"], info["limit_bytes"]
            mine = rows[rows["device"].astype(str) == device]
            used = f"{peak / limit:.1%}" if peak is not None and limit else "n/a"
            table.append([str(process), host or "?", device, format_bytes(peak),
                          _peak_at(mine), format_bytes(limit) if limit else "none",
                          used, str(int(counts.get(device, 0)))])
            if peak is None:
                continue
            where = f"{who}, {device}: peak {format_bytes(peak)} at epoch/batch " \
                    f"{_peak_at(mine)}"
            if largest is None or peak > largest[0]:
                largest = (peak, where)
            if limit:
                share = peak / limit
                if closest is None or share > closest[0]:
                    closest = (share, f"{where}, {share:.1%} of its limit "
                                      f"{format_bytes(limit)} (headroom "
                                      f"{format_bytes(max(limit - peak, 0))})")
        accelerators = {d: i["peak_bytes"] for d, i in devices.items()
                        if d != HOST_DEVICE and i["peak_bytes"] is not None}
        known = accelerators or {d: i["peak_bytes"] for d, i in devices.items()
                                 if i["peak_bytes"] is not None}
        if known:
            device = max(known, key=known.get)
            if process not in process_peak or known[device] > process_peak[process][0]:
                process_peak[process] = (known[device],
                                         f"{who}, {device} {format_bytes(known[device])}")
        if len(spikes):
            worst = spikes.loc[spikes["peak_bytes"].astype("float64").idxmax()]
            per_device = ", ".join(f"{d}: {n}" for d, n in counts.items())
            spike_lines.append(
                f"    {who}: {len(spikes)} ({per_device}); worst "
                f"{format_bytes(worst['peak_bytes'])} on {worst['device']} at epoch "
                f"{worst['epoch']} batch {worst['batch']}")
        else:
            spike_lines.append(f"    {who}: none")
    lines = ["Across processes:", "  Peak per process and device (training steps):"]
    lines += _table(table)
    lines += ["  Spikes per process:"] + spike_lines
    if len(process_peak) > 1:
        high = max(process_peak.values(), key=lambda v: v[0])
        low = min(process_peak.values(), key=lambda v: v[0])
        lines.append(
            f"  Imbalance between processes: {high[0] / max(low[0], 1):.2f}x "
            f"(largest: {high[1]}; smallest: {low[1]})")
    else:
        lines.append("  Imbalance between processes: needs the peaks of two "
                     "processes; fewer were recorded")
    if closest is not None:
        lines.append(f"  Closest to its limit: {closest[1]}")
    else:
        lines.append(
            "  Closest to its limit: no device reported a limit (the host "
            "records none), so the processes cannot be ranked by headroom"
            + (f"; the largest peak: {largest[1]}" if largest else ""))
    return "\n".join(lines)
