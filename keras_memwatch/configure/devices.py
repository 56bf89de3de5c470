"""Device names: one parser for every argument that names a GPU or the host."""

from __future__ import annotations

import numbers
import re
from typing import Any

from keras_memwatch.columns import HOST_DEVICE

_GPU_NAME = re.compile(
    r"^\s*(?:/(?:physical_)?device:)?(?:gpu|cuda):(\d+)\s*$", re.IGNORECASE
)
_HOST_NAMES = ("host", "cpu", "cpu:0")


def gpu_index(item: Any, argument: str) -> int:
    """`"GPU:1"`, `"gpu:1"`, `"cuda:1"`, `"/physical_device:GPU:1"` or 1 -> 1.

    Raises:
        TypeError: for anything but an integer or a string.
        ValueError: for a negative index or a name that is not a GPU's.
    """
    if isinstance(item, bool) or not isinstance(item, (numbers.Integral, str)):
        raise TypeError(
            f"Expected `{argument}` to hold GPU indices or names such as "
            f"'GPU:0'. Received: {argument}={item!r}"
        )
    if isinstance(item, numbers.Integral):
        if item < 0:
            raise ValueError(
                f"Expected `{argument}` to hold non-negative GPU indices. "
                f"Received: {argument}={item!r}"
            )
        return int(item)
    match = _GPU_NAME.match(item)
    if match is None:
        raise ValueError(
            f"Expected `{argument}` to hold GPU names such as 'GPU:0'. "
            f"Received: {argument}={item!r}"
        )
    return int(match.group(1))


def device_label(name: Any, argument: str = "device") -> str:
    """The record's name of a device: `"GPU:<i>"` or `"host"`.

    Accepts what `gpu_index` accepts, and `"host"`, `"cpu"` or `"cpu:0"`.

    Raises:
        ValueError: for anything else.
    """
    if isinstance(name, str) and name.strip().lower() in _HOST_NAMES:
        return HOST_DEVICE
    try:
        return f"GPU:{gpu_index(name, argument)}"
    except (TypeError, ValueError):
        raise ValueError(
            f"Expected `{argument}` to be 'GPU:<i>' or 'host'. Received: "
            f"{argument}={name!r}") from None
