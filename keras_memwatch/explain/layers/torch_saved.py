"""PyTorch: the bytes each layer keeps for the backward pass, measured.

Keras's PyTorch backend runs eagerly, so autograd sees every tensor a
forward pass saves for the backward pass. While a step runs under
`torch.autograd.graph.saved_tensors_hooks`, each saved tensor is charged
to the layer running when it was saved (`CallTracer.owner`): its storage's
bytes, once per storage (a tensor saved twice, or two views of one
storage, count once), the model's own variables excluded (they are the
weights, not activations). Tensors saved outside every layer (the loss)
are counted apart. The counts are exact on any device.

On a CUDA device the allocator also measures each layer's passes. Its
forward pass: bytes allocated at its end minus at its start. Its backward
pass: from the moment the gradient of its outputs is ready (a tensor hook)
to the moment the next layer's is, the allocator's peak less what was
allocated at the start; in a chain of layers that is exactly the layer's
backward, where branches run side by side the work between two hooks is
charged to the layer whose hook came first. The peaks are reset at each
hook; the largest seen is kept (`SavedBytes.peak`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from keras_memwatch.explain.layers.calls import CallTracer, LayerCalls

__all__ = ["SavedBytes", "measure_saved"]


@dataclasses.dataclass
class SavedBytes:
    """What one PyTorch step kept for its backward pass.

    Attributes:
        rows: the rows in call order (`CallTracer.order`).
        saved: row's `id(layer)` -> bytes saved while it ran.
        outside: bytes saved outside every row (the loss and metrics).
        forward: row's `id(layer)` -> bytes its forward pass left allocated
            on a CUDA device (empty elsewhere).
        backward: row's `id(layer)` -> the peak of its backward pass less
            what was allocated as it began, on a CUDA device (empty
            elsewhere).
        peak: the allocator's largest peak across the resets, or None.
    """

    rows: list[LayerCalls]
    saved: dict[int, int]
    outside: int
    forward: dict[int, int]
    backward: dict[int, int] = dataclasses.field(default_factory=dict)
    peak: Optional[int] = None


def _storage(tensor: Any) -> tuple[int, int]:
    """`(data pointer, bytes)` of a tensor's storage; `(0, 0)` where it has
    none a pointer can name (a meta or sparse tensor)."""
    try:
        storage = tensor.untyped_storage()
        return int(storage.data_ptr()), int(storage.nbytes())
    except Exception:
        return 0, 0


def measure_saved(model: Any, run: Callable[[], None],
                  expand_nested: bool = True,
                  at_backward: Optional[Callable[[], None]] = None) -> SavedBytes:
    """Runs `run()` (a step or a forward pass of `model`) and counts the
    bytes autograd saves, per row.

    Args:
        model: a built Keras model on the PyTorch backend.
        run: what to run, once.
        expand_nested: rows for the layers of nested models. Defaults to
            `True`.
        at_backward: called once, as the backward pass first reads a saved
            tensor (when the forward pass holds all it saved). Defaults to
            `None`.
    """
    import keras
    import torch

    weights = {_storage(v.value)[0] for v in model.variables}
    seen: set[int] = set()
    saved: dict[int, int] = {}
    outside = [0]
    cuda = torch.cuda.is_available()
    forward: dict[int, int] = {}
    started: dict[int, int] = {}

    def enter(row: LayerCalls) -> None:
        if cuda:
            started[id(row.layer)] = torch.cuda.memory_allocated()

    backward: dict[int, int] = {}
    # The layer whose backward pass runs, what was allocated as it began, and
    # the largest peak so far.
    window: list[Any] = [None, 0, None]

    def close() -> None:
        """Ends the running backward pass: charges its peak to its layer."""
        peak = torch.cuda.max_memory_allocated()
        key, start, most = window
        if key is not None:
            backward[key] = backward.get(key, 0) + max(peak - start, 0)
        window[2] = peak if most is None else max(most, peak)

    def gradient_ready(key: int) -> None:
        close()
        torch.cuda.reset_peak_memory_stats()
        window[0], window[1] = key, torch.cuda.memory_allocated()

    def leave(row: LayerCalls, outputs: Any) -> None:
        if cuda:
            key = id(row.layer)
            delta = torch.cuda.memory_allocated() - started.pop(key)
            forward[key] = forward.get(key, 0) + delta
            for t in keras.tree.flatten(outputs):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda grad, key=key: gradient_ready(key))

    tracer = CallTracer(model, expand_nested, on_enter=enter, on_exit=leave)

    def pack(tensor: Any) -> Any:
        pointer, size = _storage(tensor)
        if pointer and pointer not in seen and pointer not in weights:
            seen.add(pointer)
            row: Optional[LayerCalls] = tracer.owner()
            if row is None:
                outside[0] += size
            else:
                saved[id(row.layer)] = saved.get(id(row.layer), 0) + size
        return tensor

    first_unpack = [at_backward]

    def unpack(tensor: Any) -> Any:
        if first_unpack[0] is not None:
            first_unpack[0], call = None, first_unpack[0]
            call()
        return tensor

    with tracer, torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        run()
    if cuda:
        close()
    return SavedBytes(tracer.order, saved, outside[0], forward, backward, window[2])
