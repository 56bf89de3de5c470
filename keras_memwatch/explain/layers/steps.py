"""One training step per backend, split: the layers' rows and the step's
own (the loss, the optimizer update).

- PyTorch (`"measured"`): one real step of `fit` under `torch_saved`; the
  update's buffers from the device's peak while `optimizer.apply` runs.
- JAX (`"plan"`): XLA's compiled step; the layers keep the forward
  buffers their backward pass reads (`jax_plan.read_plan`), the loss what
  only its backward pass reads and its gradient, the update what it adds
  to the forward and backward passes' peak.
- TensorFlow (`"shapes"`): the loss row from the model's outputs' shape
  and dtype.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Sequence
from typing import Any, Optional

import pandas as pd

from keras_memwatch.explain.layers.calls import LayerCalls
from keras_memwatch.explain.layers.shapes import output_bytes
from keras_memwatch.explain.layers.table import LOSS, UPDATE, StepRow, by_layer_table
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")

__all__ = ["jax_step", "shapes_activations", "shapes_loss_row", "tensorflow_step",
           "torch_step"]

#: Where notes compare a JAX row with what PyTorch keeps.
_FUSED_SHARE = 0.5
_DECOMPOSED = 2.5
_NOTED = 0.001  # rows under this share of the step's working memory: no note
_FUSION_NOTED = 0.25  # of a row's kept bytes, in fusions with other rows' work


def _shapes_text(outputs: Sequence[tuple[tuple, str]]) -> str:
    return ", ".join(str(shape) if dtype == "float32" else f"{shape} {dtype}"
                     for shape, dtype in outputs)


def shapes_loss_row(outputs: Sequence[tuple[tuple, str]], source: str = "shapes"
                    ) -> StepRow:
    """The loss row from the model's outputs' shapes and dtypes, as PyTorch
    measures a crossentropy: the outputs themselves (the step holds them
    for its metrics) and one array of their size the loss keeps (the
    log-softmax of the logits); its backward pass holds two (the gradient
    into its softmax and out of it, the gradient of the logits)."""
    size = output_bytes(LayerCalls(None, LOSS, [list(outputs)]))
    return StepRow(LOSS, 2 * size, 2 * size, source, _shapes_text(outputs),
                   note="from the outputs' shape: the outputs and one array of "
                        "their size kept (log-softmax of the logits), two for "
                        "their gradient; the logits are here, not in the layer "
                        "that computes them")


def shapes_activations(rows: Sequence[LayerCalls],
                       outputs: Sequence[tuple[tuple, str]]) -> dict[int, int]:
    """Each row's outputs' bytes (`"shapes"`), the model's outputs left out
    of the one row that gives them (they are in the loss row)."""
    out = {id(r.layer): output_bytes(r) for r in rows}
    giving = [r for r in rows if list(outputs) in r.outputs]
    if outputs and len(giving) == 1:
        out[id(giving[0].layer)] -= output_bytes(
            LayerCalls(None, "", [list(outputs)]))
    return out


def torch_step(model: Any, batch: tuple[Any, Any], expand_nested: bool,
               expand_blocks: bool) -> pd.DataFrame:
    """The table of one real PyTorch step of `fit` (`"measured"`)."""
    from keras_memwatch.measure.batches import fit_steps
    from keras_memwatch.measure.device import Device
    from keras_memwatch.explain.layers.torch_saved import measure_saved

    device = Device("torch", None)
    held: dict[str, Any] = {}
    update: dict[str, Optional[int]] = {}

    def peak_of(row: dict[str, Any]) -> Optional[int]:
        return row.get(device.peak_column)

    def at_backward() -> None:
        held.update(device.read())  # and resets the peak

    def update_begins() -> None:
        row = device.read()
        update.update(before=peak_of(row), start=row.get("current_bytes"))

    def update_ends() -> None:
        update["peak"] = peak_of(device.read())

    try:
        gc.collect()
        in_use = device.in_use()
        device.read()  # resets the peaks
        gc.disable()
        try:
            saved = measure_saved(model, lambda: fit_steps(model, batch, 1),
                                  expand_nested, at_backward, expand_blocks,
                                  (update_begins, update_ends))
        finally:
            gc.enable()
        before = [p for p in (peak_of(held), update.get("before"), saved.peak)
                  if p is not None]
        after = device.peak()
    finally:
        device.close()
    peaks = before + [p for p in (update.get("peak"), after) if p is not None]
    peak = max(peaks) if peaks else None
    working = None if peak is None else max(peak - in_use, 0)
    words = ("one real step: " + ("the CUDA allocator's" if device.on_gpu else
                                  "the host's resident") +
             " peak less the memory in use before it")
    loss = _torch_loss(saved)
    rows = [loss, _torch_update(update, before)]
    table = by_layer_table(model, saved.rows, saved.saved, "measured", working,
                           words, forward=saved.forward, backward=saved.backward,
                           step_rows=rows)
    current = held.get("current_bytes")
    table.attrs.update(
        saved_bytes=sum(saved.saved.values()) + saved.outside,
        held_at_backward_bytes=None if current is None else current - in_use)
    return table


def _torch_loss(saved: Any) -> StepRow:
    """The loss's row: the outputs the step holds and what the loss saved
    (on a CUDA device, what its call left allocated where that is more),
    and its gradients (on a CUDA device, its backward pass's peak where
    that is more than the gradients its nodes' hooks saw)."""
    kept, grad = saved.loss_saved, saved.loss_grad or 0
    words = [f"the model's outputs the step holds for its metrics "
             f"({format_bytes(saved.outputs_held)}), what the loss saved "
             f"({format_bytes(saved.loss_saved)}), the largest gradients of one of "
             f"the loss's operations ({format_bytes(grad)})"]
    if saved.loss_forward is not None and saved.loss_forward > kept:
        words.append(f"its call left {format_bytes(saved.loss_forward)} allocated, "
                     "more than it saved: the row holds that")
        kept = saved.loss_forward
    if saved.loss_backward is not None and saved.loss_backward > grad:
        words.append(f"its backward pass's peak, {format_bytes(saved.loss_backward)}"
                     ", is more than its nodes' gradients: the row holds that")
        grad = saved.loss_backward
    words.append("the logits are here, not in the layer that computes them")
    return StepRow(LOSS, kept + saved.outputs_held, grad, "measured",
                   _shapes_text(saved.outputs),
                   measured_backward_bytes=saved.loss_backward,
                   note="; ".join(words))


def _torch_update(update: dict[str, Optional[int]], before: list[int]) -> StepRow:
    """The update's row: its buffers where it holds the step's peak."""
    peak, start = update.get("peak"), update.get("start")
    if peak is None or start is None:
        return StepRow(UPDATE, 0, 0, "measured", extra_bytes=None,
                       note="not measured: the optimizer's update did not run "
                            "through `optimizer.apply`, or no peak was read")
    if before and peak <= max(before):
        return StepRow(UPDATE, 0, 0, "measured",
                       note="the update's peak stays under the backward pass's: "
                            "it adds nothing to the step's")
    return StepRow(UPDATE, 0, 0, "measured", extra_bytes=max(peak - start, 0),
                   note="the update holds the step's peak: its buffers beyond "
                        "the memory in use as it began (the layers' gradients "
                        "are in their rows)")


def jax_step(model: Any, batch: tuple[Any, Any], size: int,
             rows: list[LayerCalls], outputs: Sequence[tuple[tuple, str]] = ()
             ) -> pd.DataFrame:
    """The table of XLA's compiled plan of `fit`'s step (`"plan"`)."""
    import jax

    from keras_memwatch.configure.jax import is_gpu
    from keras_memwatch.explain.layers import jax_plan
    from keras_memwatch.judge import xla_plan

    lowered, state_bytes, _ = xla_plan.lower_step(model, batch, size, batches_ahead=0)
    compiled = lowered.compile()
    working = max(xla_plan.planned_bytes(compiled) - state_bytes, 0)
    words = "XLA's compiled plan of fit's step beyond the training state"
    shapes = {id(r.layer): output_bytes(r) for r in rows}
    paths = [r.path for r in rows]

    def is_loss(scope: Optional[str]) -> bool:
        return (scope is not None and jax_plan.row_of(scope, paths, model.name) is None
                and "loss" in scope.split("/", 1)[0])

    try:
        plan = jax_plan.read_plan(compiled.as_text(), is_loss,
                                  gpu=is_gpu(jax.devices()[0]))
    except Exception as e:  # an HLO text this parser does not know: shapes instead
        logger.warning("memory_by_layer: XLA's plan could not be read (%s: %s); "
                       "the rows are read from the layers' output shapes",
                       type(e).__name__, e)
        plan = None
    if plan is None:
        return by_layer_table(model, rows, shapes_activations(rows, outputs),
                              "shapes", working, words, rest_source="plan",
                              step_rows=[shapes_loss_row(outputs)])
    by_path: dict[str, int] = {}
    random: dict[str, int] = {}
    for scope, bytes_ in plan.kept.items():
        row = jax_plan.row_of(scope, paths, model.name)
        if row is not None:
            by_path[row] = by_path.get(row, 0) + bytes_
            if scope is not None and "_bernoulli" in scope:
                random[row] = random.get(row, 0) + bytes_
    activations = {id(r.layer): by_path.get(r.path, 0) for r in rows}
    blocks = {p.rsplit("/", 1)[0] for p in paths if "/" in p}
    fusions = _fusion_notes(plan.fused, by_path,
                            lambda scope: jax_plan.row_of(scope, paths, model.name))
    notes = {id(r.layer): _jax_note(activations[id(r.layer)], shapes[id(r.layer)],
                                    random.get(r.path, 0), working,
                                    r.path in blocks or not _composite(r.layer),
                                    fusions.get(r.path, ()))
             for r in rows}
    step_rows = _jax_step_rows(model, plan, working)
    step_rows[0].output_shape = _shapes_text(outputs)
    table = by_layer_table(model, rows, activations, "plan", working, words,
                           rest_source="plan", step_rows=step_rows, notes=notes)
    table.attrs.update(peak_phase=plan.peak_phase,
                       kept_bytes=sum(plan.kept.values()) + plan.loss_kept,
                       unowned_kept_bytes=sum(plan.kept.values())
                       - sum(by_path.values()))
    return table


def _composite(layer: Any) -> bool:
    """Whether a layer holds layers (a block, a model)."""
    flatten = getattr(layer, "_flatten_layers", None)
    return bool(flatten and list(flatten(include_self=False, recursive=False)))


def _fusion_notes(fused: Sequence[tuple[Optional[str], int, frozenset]],
                  kept: dict[str, int], row_of: Any) -> dict[str, list[str]]:
    """Per row, where XLA's fusions move bytes between it and other rows:
    its kept buffers that fusions made with other rows' work, and its work
    in other rows' kept buffers (each over `_FUSION_NOTED` of its kept
    bytes). XLA charges a fused buffer to its root's layer; PyTorch charges
    each saved tensor to the op that made it."""
    holds: dict[str, int] = {}
    holds_from: dict[str, set] = {}
    given: dict[str, dict[str, int]] = {}
    for scope, size, work in fused:
        row = row_of(scope)
        others = {row_of(w) for w in work} - {row, None}
        if row is None or not others:
            continue
        holds[row] = holds.get(row, 0) + size
        holds_from.setdefault(row, set()).update(others)
        for other in others:
            given.setdefault(other, {})
            given[other][row] = given[other].get(row, 0) + size
    notes: dict[str, list[str]] = {}
    for row, size in holds.items():
        if size >= _FUSION_NOTED * max(kept.get(row, 0), 1):
            notes.setdefault(row, []).append(
                f"{format_bytes(size)} of it made by XLA fusions that also compute "
                f"{_names(holds_from[row], row)}'s work (charged here, to the fusion's "
                "result)")
    for row, into in given.items():
        if sum(into.values()) >= _FUSION_NOTED * max(kept.get(row, 0), 1):
            notes.setdefault(row, []).append(
                f"part of its work kept in {_names(into, row)}'s buffers (XLA fused it "
                "there)")
    return notes


def _names(paths: Any, row: str) -> str:
    """Up to two rows' paths, each from where it leaves `row`'s path, and
    how many more."""
    def relative(path: str) -> str:
        other, own = path.split("/"), row.split("/")
        k = 0
        while k < min(len(other) - 1, len(own)) and other[k] == own[k]:
            k += 1
        return "/".join(other[k:])

    names = sorted(relative(str(p)) for p in paths)
    more = f" and {len(names) - 2} more" if len(names) > 2 else ""
    return ", ".join(names[:2]) + more


def _jax_note(kept: int, outputs: int, random: int, working: int, own: bool,
              fusions: Sequence[str] = ()) -> str:
    """Why a JAX row may keep other bytes than PyTorch saves (rows of at
    least `_NOTED` of the step's working memory). `own`: the row holds its
    own work alone (a layer without parts, or an opened block); `fusions`:
    from `_fusion_notes`."""
    notes: list[str] = []
    if max(kept, outputs) < _NOTED * working:
        return ""
    if random:
        notes.append(f"{format_bytes(random)} of dropout's random bits (XLA keeps "
                     "them 32-bit; PyTorch keeps a 1-byte mask)")
    if outputs and kept < _FUSED_SHARE * outputs:
        notes.append(f"keeps less than its outputs ({format_bytes(outputs)}): XLA "
                     "fused it into its neighbours or recomputes it")
    elif own and outputs and kept > _DECOMPOSED * outputs and not random:
        notes.append(f"keeps {kept / outputs:.1f}x its outputs: intermediates of "
                     "XLA's decomposition of its work (PyTorch's fused kernels, "
                     "such as layer_norm's, keep their input and small statistics)")
    return "; ".join(notes + list(fusions))


def _jax_step_rows(model: Any, plan: Any, working: int) -> list[StepRow]:
    """The loss's and the update's rows of a `jax_plan.Plan`."""
    name = getattr(model.optimizer, "name", None)
    in_update = plan.other_at_peak.get(name, 0) if name else 0
    if plan.update_bytes > 0.01 * working:
        words = (f"the plan's peak is in the update: it adds "
                 f"{format_bytes(plan.update_bytes)} to the forward and backward "
                 f"passes' peak ({format_bytes(in_update)} of the optimizer's own "
                 "buffers live then); the layers' rows still hold what they keep "
                 "for the backward pass")
    else:
        words = ("the plan's peak comes before the update: it adds (next to) "
                 "nothing to the step's")
    return [
        StepRow(LOSS, plan.loss_kept, plan.loss_grad, "plan",
                note="what only the loss's backward pass reads of the forward "
                     "pass (the logits, their log-softmax or its statistics) and "
                     "the most bytes of its backward pass live at once (the "
                     "gradient of the logits); the logits are here, not in the "
                     "layer that computes them"),
        StepRow(UPDATE, 0, 0, "plan", extra_bytes=plan.update_bytes, note=words)]


def tensorflow_step(model: Any, batch: tuple[Any, Any]
                    ) -> tuple[Optional[int], str]:
    """The step's working memory, measured by TensorFlow's allocator (on a
    GPU, or on the host where it keeps statistics): `(bytes or None, how)`."""
    from keras_memwatch.measure.batches import fit_steps
    from keras_memwatch.measure.device import Device

    device = Device("tensorflow", None)
    try:
        if not device.on_gpu and not device.host_pool:
            return None, ("not measured: this TensorFlow's CPU allocator keeps no "
                          "statistics (oneDNN off)")
        in_use = device.in_use()
        device.read()
        fit_steps(model, batch, 1)
        need = device.need(in_use)
    finally:
        device.close()
    return need, ("one real step (tracing included): the allocator's peak less "
                  "the memory in use before it")
