"""The room a variant is measured in: what the measuring process holds
that a run of the variant alone would not, and the allocator cap widened
by it where the cap can move.

While a variant is measured, the user's model (or its optimizer) stays in
memory beside it: a rebuilt model's original keeps its weights, slots,
metrics and (PyTorch) the gradients of its last step; a new optimizer's
predecessor keeps its slots. A run of the
variant alone holds none of it. On PyTorch with a GPU under a
per-process cap (`torch.cuda.set_per_process_memory_fraction`, which can
move at any time), the cap is raised by those bytes while the variant is
measured, so that its steps, and the checks near the limit, meet the room
the variant alone would have. TensorFlow's cap cannot move (it is set
before the runtime starts), and the variant's steps run in the smaller
room: its answers err low, never high. JAX's plans run nothing, and are
read as if the variant trained alone (`measure`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Optional

from keras_memwatch.variables import unique_variables, variable_bytes

__all__ = ["gradient_bytes", "held_bytes", "state_variables", "widened"]

#: The widened cap stays this far under the device's total: a fraction of
#: 1 reads as no cap at all.
_BELOW_TOTAL = 2**20


def state_variables(model: Any, optimizer: Any) -> list[Any]:
    """The variables of a model's training state: its own, `optimizer`'s
    and its metrics', each once."""
    optimizer_variables = [] if optimizer is None else list(optimizer.variables)
    return unique_variables(list(model.variables) + optimizer_variables
                            + list(model.metrics_variables))


def held_bytes(held: list[Any], used: list[Any]) -> int:
    """Bytes of the variables in `held` that are not in `used`: what the
    process keeps that a run with only `used` would not."""
    ids = {id(v) for v in used}
    return variable_bytes(v for v in held if id(v) not in ids)


def gradient_bytes(model: Any) -> int:
    """Bytes of the gradients a PyTorch model's parameters keep from its
    last step (0 on other backends, which keep none)."""
    total = 0
    for variable in model.trainable_variables:
        grad = getattr(getattr(variable, "value", None), "grad", None)
        if grad is not None:
            total += int(grad.numel()) * int(grad.element_size())
    return total


@contextlib.contextmanager
def widened(backend: str, device: Optional[str], extra_bytes: int) -> Iterator[int]:
    """The allocator's cap raised by `extra_bytes` for the block, where it
    can move: PyTorch, a GPU, under a per-process memory fraction.

    Args:
        backend: the Keras backend.
        device: `"GPU:<i>"`, `"host"` or `None` (the first GPU).
        extra_bytes: bytes to add to the cap.

    Yields:
        The bytes the cap was raised by (0 where it was not).
    """
    cuda = _capped_cuda(backend, device) if extra_bytes > 0 else None
    if cuda is None:
        yield 0
        return
    index = 0 if device is None else int(device.split(":")[1])
    total = int(cuda.get_device_properties(index).total_memory)
    old = float(cuda.get_per_process_memory_fraction(index))
    cap = int(old * total)
    new_cap = min(cap + int(extra_bytes), total - _BELOW_TOTAL)
    if new_cap <= cap:
        yield 0
        return
    cuda.set_per_process_memory_fraction(new_cap / total, index)
    try:
        yield int(new_cap / total * total) - cap  # as the probe reads it
    finally:
        cuda.synchronize(index)
        cuda.empty_cache()  # what the wider room reserved, under the old cap
        cuda.set_per_process_memory_fraction(old, index)


def _capped_cuda(backend: str, device: Optional[str]) -> Any:
    """`torch.cuda` where PyTorch computes on `device`, a GPU under a
    per-process cap that can be read back; else `None`."""
    if backend != "torch" or device == "host":
        return None
    try:
        import torch

        cuda = torch.cuda
        if not cuda.is_available() or not hasattr(cuda,
                                                  "get_per_process_memory_fraction"):
            return None
        index = 0 if device is None else int(device.split(":")[1])
        fraction = float(cuda.get_per_process_memory_fraction(index))
    except Exception:  # noqa: BLE001 - no readable cap: nothing to widen
        return None
    return cuda if 0.0 < fraction < 1.0 else None
