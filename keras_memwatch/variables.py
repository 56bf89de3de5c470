"""A model's variables in bytes: each counted once, from its own dtype and
shape (a `mixed_float16` model's float32 master weights are 4 bytes each)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["dtype_size", "element_count", "unique_variables", "variable_bytes"]

_ODD_DTYPE_BITS = {"bool": 8, "bfloat16": 16}


def dtype_size(dtype: Any) -> int:
    """Bytes per element of a dtype name (`"float32"`, `"bfloat16"`, ...)."""
    name = str(getattr(dtype, "name", dtype))
    if name in _ODD_DTYPE_BITS:
        return _ODD_DTYPE_BITS[name] // 8
    try:
        return np.dtype(name).itemsize
    except TypeError:
        bits = re.search(r"(\d+)", name)  # float8_e4m3fn, int4, ...
        if bits is None:
            raise ValueError(f"Expected a numeric dtype. Received: dtype={name!r}") from None
        return max(int(bits.group(1)) // 8, 1)


def element_count(variable: Any) -> int:
    """The number of elements of a variable (or anything with a `shape`)."""
    return int(math.prod(int(d) for d in variable.shape))


def unique_variables(variables: Iterable[Any]) -> list[Any]:
    """The variables in order, each once (a shared variable appears in
    several layers' lists)."""
    seen: set[int] = set()
    out = []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def variable_bytes(variables: Iterable[Any]) -> int:
    """Sum of `size * itemsize` over variables, each counted once.

    Args:
        variables: Keras variables (anything with `shape` and `dtype`).

    Returns:
        The bytes they hold.
    """
    return sum(element_count(v) * dtype_size(v.dtype) for v in unique_variables(variables))
