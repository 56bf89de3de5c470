"""A layer's `call` replaced on the instance, and the shapes a call takes.

Keras's `Layer.__call__` calls `self.call`, so a function set on the
instance runs in its place for that object alone: other instances of the
class are untouched. `wrap_call` puts one there and `unwrap_call` gives
back whatever was there before (another wrapper, or nothing).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

__all__ = ["elements", "signature", "unwrap_call", "wrap_call"]


def wrap_call(layer: Any, make: Callable[[Callable], Callable]) -> tuple:
    """Sets `make(layer.call)` as the instance's `call`; returns the token
    `unwrap_call` takes."""
    before = vars(layer).get("call")
    wrapper = make(layer.call)
    object.__setattr__(layer, "call", wrapper)
    return layer, before, wrapper


def unwrap_call(token: tuple) -> None:
    """Gives the layer the `call` it had before `wrap_call` (where the
    wrapper is still in place)."""
    layer, before, wrapper = token
    if vars(layer).get("call") is not wrapper:
        return
    if before is not None:
        object.__setattr__(layer, "call", before)
    else:
        object.__delattr__(layer, "call")


def signature(tree: Any) -> Optional[tuple]:
    """`((shape, dtype), ...)` of the tensors in `tree`, in `keras.tree`'s
    order (a dimension not known is `None`); None where it holds none."""
    import keras

    specs = tuple((tuple(None if d is None else int(d) for d in t.shape),
                   keras.backend.standardize_dtype(t.dtype))
                  for t in keras.tree.flatten(tree)
                  if hasattr(t, "shape") and hasattr(t, "dtype"))
    return specs or None


def elements(found: tuple) -> int:
    """Elements of a `signature`'s tensors (a dimension not known counts 0)."""
    return sum(math.prod(d or 0 for d in shape) for shape, _ in found)
