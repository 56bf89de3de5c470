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
                     sizes: Sequence[int], side_by_side: bool,
                     in_turn: bool = False) -> float:
    """Seconds a round of `kind` asking `sizes` is expected to take, from the
    wall time of the `(kind, sizes, seconds)` rounds before it (setting up
    included). Compilations side by side (`side_by_side`) take as long as
    the slowest round of their kind (a first check as `fit` compiles it,
    twice the slowest before it). Checks compiled one after another
    (`in_turn`, with `side_by_side`) take that for each size or, after a
    round of them, the slowest one's seconds a size. Steps, one size
    after another, take as long as a size of the round that asked the
    largest batch, and in proportion to the batch above it. A round's time
    holds a share that does not grow with the batch (the first step at a
    new shape), so the largest batch timed bounds a larger one most
    closely: a small one scaled up would count that share many times
    over."""
    pool = [r for r in rounds if r[0] == kind]
    first = not pool
    scale = 2.0 if first and kind == "check" and side_by_side else 1.0
    pool = pool or list(rounds)
    if not pool:
        return 0.0
    if side_by_side:
        if in_turn and not first:
            one = max(seconds / len(asked) for _, asked, seconds in pool)
        else:
            one = scale * max(seconds for _, _, seconds in pool)
        return one * (len(sizes) if in_turn else 1)
    top = max(max(asked) for _, asked, _ in pool)
    per_size = max(seconds / len(asked) for _, asked, seconds in pool
                   if max(asked) == top)
    return scale * sum(per_size * max(b / top, 1.0) for b in sizes)
