"""The time an estimate may take (`max_seconds=`), and what fits in what is left."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Optional

__all__ = ["Deadline", "expected_seconds"]


class Deadline:
    """A point in `time.perf_counter()` time, or none.

    Args:
        max_seconds: seconds from `began`, or `None` for no limit.
        began: `time.perf_counter()` when the estimate began. Defaults to
            `None`: now.
    """

    def __init__(self, max_seconds: Optional[float], began: Optional[float] = None):
        self.max_seconds = max_seconds
        self.began = time.perf_counter() if began is None else began
        self.at = None if max_seconds is None else self.began + max_seconds

    def left(self) -> float:
        """Seconds left (infinite without a limit; negative once passed)."""
        return math.inf if self.at is None else self.at - time.perf_counter()

    @property
    def passed(self) -> bool:
        return self.left() <= 0

    def allows(self, seconds: float) -> bool:
        """Whether work expected to take `seconds` ends before the deadline."""
        return seconds <= self.left()

    def spent(self) -> float:
        """Seconds since the estimate began."""
        return time.perf_counter() - self.began


def expected_seconds(rounds: Sequence[tuple[str, list[int], float]], kind: str,
                     sizes: Sequence[int], side_by_side: bool) -> float:
    """Seconds a round of `kind` asking `sizes` is expected to take, from the
    wall time of the `(kind, sizes, seconds)` rounds before it (setting up
    included). Compilations side by side (`side_by_side`) take as long as
    the slowest round of their kind (a first check as `fit` compiles it,
    twice the slowest before it); steps, one size after another, in
    proportion to the batch."""
    pool = [r for r in rounds if r[0] == kind]
    scale = 2.0 if not pool and kind == "check" and side_by_side else 1.0
    pool = pool or list(rounds)
    if not pool:
        return 0.0
    if side_by_side:
        return scale * max(seconds for _, _, seconds in pool)
    return scale * sum(max(seconds / len(asked) * max(b / max(asked), 1.0)
                           for _, asked, seconds in pool) for b in sizes)
