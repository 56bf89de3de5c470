"""Recognising out-of-memory errors, without importing any framework.

TensorFlow's `ResourceExhaustedError`, PyTorch's `OutOfMemoryError` (and the
plain `RuntimeError`s older PyTorch and its CPU allocator raise: "CUDA out of
memory", "DefaultCPUAllocator: can't allocate memory"), JAX's
`JaxRuntimeError` / `XlaRuntimeError` with `RESOURCE_EXHAUSTED`, and Python's
own `MemoryError`; the chain of causes (`__cause__`, `__context__`) is
searched too, for errors wrapped on the way out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Optional

__all__ = ["allocation_lines", "device_ran_out", "error_text", "first_line",
           "is_oom_error", "requested_bytes"]

#: Exception classes (by name, anywhere in the class's MRO) that always
#: mean out of memory.
OOM_TYPE_NAMES = frozenset(
    {"ResourceExhaustedError", "OutOfMemoryError", "MemoryError"})
#: Runtime errors that mean out of memory when their message says so.
_OOM_MESSAGE = re.compile(
    r"RESOURCE_EXHAUSTED|out of memory|OOM when allocating|"
    r"can't allocate memory|not enough memory",
    re.IGNORECASE,
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Sentences of an error message that say what was allocated, and where.
_ALLOCATION_TEXT = re.compile(
    r"allocat|out of memory|resource_exhausted|capacity|in use|reserved|"
    r"free|peak buffers|size:|shape:|bytes",
    re.IGNORECASE,
)
_UNITS = {"B": 1, "BYTES": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_TF_DTYPE_BYTES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1,
                   "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1,
                   "complex64": 8, "complex128": 16}
_MAX_LINES = 20
MAX_LINE = 400


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error, then its causes and contexts, each once."""
    seen: set[int] = set()
    todo = [error]
    while todo and len(seen) < 16:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(c for c in (e.__cause__, e.__context__) if c is not None)


def is_oom_error(error: BaseException) -> bool:
    """Whether an exception means the framework (or Python) ran out of memory.

    No framework is imported: classes are recognised by name and messages
    by their text, along the chain of causes.

    Args:
        error: any exception.

    Returns:
        `True` for TensorFlow's `ResourceExhaustedError`, PyTorch's
        `OutOfMemoryError`, `MemoryError`, and runtime errors (JAX's
        `JaxRuntimeError`/`XlaRuntimeError`, PyTorch's `RuntimeError`)
        whose message says `RESOURCE_EXHAUSTED` or out of memory.

    Example:

    >>> is_oom_error(MemoryError())
    True
    >>> is_oom_error(ValueError("RESOURCE_EXHAUSTED"))
    False
    """
    for e in _chain(error):
        names = {cls.__name__ for cls in type(e).__mro__}
        if names & OOM_TYPE_NAMES:
            return True
        if isinstance(e, RuntimeError) and _OOM_MESSAGE.search(error_text(e)):
            return True
    return False


def error_text(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # a broken __str__ must not hide the report
        text = ""
    return _ANSI.sub("", text)


def first_line(error: BaseException) -> str:
    """The first line of the error's message, at most `MAX_LINE` long."""
    lines = error_text(error).strip().splitlines()
    return lines[0][:MAX_LINE] if lines else ""


def allocation_lines(error: BaseException) -> list[str]:
    """What the framework's message says was being allocated, and where.

    Args:
        error: the out-of-memory exception.

    Returns:
        The sentences of the messages along the chain of causes that speak
        of allocations, capacity, memory in use or buffers (PyTorch's
        "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of ...",
        XLA's "Out of memory while trying to allocate N bytes." and its
        peak-buffer list, TensorFlow's "OOM when allocating tensor with
        shape[...]"), each once, at most 20.
    """
    out: list[str] = []
    for e in _chain(error):
        for line in error_text(e).splitlines():
            for sentence in re.split(r"(?<=\.)\s+(?=[A-Z])", line.strip()):
                sentence = sentence.strip()
                if not sentence or not _ALLOCATION_TEXT.search(sentence):
                    continue
                if len(sentence) > MAX_LINE:
                    sentence = sentence[: MAX_LINE - 3] + "..."
                if sentence not in out:
                    out.append(sentence)
                if len(out) >= _MAX_LINES:
                    return out
    return out


def _bytes(number: str, unit: str) -> Optional[int]:
    scale = _UNITS.get(unit.upper())
    return None if scale is None else int(round(float(number) * scale))


def requested_bytes(error: BaseException) -> Optional[int]:
    """The size of the allocation that failed, where the message gives it.

    Args:
        error: the out-of-memory exception.

    Returns:
        Bytes, or `None` when no message along the chain of causes states
        a size.

    Example:

    >>> requested_bytes(MemoryError("Tried to allocate 2.00 GiB"))
    2147483648
    """
    for e in _chain(error):
        text = error_text(e)
        match = re.search(
            r"(?:tried|trying) to allocate\s+([\d.]+)\s*([KMGT]?i?B|bytes)\b",
            text, re.IGNORECASE)
        if match is None:
            match = re.search(r"allocating\s+([\d.]+)\s*(bytes|[KMGT]?i?B)\b", text,
                              re.IGNORECASE)
        if match is not None:
            size = _bytes(match.group(1), match.group(2))
            if size is not None:
                return size
        match = re.search(r"when allocating tensor with shape\s*\[([\d,\s]*)\]\s*"
                          r"and type\s+(\w+)", text, re.IGNORECASE)
        if match is not None and match.group(2).lower() in _TF_DTYPE_BYTES:
            dims = [int(d) for d in match.group(1).replace(" ", "").split(",") if d]
            return math.prod(dims) * _TF_DTYPE_BYTES[match.group(2).lower()]
    return None


def device_ran_out(error: BaseException) -> bool:
    """Whether the device had less free than the allocation that failed.

    PyTorch's message says what it tried to allocate and what the device had
    free ("Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19
    GiB of which 1.06 GiB is free", or before PyTorch 2.1 "(GPU 0; ... 47.06
    MiB free; ...)"). In a process under a cap
    (`set_per_process_memory_fraction`) that the device has room for, this
    means other processes held the device: the failure says nothing of what
    fits under the cap. (Without a cap, a process that filled the device
    itself reads `True` too.)

    Args:
        error: the out-of-memory exception.

    Returns:
        `True` where a message along the chain of causes gives both sizes
        and the free one is the smaller; `False` otherwise.

    Example:

    >>> device_ran_out(MemoryError("Tried to allocate 2.00 GiB. GPU 0 has a "
    ...     "total capacity of 79.19 GiB of which 1.06 GiB is free."))
    True
    """
    requested = requested_bytes(error)
    if requested is None:
        return False
    for e in _chain(error):
        match = re.search(r"of which\s+([\d.]+)\s*([KMGT]?i?B|bytes) is free|"
                          r";\s*([\d.]+)\s*([KMGT]?i?B|bytes) free;",
                          error_text(e), re.IGNORECASE)
        if match is not None:
            number, unit = (match.group(1), match.group(2)) if match.group(1) else (
                match.group(3), match.group(4))
            free = _bytes(number, unit)
            if free is not None:
                return free < requested
    return False
