"""The arguments of `configure_memory`: their checks, and the GPU selection.

Arguments are checked before any framework is imported. Each backend then
receives a `Request` and checks it against the GPUs it finds (`select`,
`check_limit_fits`).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any, Optional

from keras_memwatch import options
from keras_memwatch.configure.devices import gpu_index
from keras_memwatch.units import MIB

_CALL_FIRST = (
    "Call `keras_memwatch.configure_memory(...)` (or construct "
    "`MemWatch(allow_growth=..., memory_limit_mb=...)`) first thing in your "
    "program, before building any model or creating any tensor"
)


@dataclasses.dataclass(frozen=True)
class Request:
    """The checked arguments of one `configure_memory` call."""

    allow_growth: Optional[bool]
    memory_limit_mb: Optional[float]
    limit_bytes: Optional[int]
    selection: Optional[tuple[int, ...]]  # GPU indices; None for all
    devices_arg: Any  # `devices` as received, for messages


def check_arguments(
    allow_growth: Any, memory_limit_mb: Any, devices: Any
) -> tuple[Optional[int], Optional[tuple[int, ...]]]:
    """Validates the arguments; returns the cap in bytes and GPU indices.

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for a cap that is not positive, or `devices` that
            name no GPU.
    """
    options.optional_boolean("allow_growth", allow_growth)
    limit_bytes = None if memory_limit_mb is None else _limit_bytes(memory_limit_mb)
    selection = None if devices is None else _gpu_indices(devices)
    return limit_bytes, selection


def _limit_bytes(memory_limit_mb: Any) -> int:
    """`memory_limit_mb` in bytes, checked."""
    limit_bytes = int(options.positive_number("memory_limit_mb", memory_limit_mb) * MIB)
    if limit_bytes < 1:
        raise options.expected("memory_limit_mb", "at least one byte (2**-20 MiB)",
                               memory_limit_mb)
    return limit_bytes


def _gpu_indices(devices: Any) -> tuple[int, ...]:
    """The GPU indices `devices` names, in order, without repeats."""
    what = "None or a list of GPU indices or names such as 'GPU:0'"
    if isinstance(devices, (str, numbers.Integral)) and not isinstance(devices, bool):
        devices = [devices]
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise options.expected("devices", what, devices, TypeError)
    if not devices:
        raise options.expected("devices", "at least one GPU, or None for all",
                               devices)
    indices: list[int] = []
    for item in devices:
        index = gpu_index(item, "devices")
        if index not in indices:
            indices.append(index)
    return tuple(indices)


def select(request: Request, count: int) -> list[int]:
    """The GPU indices to configure, checked against the `count` available."""
    selection, devices_arg = request.selection, request.devices_arg
    if selection is None:
        return list(range(count))
    unknown = [i for i in selection if i >= count]
    if unknown:
        raise ValueError(
            "Unknown GPU(s) in `devices`: "
            f"{[f'GPU:{i}' for i in unknown]}. Available: "
            f"{[f'GPU:{i}' for i in range(count)]}. Received: "
            f"devices={devices_arg!r}"
        )
    return list(selection)


def check_limit_fits(
    limit_bytes: Optional[int],
    memory_limit_mb: Optional[float],
    totals: dict[int, Optional[int]],
) -> None:
    """Raises `ValueError` when the cap exceeds a GPU's known total memory."""
    if limit_bytes is None:
        return
    for index, total in totals.items():
        if total is not None and limit_bytes > total:
            raise ValueError(
                "Expected `memory_limit_mb` to be at most the memory of each "
                f"selected GPU; GPU:{index} has {total / MIB:.0f} MiB. "
                f"Received: memory_limit_mb={memory_limit_mb!r}"
            )


def too_late(what: str, detail: str, why: str) -> RuntimeError:
    """The error for settings asked for after the framework has started."""
    return RuntimeError(
        f"configure_memory was called after {what}, so {detail} can no longer "
        f"take effect: {why}. {_CALL_FIRST}."
    )
