"""`memory_by_layer`: which layers hold a step's working memory.

Each backend gives what it can:

- PyTorch (`"measured"`): one real step of `fit`, with autograd's saved
  tensors charged to the layer that saved them (`torch_saved`), and the
  step's working memory from the device's peak (the CUDA allocator, or the
  host's resident memory on a CPU).
- JAX (`"plan"`): the buffers XLA's compiled step keeps for the backward
  pass, charged to layers by their name scopes (`jax_plan`), and the
  step's working memory from the same plan (compiled, never run).
- TensorFlow (`"shapes"`): likewise; the step's working memory from one
  real step on a GPU (the allocator's peak); on a CPU it is not measured
  (TensorFlow's CPU allocator keeps no statistics).
"""

from __future__ import annotations

import gc
from typing import Any, Optional

import pandas as pd

from keras_memwatch import options
from keras_memwatch.call_wrapping import elements, signature
from keras_memwatch.explain.layers.growth import Growth, growth
from keras_memwatch.explain.layers.shapes import batch_spec, output_bytes, trace_shapes
from keras_memwatch.explain.layers.table import by_layer_table

__all__ = ["memory_by_layer", "memory_by_layer_of_fit"]


def _compiled(model: Any) -> None:
    if (getattr(model, "optimizer", None) is None
            or not getattr(model, "compiled", True)):
        raise ValueError(
            "Expected a compiled model (call `model.compile(optimizer=..., "
            f"loss=...)` first). Received: {type(model).__name__} without an "
            "optimizer")


def memory_by_layer(
    model: Any,
    x: Any,
    y: Any = None,
    batch_size: Optional[int] = None,
    *,
    expand_nested: bool = True,
) -> pd.DataFrame:
    """Splits a training step's working memory over the model's layers.

    One row per layer, in call order, and a last row for the rest of the
    step's working memory (the loss, the batch, the optimizer's update, the
    framework's workspaces), so that `working_bytes` adds up to the step's
    working memory where it is measured. Where each figure comes from:

    - PyTorch: one real step of `fit`; each layer's `activation_bytes` are
      the bytes autograd saved for the backward pass while it ran
      (`source="measured"`), and the step's working memory is the device's
      peak during the step less what was in use before it (the CUDA
      allocator; the host's resident memory on a CPU).
    - JAX: `activation_bytes` are the buffers XLA's compiled step keeps
      from the forward pass for the backward pass, charged to the layer
      whose name scope made them (`source="plan"`); the step's working
      memory is the same plan beyond the training state.
    - TensorFlow: the layer's outputs at the batch size, from shapes and
      dtypes (`source="shapes"`); the working memory from one real step on
      a GPU, not measured on a CPU.

    Every variable of the model, its optimizer and its metrics is put back
    bit for bit afterwards. A model not built yet is built, as `fit` would.

    Args:
        model: a compiled Keras model.
        x: a sample batch of inputs (arrays, or lists/dicts of arrays),
            repeated along its first axis to reach `batch_size`.
        y: the matching targets. Defaults to `None`.
        batch_size: the batch size to split. Defaults to `None`: the number
            of samples in `x`.
        expand_nested: give the layers of a nested model (a layer that is a
            `keras.Model`) rows of their own; `False` keeps it whole, as
            one row. Defaults to `True`.

    Returns:
        A `pandas.DataFrame` with columns `layer` (its name, prefixed by
        the nested models it is in), `class`, `calls` (a shared layer is one
        row: its activations are those of all its calls, its variables
        counted once), `output_shape` (of its first call, at the batch
        size), `activation_bytes` (kept for the backward pass),
        `param_bytes`, `grad_bytes`, `optimizer_bytes`, `working_bytes`
        (activations plus gradients; for the last row the rest),
        `measured_forward_bytes` (bytes a layer's forward pass left
        allocated, PyTorch on a CUDA device; NaN elsewhere),
        `measured_backward_bytes` (the allocator's peak during a layer's
        backward pass less what was allocated as it began, PyTorch on a
        CUDA device; NaN elsewhere), `remat` (the
        layer rematerializes under keras `RematScope`: it keeps less than
        its outputs, which `"shapes"` does not see) and `source`. `attrs`
        holds `working_bytes` (the step's, or `None`) and `working_source`;
        on PyTorch also `saved_bytes` (every tensor saved for the backward
        pass, the loss's too) and `held_at_backward_bytes` (the device's
        memory in use as the backward pass starts, less that before the
        step). Work in a model's own `call` outside its layers (an `ops.add`
        of two layers' outputs) belongs to the rest.

    Raises:
        ValueError: for a model that is not compiled, or a bad `batch_size`.
        TypeError: for arguments of the wrong type, or `x`/`y` that are not
            arrays.

    Example:

    ```python
    table = keras_memwatch.memory_by_layer(model, x[:32], y[:32])
    table.sort_values("working_bytes", ascending=False).head()
    ```
    """
    if batch_size is not None:
        batch_size = options.positive_int("batch_size", batch_size)
    options.boolean("expand_nested", expand_nested)
    _compiled(model)
    import keras

    from keras_memwatch.measure.batches import Batches
    from keras_memwatch.measure.model_state import ModelState, build_for_training

    data = Batches(x, y)
    size = batch_size or data.n
    build_for_training(model, data.take(1))
    state = ModelState(model)
    backend = keras.backend.backend()
    try:
        if backend == "torch":
            return _torch_step(model, data.take(size), expand_nested)
        rows = trace_shapes(model, batch_spec(data.x, size), expand_nested)
        activations = {id(r.layer): output_bytes(r) for r in rows}
        source = "shapes"
        if backend == "jax":
            working, words, kept = _jax_plan(model, data.take(1), size)
            if kept:
                from keras_memwatch.explain.layers.jax_plan import kept_by_row

                by_path, _ = kept_by_row(kept, [r.path for r in rows], model.name)
                activations = {id(r.layer): by_path.get(r.path, 0) for r in rows}
                source = "plan"
        else:
            working, words = _tensorflow_step(model, data.take(size))
        return by_layer_table(model, rows, activations, source, working, words,
                              rest_source="plan" if backend == "jax" else "measured")
    finally:
        state.restore()


