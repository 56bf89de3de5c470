"""A public name that goes away keeps working for one release, and warns."""

from __future__ import annotations

import warnings


def deprecated(name: str, instead: str, removed_in: str = "0.3.0") -> None:
    """Warns (`DeprecationWarning`, at the caller's caller) that `name` goes
    away in `removed_in`, and what to use instead."""
    warnings.warn(f"{name} is deprecated and will be removed in keras_memwatch "
                  f"{removed_in}: use {instead}", DeprecationWarning, stacklevel=3)
