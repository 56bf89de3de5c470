"""The time an estimate may take (`max_seconds=`), and what fits in what is left."""

from __future__ import annotations

import math
import time
from typing import Optional

__all__ = ["Deadline"]


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
