"""glibc's heap, made to follow the live arrays while the host is measured.

glibc serves a large block from its heap or maps it apart, at a threshold
that rises with each mapped block freed (up to 32 MiB on 64-bit Linux).
After a few steps the blocks a step frees stay in the heap, resident, and a
step's peak resident set depends on which of them happen to be free. With
the threshold fixed low, each large block is mapped apart and handed back
when freed, and the peak follows the step's live arrays (docs/capacity.md,
"The host's heap").
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator
from typing import Optional

__all__ = ["heap_follows_arrays", "trim_host_heap"]

#: `mallopt`'s parameter for the size above which a block is mapped apart.
M_MMAP_THRESHOLD = -3
#: The threshold while measuring: glibc's own starting value is 128 KiB.
MEASURING_THRESHOLD = 64 * 2**10
#: The threshold left afterwards. glibc has no way back to its moving
#: threshold, so it is left where that one ends: its 64-bit ceiling.
LEFT_THRESHOLD = 32 * 2**20

_depth = 0  # nested uses
_fixed = False  # whether the outermost set the threshold


def _libc() -> Optional[ctypes.CDLL]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, say)
        return None


def trim_host_heap() -> None:
    """Hands freed glibc heap memory back to the system (Linux only)."""
    try:
        libc = _libc()
        if libc is not None:
            libc.malloc_trim(0)
    except AttributeError:  # a libc without `malloc_trim`
        pass


def _set_threshold(libc: Optional[ctypes.CDLL], value: int) -> bool:
    try:
        return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, value))
    except AttributeError:  # a libc without `mallopt`
        return False


@contextlib.contextmanager
def heap_follows_arrays() -> Iterator[bool]:
    """Within it, glibc maps each block above 64 KiB apart and hands it back
    when freed, so that the resident set follows the live arrays.

    Afterwards the threshold stays fixed at 32 MiB, the ceiling of glibc's
    own moving threshold. Nested uses keep the outermost's. Yields whether
    the threshold could be set (glibc on Linux).
    """
    global _depth, _fixed
    libc = _libc()
    if _depth == 0:
        _fixed = _set_threshold(libc, MEASURING_THRESHOLD)
    _depth += 1
    try:
        yield _fixed
    finally:
        _depth -= 1
        if _depth == 0 and _fixed:
            _set_threshold(libc, LEFT_THRESHOLD)
