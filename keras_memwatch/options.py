"""Argument checks that raise before training starts, in Keras's words:
"Expected `name` to be ... Received: name=value"."""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Callable, Optional


def _fail(name: str, expected: str, value: Any, error=ValueError):
    return error(f"Expected `{name}` to be {expected}. Received: {name}={value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def positive_int(name: str, value: Any) -> int:
    if not _is_int(value):
        raise _fail(name, "a positive integer", value, TypeError)
    if value < 1:
        raise _fail(name, "a positive integer", value)
    return int(value)


def non_negative_int(name: str, value: Any) -> int:
    if not _is_int(value):
        raise _fail(name, "a non-negative integer", value, TypeError)
    if value < 0:
        raise _fail(name, "a non-negative integer", value)
    return int(value)


def number_above(name: str, value: Any, bound: float) -> float:
    expected = f"a number greater than {bound:g}"
    if not _is_number(value):
        raise _fail(name, expected, value, TypeError)
    if not bound < value < math.inf:  # also refuses NaN
        raise _fail(name, expected, value)
    return float(value)


def non_negative(name: str, value: Any) -> float:
    if not _is_number(value):
        raise _fail(name, "a non-negative number", value, TypeError)
    if not 0 <= value < math.inf:  # also refuses NaN
        raise _fail(name, "a non-negative number", value)
    return float(value)


def fraction(name: str, value: Any) -> float:
    """A number in [0, 1), such as a headroom."""
    if not _is_number(value):
        raise _fail(name, "a number in [0, 1), such as 0.1", value, TypeError)
    if not 0 <= value < 1:  # also refuses NaN
        raise _fail(name, "a number in [0, 1), such as 0.1", value)
    return float(value)


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(name, "True or False", value, TypeError)
    return value


def choice(name: str, value: Any, allowed: tuple) -> Any:
    if isinstance(value, bool) or value not in allowed:
        raise _fail(name, f"one of {allowed}", value)
    return value


def optional_callable(name: str, value: Any) -> Optional[Callable]:
    if value is not None and not callable(value):
        raise _fail(name, "a callable or None", value, TypeError)
    return value


def log_path(name: str, value: Any) -> Optional[str]:
    """A new `.csv` file in an existing, writable folder.

    `{rank}` in the path stands for the process index (each process of a
    distributed run writes its own file). An existing file is refused here
    only for one process and a path without `{rank}`: where several
    processes train, each takes its own name at train begin (`mem.csv` ->
    `mem.rank{N}.csv`, the next free number if that is taken too), so that
    no process fails alone while the others wait for it.
    """
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise _fail(name, "a path (str or os.PathLike) or None", value, TypeError)
    from keras_memwatch.record.csvlog import RANK_FIELD
    from keras_memwatch.configure.ranks import process_index_and_count

    path = os.path.abspath(os.fspath(value))
    if not path.lower().endswith(".csv"):
        raise _fail(name, "a path ending in .csv", value)
    process, count = process_index_and_count()
    folder = os.path.dirname(path.replace(RANK_FIELD, str(process)))
    if not os.path.isdir(folder):
        raise _fail(name, f"a path in an existing folder ({folder} does not exist)", value)
    if not os.access(folder, os.W_OK):
        raise _fail(name, f"a path in a writable folder ({folder} is not writable)", value)
    if RANK_FIELD not in path and count == 1 and os.path.lexists(path):
        raise FileExistsError(
            f"Expected `{name}` to be a new file: MemWatch never overwrites a "
            f"log. Received: {name}={value!r}, which exists. Delete it or "
            "choose another path."
        )
    return path