def _torch_step(model: Any, batch: tuple[Any, Any], expand_nested: bool
                ) -> pd.DataFrame:
    from keras_memwatch.measure.batches import fit_steps
    from keras_memwatch.measure.device import Device
    from keras_memwatch.explain.layers.torch_saved import measure_saved

    device = Device("torch", None)
    try:
        gc.collect()
        in_use = device.in_use()
        device.read()  # resets the peaks
        held: dict[str, Any] = {}

        def at_backward() -> None:
            held.update(device.read())  # and resets the peak

        gc.disable()
        try:
            saved = measure_saved(model, lambda: fit_steps(model, batch, 1),
                                  expand_nested, at_backward)
        finally:
            gc.enable()
        peaks = [p for p in (held.get(device.peak_column), device.peak(), saved.peak)
                 if p is not None]
    finally:
        device.close()
    peak = max(peaks) if peaks else None
    working = None if peak is None else max(peak - in_use, 0)
    words = ("one real step: " + ("the CUDA allocator's" if device.on_gpu else
                                  "the host's resident") +
             " peak less the memory in use before it")
    table = by_layer_table(model, saved.rows, saved.saved, "measured", working,
                           words, forward=saved.forward, backward=saved.backward)
    current = held.get("current_bytes")
    table.attrs.update(
        saved_bytes=sum(saved.saved.values()) + saved.outside,
        held_at_backward_bytes=None if current is None else current - in_use)
    return table


def _jax_plan(model: Any, batch: tuple[Any, Any], size: int
              ) -> tuple[int, str, dict[Optional[str], int]]:
    """XLA's plan of `fit`'s step: its working bytes, in words, and the bytes
    it keeps for the backward pass by name scope (`jax_plan`)."""
    from keras_memwatch.explain.layers.jax_plan import kept_by_scope
    from keras_memwatch.judge import xla_plan

    lowered, state_bytes, _ = xla_plan.lower_step(model, batch, size, batches_ahead=0)
    compiled = lowered.compile()
    working = max(xla_plan.planned_bytes(compiled) - state_bytes, 0)
    try:
        kept = kept_by_scope(compiled.as_text())
    except Exception:  # an HLO text this parser does not know: shapes instead
        kept = {}
    return (working, "XLA's compiled plan of fit's step beyond the training state",
            kept)


