"""PyTorch: the bytes each layer keeps for the backward pass, measured.

Keras's PyTorch backend runs eagerly, so autograd sees every tensor a
forward pass saves for the backward pass. While a step runs under
`torch.autograd.graph.saved_tensors_hooks`, each saved tensor is charged
to the layer running when it was saved (`CallTracer.owner`): its storage's
bytes, once per storage (a tensor saved twice, or two views of one
storage, count once), the model's own variables excluded (they are the
weights, not activations). Tensors saved outside every layer (the loss)
are counted apart. The counts are exact on any device; on a CUDA device
each layer's forward pass is also measured by the allocator (bytes
allocated at its end minus at its start).
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
    """

    rows: list[LayerCalls]
    saved: dict[int, int]
    outside: int
    forward: dict[int, int]


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

    def leave(row: LayerCalls) -> None:
        if cuda:
            key = id(row.layer)
            delta = torch.cuda.memory_allocated() - started.pop(key)
            forward[key] = forward.get(key, 0) + delta

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

    backward = [at_backward]

    def unpack(tensor: Any) -> Any:
        if backward[0] is not None:
            backward[0], call = None, backward[0]
            call()
        return tensor

    with tracer, torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        run()
    return SavedBytes(tracer.order, saved, outside[0], forward)
