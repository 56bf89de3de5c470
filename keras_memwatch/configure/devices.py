"""Device names: one parser for every argument that names a GPU or the host."""

from __future__ import annotations

import numbers
import re
from typing import Any

from keras_memwatch import options
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
        raise options.expected(argument, "GPU indices or names such as 'GPU:0'",
                               item, TypeError)
    if isinstance(item, numbers.Integral):
        if item < 0:
            raise options.expected(argument, "non-negative GPU indices", item)
        return int(item)
    match = _GPU_NAME.match(item)
    if match is None:
        raise options.expected(argument, "GPU names such as 'GPU:0'", item)
    return int(match.group(1))


def device_label(name: Any, argument: str = "device") -> str:
    """The record's name of a device: `"GPU:<i>"` or `"host"`.

    Accepts what `gpu_index` accepts, and `"host"`, `"cpu"` or `"cpu:0"`.

    Raises:
        TypeError: for anything but a string or an integer.
        ValueError: for a string that names no GPU nor the host.
    """
    what = "'GPU:<i>' or 'host'"
    if isinstance(name, bool) or not isinstance(name, (numbers.Integral, str)):
        raise options.expected(argument, what, name, TypeError)
    if isinstance(name, str) and name.strip().lower() in _HOST_NAMES:
        return HOST_DEVICE
    try:
        return f"GPU:{gpu_index(name, argument)}"
    except ValueError:
        raise options.expected(argument, what, name) from None
