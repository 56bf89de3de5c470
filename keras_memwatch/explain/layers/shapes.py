"""Every layer's outputs at a batch size, from shapes and dtypes alone.

The model is called symbolically (`keras`'s `compute_output_spec`: JAX's
`eval_shape`, a TensorFlow graph, PyTorch's meta device), so nothing is
computed and no device memory is taken, however large the batch. On
PyTorch, where a layer cannot run on the meta device (keras-hub's Llama,
Mistral, Qwen2 and Phi-3 attention), Keras runs the forward pass for real
on the model's device, without gradients, and leaves its arrays in
reference cycles: `trace_step` collects them before it returns. A
layer's activation bytes are then the bytes of its outputs in its compute
dtype (`float16` under `mixed_float16`): what a layer keeps for the
backward pass when the next layer saves its input, as torchinfo's
"forward/backward pass size" counts it.
"""

from __future__ import annotations

import gc
import math
from typing import Any

from keras_memwatch.variables import dtype_size
from keras_memwatch.explain.layers.calls import CallTracer, LayerCalls

__all__ = ["batch_spec", "output_bytes", "output_shape", "trace_shapes",
           "trace_step"]


def batch_spec(x: Any, size: int) -> Any:
    """`x` (arrays, or specs with shapes and dtypes) as `keras.KerasTensor`s
    of `size` samples."""
    import keras

    def spec(a: Any) -> Any:
        dtype = keras.backend.standardize_dtype(a.dtype)
        return keras.KerasTensor((size,) + tuple(a.shape[1:]), dtype)

    return keras.tree.map_structure(spec, x)


def trace_shapes(model: Any, x_spec: Any, expand_nested: bool = True,
                 expand_blocks: bool = False) -> list[LayerCalls]:
    """The model's rows in call order, each with its outputs' specs.

    Args:
        model: a built Keras model.
        x_spec: its inputs as `keras.KerasTensor`s (`batch_spec`).
        expand_nested: rows for the layers of nested models. Defaults to
            `True`.
        expand_blocks: rows for the parts of composite layers. Defaults to
            `False`.
    """
    return trace_step(model, x_spec, expand_nested, expand_blocks)[0]


def trace_step(model: Any, x_spec: Any, expand_nested: bool = True,
               expand_blocks: bool = False
               ) -> tuple[list[LayerCalls], tuple[tuple[tuple, str], ...]]:
    """`trace_shapes`, and the `(shape, dtype)` of the model's outputs (what
    the loss receives)."""
    from keras.src import backend

    from keras_memwatch.call_wrapping import signature

    with CallTracer(model, expand_nested, no_remat=True,
                    expand_blocks=expand_blocks) as tracer:
        outputs = backend.compute_output_spec(lambda x: model(x, training=True),
                                              x_spec)
    if backend.backend() == "torch":
        gc.collect()  # what a forward pass run for real left in cycles
    return tracer.order, signature(outputs) or ()


def output_bytes(row: LayerCalls) -> int:
    """Bytes of a row's outputs, summed over its calls (an output of a
    dimension the trace does not know counts 0)."""
    return sum(math.prod(shape) * dtype_size(dtype)
               for outputs in row.outputs for shape, dtype in outputs
               if None not in shape)


def output_shape(row: LayerCalls) -> str:
    """A row's output shape(s) of its first call, as text: `"(32, 64, 10)"`,
    several outputs joined by `", "`; the dtype follows where it is not
    `float32`."""
    if not row.outputs:
        return ""
    parts = []
    for shape, dtype in row.outputs[0]:
        parts.append(str(shape) if dtype == "float32" else f"{shape} {dtype}")
    return ", ".join(parts)
