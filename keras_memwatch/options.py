"""Argument checks, the one home of every public option's check.

Each check raises before anything runs, in Keras's words: "Expected `name`
to be ... Received: name=value". A value of the wrong type raises
`TypeError`, a value of the right type out of range `ValueError`. The
command line turns the same messages into usage errors.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable
from typing import Any, Callable, Optional


def expected(name: str, what: str, value: Any, error: type = ValueError) -> Exception:
    """The error for an argument `name` that is not `what`.

    Args:
        name: the argument's name.
        what: what it should be, such as `"a positive integer"`.
        value: what was received.
        error: `TypeError` for a value of the wrong type. Defaults to
            `ValueError`.

    Returns:
        The exception, to raise.
    """
    return error(f"Expected `{name}` to be {what}. Received: {name}={value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(name: str, value: Any) -> int:
    """An integer of at least 1."""
    if not _is_int(value):
        raise expected(name, "a positive integer", value, TypeError)
    if value < 1:
        raise expected(name, "a positive integer", value)
    return int(value)


def non_negative_int(name: str, value: Any) -> int:
    """An integer of at least 0."""
    if not _is_int(value):
        raise expected(name, "a non-negative integer", value, TypeError)
    if value < 0:
        raise expected(name, "a non-negative integer", value)
    return int(value)


def number_above(name: str, value: Any, bound: float) -> float:
    """A finite number greater than `bound`."""
    what = f"a number greater than {bound:g}"
    if not _is_number(value):
        raise expected(name, what, value, TypeError)
    if not bound < value < math.inf:  # also refuses NaN
        raise expected(name, what, value)
    return float(value)


def positive_number(name: str, value: Any) -> float:
    """A finite number greater than 0."""
    if not _is_number(value):
        raise expected(name, "a positive number", value, TypeError)
    if not 0 < value < math.inf:  # also refuses NaN
        raise expected(name, "a positive number", value)
    return float(value)


def non_negative(name: str, value: Any) -> float:
    """A finite number of at least 0."""
    if not _is_number(value):
        raise expected(name, "a non-negative number", value, TypeError)
    if not 0 <= value < math.inf:  # also refuses NaN
        raise expected(name, "a non-negative number", value)
    return float(value)


def fraction(name: str, value: Any) -> float:
    """A number in [0, 1), such as a headroom."""
    if not _is_number(value):
        raise expected(name, "a number in [0, 1), such as 0.1", value, TypeError)
    if not 0 <= value < 1:  # also refuses NaN
        raise expected(name, "a number in [0, 1), such as 0.1", value)
    return float(value)


def boolean(name: str, value: Any) -> bool:
    """`True` or `False`."""
    if not isinstance(value, bool):
        raise expected(name, "True or False", value, TypeError)
    return value


def optional_boolean(name: str, value: Any) -> Optional[bool]:
    """`True`, `False` or `None`."""
    if value is not None and not isinstance(value, bool):
        raise expected(name, "True, False or None", value, TypeError)
    return value


def choice(name: str, value: Any, allowed: tuple) -> Any:
    """One of `allowed`: a value of another type than theirs is a
    `TypeError`, one of theirs that is not among them a `ValueError`."""
    what = f"one of {allowed}"
    if not any(_same_kind(value, a) for a in allowed):
        raise expected(name, what, value, TypeError)
    if value not in allowed:
        raise expected(name, what, value)
    return value


def _same_kind(value: Any, allowed: Any) -> bool:
    if _is_int(allowed):
        return _is_int(value)
    return isinstance(value, type(allowed))


def optional_callable(name: str, value: Any) -> Optional[Callable]:
    """A callable or `None`."""
    if value is not None and not callable(value):
        raise expected(name, "a callable or None", value, TypeError)
    return value


def path(name: str, value: Any, optional: bool = False) -> Any:
    """A path (`str` or `os.PathLike`), or `None` where `optional`."""
    if value is None and optional:
        return None
    if not isinstance(value, (str, os.PathLike)):
        what = "a path (str or os.PathLike)" + (" or None" if optional else "")
        raise expected(name, what, value, TypeError)
    return value


def batch_sizes(name: str, value: Any) -> list[int]:
    """At least two distinct positive integers, such as `[2, 8, 32]`;
    returns them sorted, without repeats."""
    what = "a list of at least two distinct positive integers, such as [2, 8, 32]"
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise expected(name, what, value, TypeError)
    sizes = list(value)
    if not all(_is_int(s) for s in sizes):
        raise expected(name, what, value, TypeError)
    if min(sizes, default=0) < 1 or len(set(sizes)) < 2:
        raise expected(name, what, value)
    return sorted({int(s) for s in sizes})


def optional_seconds(name: str, value: Any) -> Optional[float]:
    """A positive number of seconds, or `None` for no limit."""
    if value is None:
        return None
    if not _is_number(value):
        raise expected(name, "a positive number of seconds or None", value, TypeError)
    if not 0 < value < math.inf:  # also refuses NaN
        raise expected(name, "a positive number of seconds or None", value)
    return float(value)


def verbosity(name: str, value: Any) -> Any:
    """`"auto"`, `0`, `1` or `2`, as `fit`'s `verbose`."""
    what = "'auto', 0, 1 or 2"
    if isinstance(value, str):
        if value != "auto":
            raise expected(name, what, value)
        return value
    if not _is_int(value):
        raise expected(name, what, value, TypeError)
    if value not in (0, 1, 2):
        raise expected(name, what, value)
    return int(value)


def cache_directory(name: str, value: Any) -> Any:
    """A directory path (`str` or `os.PathLike`, created where missing),
    `True` (a default directory), or `False`/`None` (none)."""
    what = "a directory path, True (a default directory) or None"
    if value is None or isinstance(value, bool):
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise expected(name, what, value, TypeError)
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise expected(name, what, value)
    full = os.path.abspath(os.path.expanduser(text))
    if os.path.exists(full) and not os.path.isdir(full):
        raise expected(name, f"{what} ({full} is a file)", value)
    return full


def names_or_all(name: str, value: Any, allowed: tuple) -> list[str]:
    """`"all"` (every name in `allowed`) or a list of distinct names from
    `allowed`; returns them in `allowed`'s order."""
    what = f'"all" or a non-empty list of names from {list(allowed)}'
    if isinstance(value, str):
        if value == "all":
            return list(allowed)
        if value in allowed:
            raise expected(name, what + f" (a list: [{value!r}])", value, TypeError)
        raise expected(name, what, value)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise expected(name, what, value, TypeError)
    unknown = [v for v in value if v not in allowed]
    if unknown or not value or len(set(value)) != len(value):
        raise expected(name, what, value)
    return [a for a in allowed if a in value]


def compiled_model(name: str, model: Any) -> Any:
    """A Keras model compiled with an optimizer (what a training step needs)."""
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
        raise ValueError(
            f"Expected `{name}` to be a compiled model (call `{name}.compile("
            "optimizer=..., loss=...)` first). Received: "
            f"{type(model).__name__} without an optimizer")
    return model
