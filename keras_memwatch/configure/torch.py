"""GPU memory settings under PyTorch.

Its caching allocator already grows on demand and cannot preallocate, so
growth sets nothing. A cap goes through
`torch.cuda.set_per_process_memory_fraction`, which can be set at any time;
memory already reserved above it stays reserved.
"""

from __future__ import annotations

import logging
from typing import Any

from keras_memwatch.configure.arguments import Request, check_limit_fits, select
from keras_memwatch.configure.results import DeviceMemoryConfig, MemoryConfig
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")


def configure_torch(request: Request) -> MemoryConfig:
    """Applies `request` to PyTorch's CUDA GPUs; see `configure_memory`."""
    import torch

    allow_growth, memory_limit_mb = request.allow_growth, request.memory_limit_mb
    if not torch.cuda.is_available():
        why = "PyTorch sees no CUDA GPU"
        return MemoryConfig("torch", allow_growth, memory_limit_mb, note=why)
    chosen = select(request, torch.cuda.device_count())
    totals = {i: int(torch.cuda.get_device_properties(i).total_memory) for i in chosen}
    check_limit_fits(request.limit_bytes, memory_limit_mb, totals)
    if allow_growth is False:
        logger.warning(
            "allow_growth=False has no effect under PyTorch: its caching "
            "allocator cannot preallocate; it allocates on demand."
        )
    entries = tuple(_configure_device(torch, request, i, totals[i]) for i in chosen)
    return MemoryConfig("torch", allow_growth, memory_limit_mb, entries)


def _configure_device(
    torch: Any, request: Request, index: int, total: int
) -> DeviceMemoryConfig:
    """Caps one GPU when asked to; says what holds for its growth."""
    mechanisms: list[str] = []
    notes: list[str] = []
    applied = None
    if request.limit_bytes is not None:
        fraction = request.limit_bytes / total
        torch.cuda.set_per_process_memory_fraction(fraction, index)
        applied = int(fraction * total)
        mechanisms.append(
            f"torch.cuda.set_per_process_memory_fraction({fraction:.6g}, {index})"
        )
        reserved = int(torch.cuda.memory_reserved(index))
        if reserved > applied:
            notes.append(
                f"{format_bytes(reserved)} already reserved, above the cap; it "
                "stays reserved until freed (torch.cuda.empty_cache())"
            )
            logger.warning(
                "GPU:%s already has %s reserved by PyTorch, above the new "
                "cap of %s: new allocations fail until memory is freed.",
                index,
                format_bytes(reserved),
                format_bytes(applied),
            )
    if request.allow_growth is not None:
        mechanisms.append("nothing set: the caching allocator grows on demand")
        if not request.allow_growth:
            notes.append("PyTorch cannot preallocate")
    return DeviceMemoryConfig(
        f"GPU:{index}",
        None if request.allow_growth is None else True,
        applied,
        total,
        "; ".join(mechanisms),
        "; ".join(notes),
    )
