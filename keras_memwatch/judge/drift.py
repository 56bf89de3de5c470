"""Drift: steady growth of a spike detector's baseline over an epoch or
across epochs, which is what a leak looks like."""

from __future__ import annotations

from collections import deque
from typing import Optional

import numpy as np

from keras_memwatch import options
from keras_memwatch.judge.detector import RollingMedian
from keras_memwatch.judge.events import DriftEvent, RiseEvent
from keras_memwatch.units import MIB

__all__ = ["DriftMonitor"]

_INF = float("inf")


class DriftMonitor:
    """Reports steady growth of the baseline, within an epoch or across epochs.

    Feed it the baseline after every sample (`SpikeDetector.baseline`) and
    call `end_epoch()` at the end of each epoch. Growth is a leak when it
    is both large and steady; one rule is used at both scales:

    - within the epoch: the baseline grew by more than `min_delta_mb` MiB
      from the epoch's first baseline to its last, it grew in each quarter
      of the epoch by at least an eighth of that growth, and no quarter and
      no single step between consecutive samples makes up more than half
      of it (an epoch needs at least 8 samples to be judged alone);
    - across epochs (checked when the epoch alone is not a leak): over the
      last 3 epochs the baseline rose in each of them (the first one from
      its start to its end, then from one epoch's end to the next), the
      total rise exceeds `min_delta_mb` MiB, and no single epoch makes up
      more than half of it.

    So one jump to a new level, say from a new input shape, is not a leak,
    even when it stays, nor is the ramp a rolling median makes of it; it is
    kept in `rises` (a `RiseEvent`) instead. The same jump repeated epoch
    after epoch is a leak. Slow growth under `min_delta_mb` per epoch is
    caught once it adds up over 3 epochs. While a leak goes on, it is
    reported once per epoch.

    Args:
        min_delta_mb: Growth, in MiB, that a leak exceeds. Defaults to `64`.
        smooth: When set, each value is first replaced by the rolling
            median of the last `smooth` values, so that raw readings (an
            allocator's sawtooth) can be fed in. Defaults to `None`.

    Raises:
        TypeError: When `min_delta_mb` is not a number (bools are not).
        ValueError: When `min_delta_mb` is negative or not finite.

    Example:

    >>> drift = DriftMonitor(min_delta_mb=64)
    >>> for i in range(300):
    ...     drift.update((190 + i * 230 / 299) * 2**20)
    >>> drift.end_epoch().message
    'baseline grew from 190 MiB to 420 MiB over 300 batches'
    """

    #: Number of epochs that the across-epochs rule looks back over.
    EPOCHS = 3

    def __init__(self, min_delta_mb: float = 64, smooth: Optional[int] = None) -> None:
        self._min_delta_mb = options.non_negative("min_delta_mb", min_delta_mb)
        self._min_delta = self._min_delta_mb * MIB
        self._smooth = smooth
        self._history: deque = deque(maxlen=self.EPOCHS)
        self.reset()

    @property
    def min_delta_mb(self) -> float:
        """Growth, in MiB, that a leak exceeds."""
        return self._min_delta_mb

    def _start_epoch(self) -> None:
        self._values: list[float] = []

    def reset(self) -> None:
        """Forgets the current epoch and the epochs before it."""
        self._history.clear()
        self.rises: list[RiseEvent] = []
        self._level = None if self._smooth is None else RollingMedian(self._smooth)
        self._start_epoch()

    def update(self, baseline_bytes: Optional[float]) -> None:
        """Records the baseline after one sample.

        Args:
            baseline_bytes: The baseline in bytes; `None` or NaN (during
                warm-up, or when missing) is ignored.
        """
        if baseline_bytes is None or not (-_INF < baseline_bytes < _INF):
            return
        if self._level is not None:
            baseline_bytes = self._level.push(baseline_bytes)
        self._values.append(baseline_bytes)

    def update_many(self, baselines_bytes: np.ndarray) -> None:
        """`update` of each value in turn (none missing)."""
        if self._level is not None:
            baselines_bytes = self._level.push_many(baselines_bytes)
        self._values.extend(baselines_bytes.tolist())

    def end_epoch(self) -> Optional[DriftEvent]:
        """Closes the epoch and says whether the baseline drifted.

        Returns:
            A `DriftEvent` when the baseline grew steadily within this
            epoch, or else over the last 3 epochs; None otherwise, and for
            an epoch that had no baseline at all. A one-off rise of the
            epoch is added to `rises`.
        """
        values = self._values
        self._start_epoch()
        if not values:
            return None
        first, last = values[0], values[-1]
        self._history.append((first, last, len(values)))

        growth = last - first
        if growth > self._min_delta:
            if _steady(values, growth):
                return DriftEvent(first, last, len(values))
            self.rises.append(RiseEvent(first, last, len(values)))

        if len(self._history) < self.EPOCHS:
            return None
        epochs = list(self._history)
        rises = [epochs[0][1] - epochs[0][0]]
        rises += [b[1] - a[1] for a, b in zip(epochs, epochs[1:])]
        total = epochs[-1][1] - epochs[0][0]
        steady = min(rises) > 0 and max(rises) <= total / 2
        if steady and total > self._min_delta:
            return DriftEvent(
                epochs[0][0],
                epochs[-1][1],
                sum(e[2] for e in epochs),
                n_epochs=len(epochs),
            )
        return None


def _steady(values: list[float], growth: float) -> bool:
    """Whether `growth` of `values` is spread over the whole series."""
    n = len(values)
    if n < 8:
        return False
    steps = max(b - a for a, b in zip(values, values[1:]))
    ends = [values[round(k * (n - 1) / 4)] for k in range(5)]
    quarters = [b - a for a, b in zip(ends, ends[1:])]
    return (steps <= growth / 2 and max(quarters) <= growth / 2
            and min(quarters) >= growth / 8)
