"""Where the memory went: weights, optimizer state and a step's working memory.

The static part is exact: the bytes of every variable the model and its
optimizer hold, counted from each variable's own dtype and shape (so a
`mixed_float16` model counts its float32 master weights as 4 bytes each,
and a `LossScaleOptimizer` its loss-scale counters and its inner
optimizer's slots).

The transient part is measured: a step's *working memory* is its observed
peak minus the memory in use just before it (the previous sample's
`current_bytes`), the quantity the spike detector judges. It covers what a
step allocates and frees again: activations kept for the backward pass,
gradients, and the framework's workspaces. It is not `peak - static`,
because on most devices the memory in use between steps also holds the
framework's runtime, caches and input buffers (on the host, the whole
Python process), which no step allocates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import pandas as pd

from keras_memwatch import options
from keras_memwatch import columns as C
from keras_memwatch.columns import HOST_DEVICE
from keras_memwatch.judge.derived import (in_use_before, limit_of, peaks_from_plan,
                                          reserved_unallocated, working_memory_of)
from keras_memwatch.units import format_bytes
from keras_memwatch.variables import element_count, unique_variables, variable_bytes

__all__ = ["device_memory", "format_breakdown", "memory_breakdown", "step_peaks"]


def _optimizer_name(optimizer: Any) -> str:
    name = type(optimizer).__name__
    inner = getattr(optimizer, "inner_optimizer", None)
    return f"{name}({type(inner).__name__})" if inner is not None else name


def _static(model: Any, out: dict, notes: list[str]) -> None:
    trainable = unique_variables(model.trainable_weights)
    non_trainable = unique_variables(model.non_trainable_weights)
    out["trainable_params"] = sum(element_count(v) for v in trainable)
    out["non_trainable_params"] = sum(element_count(v) for v in non_trainable)
    out["trainable_bytes"] = variable_bytes(trainable)
    out["non_trainable_bytes"] = variable_bytes(non_trainable)
    out["weights_bytes"] = out["trainable_bytes"] + out["non_trainable_bytes"]
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or isinstance(optimizer, str):
        notes.append("the model has no optimizer (not compiled), so no optimizer state")
        out["static_bytes"] = out["weights_bytes"]
        return
    out["optimizer"] = _optimizer_name(optimizer)
    if not getattr(optimizer, "built", False):
        notes.append(
            f"optimizer state unknown: {out['optimizer']} is not built yet "
            "(it creates its slots at the first training step)")
        return
    variables = unique_variables(optimizer.variables)
    out["optimizer_bytes"] = variable_bytes(variables)
    slots = sum(element_count(v) for v in variables if len(v.shape) > 0)
    if out["trainable_params"]:
        out["optimizer_slots_per_weight"] = slots / out["trainable_params"]
    out["static_bytes"] = out["weights_bytes"] + out["optimizer_bytes"]


def _median(values: pd.Series) -> Optional[int]:
    values = values.dropna()
    return None if values.empty else int(values.median())


def _max(values: pd.Series) -> Optional[int]:
    values = values.dropna()
    return None if values.empty else int(values.max())


def step_peaks(rows: pd.DataFrame, phase: str = "train") -> bool:
    """Whether a device's `peak_bytes` is a peak per step.

    It is when every step of the phase with a reading has a peak: a
    per-step source, or XLA's plan (JAX). Where the source only has a
    process-lifetime high-water mark, `peak_bytes` is known only at the
    steps that raised it.
    """
    steps = rows[(rows["phase"] == phase) & rows["batch"].notna()]
    read = steps["current_bytes"].notna()
    return bool(read.any() and steps.loc[read, "peak_bytes"].notna().all())


def device_memory(frame: pd.DataFrame,
                  phase: str = "train") -> dict[str, dict[str, Any]]:
    """Per-device figures of the steps of one phase of a record.

    Args:
        frame: the record (`MemWatch.to_dataframe()` or `load_log(...)`).
        phase: `"train"`, `"test"` or `"predict"`. Defaults to `"train"`.

    Returns:
        device -> dict with, in bytes (`None` when unknown), `steps` (how
        many steps of the phase were sampled) and
        `peak_bytes` (highest peak of a step), `typical_peak_bytes`
        (median), `in_use_bytes` (median memory in use after a step; where
        the peaks come from XLA's plan, the median memory in use between
        steps, `derived.in_use_before`),
        `limit_bytes` (allocator limit, else the device's total),
        `transient_bytes` (median working memory of a step),
        `transient_max_bytes` and `transient_max_at` (`(epoch, batch)`),
        `plan_bytes`, `plan_max_bytes` and `plan_shapes` (JAX: the typical
        and largest XLA plan of a step, and how many sizes it had),
        `reserved_bytes` (most the allocator held from the device) and
        `unallocated_bytes` (most of that reserved but not allocated),
        and `transient_source`: `"per-step peak"`; `"XLA plan"` (JAX: the
        working part of each step's compiled plan); `"high-water mark"`
        (the device has no per-step peak, only a process-lifetime peak:
        the largest working memory is known from the steps that raised
        it, the typical one is not); or `None` (no peak at all).
    """
    out: dict[str, dict[str, Any]] = {}
    if frame.empty:
        return out
    for device in pd.unique(frame["device"].astype(str)):
        rows = frame[frame["device"].astype(str) == device].sort_values(
            [C.CALL, "step"], kind="stable")
        is_step = (rows["phase"] == phase) & rows["batch"].notna()
        steps = rows[is_step]
        peak, current = steps["peak_bytes"], steps["current_bytes"]
        working = working_memory_of(rows)[is_step]
        in_use = (in_use_before(rows)[is_step] if peaks_from_plan(rows, device)
                  else current)
        info: dict[str, Any] = {
            "steps": len(steps),
            "peak_bytes": _max(peak),
            "typical_peak_bytes": _median(peak),
            "in_use_bytes": _median(in_use),
            "limit_bytes": limit_of(rows),
            "transient_bytes": None,
            "transient_max_bytes": None,
            "transient_max_at": None,
            "transient_source": None,
            "plan_bytes": _median(steps[C.PLAN]),
            "plan_max_bytes": _max(steps[C.PLAN]),
            "plan_shapes": int(steps[C.PLAN].nunique()),
            "reserved_bytes": _max(steps[C.ALLOCATOR_RESERVED]),
            "unallocated_bytes": _max(reserved_unallocated(steps)),
        }
        known = working.dropna()
        if step_peaks(rows, phase):
            source = "XLA plan" if steps[C.PLAN].notna().all() else "per-step peak"
            if not known.empty:
                info["transient_bytes"] = int(known.median())
        else:
            # Only the steps that raised the high-water mark had their peak
            # seen; the others' peak is unknown.
            source = "high-water mark"
        if not known.empty:
            worst = known.idxmax()
            info.update(
                transient_max_bytes=int(known.max()),
                transient_max_at=(int(steps.at[worst, "epoch"]),
                                  int(steps.at[worst, "batch"])),
                transient_source=source,
            )
        out[device] = info
    return out


def memory_breakdown(
    model: Any,
    frame: pd.DataFrame,
    batch_size: Optional[int] = None,
) -> dict[str, Any]:
    """Where the memory of a fit went, in bytes.

    Static memory is computed exactly from the model's variables and its
    optimizer's (every variable counted by its own dtype and shape, each
    once); the transient part of a step is measured from the record. Call
    it after `fit`: an optimizer creates its slots at the first step.

    Args:
        model: the trained Keras model, or `None` (a streamed log read
            without its model: weights and optimizer state are unknown).
        frame: the record (`MemWatch.to_dataframe()` or `load_log(...)`).
        batch_size: the usual training batch size, to express the working
            memory of a typical step per sample. Defaults to `None`.

    Returns:
        A dict (`None` for what is unknown; `pd.Series(d)` shows it well):
        `trainable_params`, `non_trainable_params`, `trainable_bytes`,
        `non_trainable_bytes`, `weights_bytes`, `optimizer` (class name),
        `optimizer_bytes` (every optimizer variable: slots, iteration
        counters, learning rate, loss scale), `optimizer_slots_per_weight`
        (e.g. 2.0 for Adam), `static_bytes` (weights plus optimizer state);
        for the main device (the first accelerator, else the host):
        `device`, `peak_bytes`, `in_use_bytes` (median memory in use after
        a step), `other_in_use_bytes` (in use minus static: runtime,
        caches, data), `transient_bytes` (median working memory of a
        step: its peak minus the memory in use before it),
        `transient_max_bytes`, `transient_max_at` (`(epoch, batch)`),
        `transient_source`, `batch_size`, `transient_per_sample_bytes`;
        `devices` (the same figures for every device, see
        `device_memory`); and `notes`, the reasons things are unknown.

    Example:

    >>> watch.breakdown(batch_size=32)["optimizer_bytes"]  # doctest: +SKIP
    1653108744
    """
    out: dict[str, Any] = dict.fromkeys((
        "trainable_params", "non_trainable_params", "trainable_bytes",
        "non_trainable_bytes", "weights_bytes", "optimizer", "optimizer_bytes",
        "optimizer_slots_per_weight", "static_bytes", "device", "peak_bytes",
        "in_use_bytes", "other_in_use_bytes", "transient_bytes",
        "transient_max_bytes", "transient_max_at", "transient_source",
        "batch_size", "transient_per_sample_bytes"))
    notes: list[str] = []
    if model is None:
        notes.append("weights and optimizer state are unknown without the model "
                     "(this record was read from a log)")
    else:
        try:
            _static(model, out, notes)
        except Exception as e:  # never fail a summary at the end of training
            notes.append(f"could not count the model's variables: {e!r}")
    devices = device_memory(frame)
    out["devices"] = devices
    main = next((d for d in devices if d != HOST_DEVICE), None) or (
        HOST_DEVICE if HOST_DEVICE in devices else None)
    if main is None or not devices[main]["steps"]:
        notes.append("no training steps recorded, so no step working memory")
    else:
        info = devices[main]
        out["device"] = main
        for key in ("peak_bytes", "in_use_bytes", "transient_bytes",
                    "transient_max_bytes", "transient_max_at", "transient_source"):
            out[key] = info[key]
        if out["static_bytes"] is not None and info["in_use_bytes"] is not None:
            out["other_in_use_bytes"] = info["in_use_bytes"] - out["static_bytes"]
        if info["transient_source"] is None:
            notes.append(f"{main} has no peak per step, so a step's working "
                         "memory is unknown")
        elif info["transient_source"] == "high-water mark":
            notes.append(f"{main} has no peak per step, only a process-lifetime "
                         "peak: the largest working memory is seen at the steps "
                         "that raised it, a typical step's is unknown")
    if batch_size is not None:
        batch_size = options.positive_int("batch_size", batch_size)
        out["batch_size"] = batch_size
        if out["transient_bytes"] is not None:
            out["transient_per_sample_bytes"] = out["transient_bytes"] // batch_size
    out["notes"] = notes
    return out


def _params(n: int) -> str:
    if n >= 10**9:
        return f"{n / 10**9:.2f} G"
    if n >= 10**6:
        return f"{n / 10**6:.1f} M"
    if n >= 10**3:
        return f"{n / 10**3:.1f} k"
    return str(n)


def _slots(name: str, per_weight: Optional[float]) -> str:
    if per_weight is None:
        return name
    rounded = round(per_weight)
    if abs(per_weight - rounded) < 0.01:
        if rounded == 0:
            return f"{name} keeps no state per weight, only counters"
        return f"{name} keeps {rounded} slot{'s' if rounded > 1 else ''} per weight"
    return f"{name}: {per_weight:.2f}x the trainable weights"


def format_breakdown(breakdown: Mapping[str, Any]) -> str:
    """The breakdown in words, for a person (see `memory_breakdown`)."""
    b = breakdown
    lines = ["Where the memory went:"]
    if b.get("weights_bytes") is None:
        lines.append("  weights, optimizer state: unknown without the model "
                     "(a log holds only memory readings)")
    else:
        lines.append(
            f"  weights:              {format_bytes(b['weights_bytes'])} "
            f"({_params(b['trainable_params'] + b['non_trainable_params'])} "
            f"parameters; trainable {format_bytes(b['trainable_bytes'])}, "
            f"non-trainable {format_bytes(b['non_trainable_bytes'])})")
        if b.get("optimizer_bytes") is not None:
            lines.append(
                f"  optimizer state:      {format_bytes(b['optimizer_bytes'])} "
                f"({_slots(b['optimizer'], b.get('optimizer_slots_per_weight'))})")
            lines.append(
                f"  = static:             {format_bytes(b['static_bytes'])}, held "
                "from the first step to the end")
        elif b.get("optimizer") is not None:
            lines.append(f"  optimizer state:      unknown ({b['optimizer']} not built yet)")
        else:
            lines.append("  optimizer state:      none (model not compiled)")
            lines.append(
                f"  = static:             {format_bytes(b['static_bytes'])}")
    device = b.get("device")
    if device is not None:
        if b.get("transient_source") in ("per-step peak", "XLA plan"):
            at = b["transient_max_at"]
            lines.append(
                f"  step working memory:  {format_bytes(b['transient_bytes'])} "
                f"typical on {device}, {format_bytes(b['transient_max_bytes'])} "
                f"at most (epoch {at[0]} batch {at[1]})")
            lines.append(
                "                        (activations, gradients and workspaces: "
                + ("XLA's plan of the step beyond the training state)"
                   if b["transient_source"] == "XLA plan" else
                   "a step's peak minus the memory in use before it)"))
            if b.get("transient_per_sample_bytes") is not None:
                lines.append(
                    f"  per sample:           "
                    f"{format_bytes(b['transient_per_sample_bytes'])} of working "
                    f"memory (typical step / batch size {b['batch_size']})")
        elif b.get("transient_source") == "high-water mark":
            at = b["transient_max_at"]
            lines.append(
                f"  step working memory:  {format_bytes(b['transient_max_bytes'])} "
                f"at most on {device} (epoch {at[0]} batch {at[1]}); a typical "
                "step's is unknown (no peak per step)")
        else:
            lines.append(f"  step working memory:  unknown (no peak per step on {device})")
        if b.get("in_use_bytes") is not None:
            text = (f"  in use between steps: {format_bytes(b['in_use_bytes'])} "
                    f"on {device}")
            other = b.get("other_in_use_bytes")
            if other is not None and other >= 0:
                what = ("the Python process, framework runtime, data and caches"
                        if device == HOST_DEVICE else
                        "framework buffers, input data and caches")
                text += f" (static {format_bytes(b['static_bytes'])}, the rest {what})"
            lines.append(text)
    for note in b.get("notes", ()):
        if "without the model" not in note:  # said above
            lines.append(f"  note: {note}")
    return "\n".join(lines)