def _tensorflow_step(model: Any, batch: tuple[Any, Any]
                     ) -> tuple[Optional[int], str]:
    from keras_memwatch.measure.batches import fit_steps
    from keras_memwatch.measure.device import Device

    device = Device("tensorflow", None)
    try:
        if not device.on_gpu:
            return None, ("not measured: TensorFlow's CPU allocator keeps no "
                          "statistics")
        in_use = device.in_use()
        device.read()
        fit_steps(model, batch, 1)
        peak = device.peak()
    finally:
        device.close()
    return (None if peak is None else max(peak - in_use, 0),
            "one real step (tracing included): the allocator's peak less the "
            "memory in use before it")


def memory_by_layer_of_fit(
    model: Any,
    seen: list[tuple[Any, tuple]],
    breakdown: dict[str, Any],
    batch_size: Optional[int] = None,
    expand_nested: bool = True,
) -> pd.DataFrame:
    """The by-layer table of a recorded fit, without a training step.

    The rows are those of the first input shape the fit called the model
    with (`record.batch_shapes`), and the step's working memory the typical
    one the record measured (`breakdown`, from `memory_breakdown`).
    PyTorch measures one forward pass at that shape (on zeros; its saved
    tensors); the other backends call the model symbolically. Where the
    fit saw several input shapes, `attrs["grew"]` names the layer whose
    activations grew most from the first shape to the largest (a
    `Growth`).

    Raises:
        ValueError: where the fit saw no input shape, or an unknown batch
            dimension and no `batch_size` is given.
    """
    import keras

    if not seen:
        raise ValueError(
            "Expected a watch that has recorded a fit of its model: it saw no "
            "batch. Call `keras_memwatch.memory_by_layer(model, x, y)` with a "
            "sample batch instead")
    x_spec = _sized(seen[0][0], batch_size)
    working_bytes = breakdown.get("transient_bytes")
    working_source = ("" if working_bytes is None else
                      f"the median step on {breakdown['device']}, "
                      f"{breakdown['transient_source']}")
    rest_source = ("plan" if breakdown.get("transient_source") == "XLA plan"
                   else "measured")
    from keras_memwatch.measure.model_state import ModelState

    state = ModelState(model)
    try:
        if keras.backend.backend() == "torch":
            from keras_memwatch.explain.layers.torch_saved import measure_saved

            inputs = keras.tree.map_structure(
                lambda s: keras.ops.zeros(s.shape, s.dtype), x_spec)
            saved = measure_saved(model, lambda: model(inputs, training=True),
                                  expand_nested)
            table = by_layer_table(model, saved.rows, saved.saved, "measured",
                                   working_bytes, working_source,
                                   forward=saved.forward, rest_source=rest_source)
        else:
            rows = trace_shapes(model, x_spec, expand_nested)
            table = by_layer_table(model, rows,
                                   {id(r.layer): output_bytes(r) for r in rows},
                                   "shapes", working_bytes, working_source,
                                   rest_source=rest_source)
        table.attrs["grew"] = _grew(model, seen, x_spec, expand_nested)
    finally:
        state.restore()
    return table


def _sized(x_spec: Any, batch_size: Optional[int]) -> Any:
    """`x_spec` with `batch_size` samples (where given)."""
    import keras

    first = keras.tree.flatten(x_spec)[0].shape[0]
    if batch_size is None and first is None:
        raise ValueError(
            "Expected `batch_size` to be given: the fit traced its step with an "
            "unknown batch size (TensorFlow). Received: batch_size=None")
    return x_spec if batch_size is None else batch_spec(x_spec, batch_size)


def _grew(model: Any, seen: list[tuple[Any, tuple]], first_spec: Any,
          expand_nested: bool) -> Optional[Growth]:
    """The layer whose output bytes grew most from the first input shape to
    the largest the fit saw; None with one shape."""
    largest, found = max(seen, key=lambda pair: elements(pair[1]))
    if len(seen) < 2 or elements(found) <= elements(signature(first_spec)):
        return None
    return growth(model, first_spec, largest, expand_nested)
