"""`memory_by_layer`: which layers hold a step's working memory.

Each backend gives what it can:

- PyTorch (`"measured"`): one real step of `fit`, with autograd's saved
  tensors charged to the layer that saved them, or to the loss
  (`torch_saved`), and the step's working memory from the device's peak
  (the CUDA allocator, or the host's resident memory on a CPU).
- JAX (`"plan"`): the buffers XLA's compiled step keeps for the backward
  pass, charged to layers by their name scopes, and the loss's and the
  update's at the plan's peak (`jax_plan`); the step's working memory
  from the same plan (compiled, never run).
- TensorFlow (`"shapes"`): the layers' outputs and the loss from shapes;
  the step's working memory from one real step on a GPU (the allocator's
  peak); on a CPU it is not measured (TensorFlow's CPU allocator keeps no
  statistics).

The steps themselves are in `steps`.
"""

from __future__ import annotations

from typing import Any, Optional

import pandas as pd

from keras_memwatch import options
from keras_memwatch.call_wrapping import elements, signature
from keras_memwatch.explain.layers.growth import Growth, growth
from keras_memwatch.explain.layers.shapes import batch_spec, trace_step
from keras_memwatch.explain.layers.steps import (jax_step, shapes_activations,
                                                 shapes_loss_row, tensorflow_step,
                                                 torch_step)
from keras_memwatch.explain.layers.table import by_layer_table

__all__ = ["memory_by_layer", "memory_by_layer_of_fit"]


def memory_by_layer(
    model: Any,
    x: Any,
    y: Any = None,
    batch_size: Optional[int] = None,
    *,
    expand_nested: bool = True,
    expand_blocks: bool = False,
) -> pd.DataFrame:
    """Splits a training step's working memory over the model's layers.

    One row per layer, in call order; then a row for the loss (the logits
    it keeps and their gradient: on a language model often the largest
    item of a step), one for the optimizer's update (its buffers, where it
    holds the step's peak), and a last row for the rest of the step's
    working memory (the batch, the framework's workspaces, what no row
    explains), so that `working_bytes` adds up to the step's working memory
    where it is measured. Where each figure comes from:

    - PyTorch: one real step of `fit`; each layer's `activation_bytes` are
      the bytes autograd saved for the backward pass while it ran
      (`source="measured"`); the loss's are what it saved and the model's
      outputs the step holds, its `grad_bytes` the gradients its backward
      pass makes; the step's working memory is the device's peak during
      the step less what was in use before it (the CUDA allocator; the
      host's resident memory on a CPU).
    - JAX: `activation_bytes` are the buffers of XLA's compiled step that
      the forward pass makes and the backward pass reads, charged to the
      layer whose name scope made them (`source="plan"`), wherever the
      plan's peak falls; the loss holds the logits and what it keeps of
      them and their gradient, at its own peak; the update what it adds
      to the forward and backward passes' peak; the step's working memory
      is the same plan beyond the training state.
    - TensorFlow: the layer's outputs at the batch size, from shapes and
      dtypes (`source="shapes"`), and the loss as one array of the
      outputs' size kept and one for their gradient; the working memory
      from one real step on a GPU, not measured on a CPU.

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
        expand_blocks: open composite layers that are not models (a
            transformer block, `MultiHeadAttention`): their parts (the
            projections, the attention's softmax, the feed-forward layers)
            get rows of their own, named `"block/part"`, and the block's
            row keeps the work of its own `call` outside them. Defaults to
            `False`.

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
        step); on JAX `peak_phase` (where the plan's peak is: `"forward"`,
        `"backward"`, or `"update"`), `kept_bytes` (the forward
        bytes the backward pass reads) and `unowned_kept_bytes` (those of
        no row). Work in a model's own `call` outside its layers (an `ops.add`
        of two layers' outputs) belongs to the rest; the model's outputs
        (the logits) to the loss.

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
    options.boolean("expand_blocks", expand_blocks)
    options.compiled_model("model", model)
    import keras

    from keras_memwatch.measure.batches import Batches
    from keras_memwatch.measure.model_state import state_kept

    data = Batches(x, y)
    size = batch_size or data.n
    backend = keras.backend.backend()
    with state_kept(model, data.take(1)):
        if backend == "torch":
            return torch_step(model, data.take(size), expand_nested, expand_blocks)
        rows, outputs = trace_step(model, batch_spec(data.x, size), expand_nested,
                                   expand_blocks)
        if backend == "jax":
            return jax_step(model, data.take(1), size, rows, outputs)
        working, words = tensorflow_step(model, data.take(size))
        return by_layer_table(model, rows, shapes_activations(rows, outputs),
                              "shapes", working, words,
                              step_rows=[shapes_loss_row(outputs)])


def memory_by_layer_of_fit(
    model: Any,
    seen: list[tuple[Any, tuple]],
    breakdown: dict[str, Any],
    batch_size: Optional[int] = None,
    expand_nested: bool = True,
    expand_blocks: bool = False,
) -> pd.DataFrame:
    """The by-layer table of a recorded fit, without a training step.

    The rows are those of the first input shape the fit called the model
    with (`record.batch_shapes`), and the step's working memory the typical
    one the record measured (`breakdown`, from `memory_breakdown`).
    PyTorch measures one forward pass at that shape (on zeros; its saved
    tensors); the other backends call the model symbolically. The loss row
    comes from the model's outputs' shapes on every backend (no loss runs);
    there is no update row. Where the fit saw several input shapes, `attrs["grew"]` names the layer whose
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
    from keras_memwatch.measure.model_state import state_kept

    with state_kept(model):
        rows, outputs = trace_step(model, x_spec, expand_nested, expand_blocks)
        loss = [shapes_loss_row(outputs)]
        if keras.backend.backend() == "torch":
            from keras_memwatch.explain.layers.torch_saved import measure_saved

            inputs = keras.tree.map_structure(
                lambda s: keras.ops.zeros(s.shape, s.dtype), x_spec)
            saved = measure_saved(model, lambda: model(inputs, training=True),
                                  expand_nested, expand_blocks=expand_blocks)
            table = by_layer_table(model, saved.rows, saved.saved, "measured",
                                   working_bytes, working_source,
                                   forward=saved.forward, rest_source=rest_source,
                                   step_rows=loss)
        else:
            table = by_layer_table(model, rows, shapes_activations(rows, outputs),
                                   "shapes", working_bytes, working_source,
                                   rest_source=rest_source, step_rows=loss)
        table.attrs["grew"] = _grew(model, seen, x_spec, expand_nested)
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
