"""Streaming spike detection.

`SpikeDetector` judges each sampled peak against a robust rolling baseline
(a `RollingMedian`) and says whether it is a spike; `judge.drift` watches
that baseline for leaks. Both take a value at a time or a block at once
(`update_many`, in numpy), and know nothing of Keras; the spike monitor
keeps one of each per device and serializes calls to them (they are not
thread-safe on their own).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from typing import NamedTuple, Optional

import numpy as np
from numpy.lib.stride_tricks import as_strided

from keras_memwatch import options
from keras_memwatch.units import MIB

__all__ = ["RollingMedian", "SpikeDetector", "SpikeSettings"]

_INF = float("inf")

# Runs of up to this many spike samples are never taken for a new level.
_MAX_ISOLATED_SPIKE = 3


def _median(sorted_values: list) -> float:
    n = len(sorted_values)
    m = n >> 1
    if n & 1:
        return sorted_values[m]
    return (sorted_values[m - 1] + sorted_values[m]) / 2


def _medians(values: np.ndarray, w: int) -> np.ndarray:
    """The median of each run of `w` consecutive values (float64)."""
    runs = as_strided(values, (len(values) - w + 1, w), values.strides * 2,
                      writeable=False)
    m = w >> 1
    if w & 1:
        return np.partition(runs, m, axis=1)[:, m]
    middle = np.partition(runs, (m - 1, m), axis=1)
    return (middle[:, m - 1] + middle[:, m]) / 2


def _keep_last(window: deque, values: list, w: int) -> None:
    """Appends `values` to `window`, keeping its last `w`."""
    if len(values) >= w:
        window.clear()
        window.extend(values[-w:])
        return
    window.extend(values)
    for _ in range(len(window) - w):
        window.popleft()


class RollingMedian:
    """The median of the last `window` values: a sorted copy of the window,
    kept up to date with one O(window) memmove per push.

    Args:
        window: how many values the median is taken over.
    """

    __slots__ = ("window", "values", "_sorted")

    def __init__(self, window: int) -> None:
        self.window = options.positive_int("window", window)
        self.values: deque = deque()  # in the order pushed
        self._sorted: list = []

    def __len__(self) -> int:
        return len(self.values)

    @property
    def full(self) -> bool:
        return len(self.values) == self.window

    @property
    def median(self) -> float:
        """The median of the window (which must not be empty)."""
        return _median(self._sorted)

    def push(self, value: float) -> float:
        """Adds a value; returns the median of the window."""
        ordered = self._sorted
        if len(self.values) == self.window:
            del ordered[bisect_left(ordered, self.values.popleft())]
        self.values.append(value)
        insort(ordered, value)
        return _median(ordered)

    def medians_before(self, values: np.ndarray) -> np.ndarray:
        """For a full window, the median the window would have before each
        of `values` were they pushed in turn (nothing is pushed)."""
        w = self.window
        return _medians(np.concatenate([np.fromiter(self.values, float, w),
                                        values[:-1]]), w)

    def extend(self, values: list) -> None:
        """Pushes every value, at once."""
        _keep_last(self.values, values, self.window)
        self._sorted[:] = sorted(self.values)

    def replace(self, values: list) -> None:
        """Forgets the window; it holds `values` (at most `window`) instead."""
        self.values.clear()
        self.extend(values)

    def clear(self) -> None:
        self.values.clear()
        self._sorted.clear()

    def push_many(self, values: np.ndarray) -> np.ndarray:
        """`push` of each value in turn; returns the medians after each."""
        out = np.empty(len(values))
        i = 0
        while i < len(values) and not self.full:
            out[i] = self.push(values[i].item())
            i += 1
        if i < len(values):
            w = self.window
            out[i:] = _medians(np.concatenate([np.fromiter(self.values, float, w),
                                               values[i:]])[1:], w)
            self.extend(values[i:].tolist())
        return out


class SpikeSettings(NamedTuple):
    """The options of spike detection, checked: what `SpikeDetector` takes."""

    window: int
    threshold: float
    min_delta_mb: float
    warmup: int

    @classmethod
    def checked(cls, window: object, threshold: object, min_delta_mb: object,
                warmup: object) -> "SpikeSettings":
        """The settings, each checked (see `SpikeDetector` for their meaning).

        Raises:
            TypeError: for an argument of the wrong type (bools are not
                numbers here).
            ValueError: for an argument out of range.
        """
        return cls(options.positive_int("window", window),
                   options.number_above("threshold", threshold, 1),
                   options.non_negative("min_delta_mb", min_delta_mb),
                   options.non_negative_int("warmup", warmup))


class SpikeDetector:
    """Flags values that jump well above a robust rolling baseline.

    The baseline is the median of the last `window` values that were not
    spikes. A value is a spike when it exceeds both `baseline * threshold`
    and `baseline + min_delta_mb` MiB; the first `warmup` values only seed
    the baseline. Spikes are kept out of the baseline, so a run of spikes
    cannot raise it and hide the next one: isolated spikes are flagged every
    time, however often they repeat.

    A new level is different from a spike: when memory settles higher (a new
    input shape, a new compiled function), flagging every batch from then on
    would be noise. The detector follows a run of elevated samples: it
    starts at a spike and goes on while each later sample is a spike or at
    least closer to the run's lowest spike than to the baseline. Once the
    run is `plateau_length` samples long and its last `plateau_length`
    samples agree with each other (the largest is not a spike against their
    median), they become the baseline window and the level is no longer
    flagged. So a new level is flagged for at most
    `plateau_length = min(window, max(warmup, 4))` samples, and a run of
    elevated samples that never agree is accepted whole after `window`
    samples: no new level is flagged more than `window` times. Spikes of 1
    to 3 samples are never taken for a level (the minimum of 4 is for them;
    it needs `window >= 4`); a burst longer than `plateau_length` is flagged for its first
    `plateau_length` samples only. A level that falls (including the end of
    such a burst) is followed by the median itself: after a burst of `L`
    samples the baseline is back once about `min(L, window / 2) + 1` normal
    samples have followed.

    Missing values (`None`, NaN, infinities) are not judged: `update`
    returns False and nothing changes, warm-up included.

    Args:
        window: Number of recent non-spike values whose median is the
            baseline. Defaults to `50`.
        threshold: A spike exceeds `baseline * threshold`; must be greater
            than 1. Defaults to `1.5`.
        min_delta_mb: A spike also exceeds the baseline by more than this
            many MiB (2**20 bytes), so that small models do not flag
            every few-MiB jump. Defaults to `64`.
        warmup: Number of first values that seed the baseline without being
            judged. The very first value is never judged, even with
            `warmup=0`, since there is nothing to judge it against.
            Defaults to `5`.

    Raises:
        TypeError: When an argument has the wrong type (bools are not
            numbers here).
        ValueError: When an argument is out of range.

    Example:

    ```pycon
    >>> detector = SpikeDetector(window=50, threshold=1.5, min_delta_mb=64)
    >>> peaks_mib = [200, 210, 190, 205, 200, 1300]
    >>> [detector.update(mib * 2**20) for mib in peaks_mib]
    [False, False, False, False, False, True]
    >>> detector.baseline / 2**20
    200.0

    ```
    """

    __slots__ = (
        "_window_size",
        "_threshold",
        "_min_delta_mb",
        "_min_delta",
        "_warmup",
        "_plateau",
        "_window",
        "_warm_left",
        "_baseline",
        "_run",
        "_run_floor",
    )

    def __init__(
        self,
        window: int = 50,
        threshold: float = 1.5,
        min_delta_mb: float = 64,
        warmup: int = 5,
    ) -> None:
        self._apply(SpikeSettings.checked(window, threshold, min_delta_mb, warmup))

    @classmethod
    def from_settings(cls, settings: "SpikeSettings") -> "SpikeDetector":
        """A detector of settings checked already (one per device and phase)."""
        detector = cls.__new__(cls)
        detector._apply(settings)
        return detector

    def _apply(self, settings: "SpikeSettings") -> None:
        self._window_size, self._threshold = settings.window, settings.threshold
        self._min_delta_mb, self._warmup = settings.min_delta_mb, settings.warmup
        self._min_delta = self._min_delta_mb * MIB
        self._plateau = min(
            self._window_size, max(self._warmup, _MAX_ISOLATED_SPIKE + 1)
        )
        self._window = RollingMedian(self._window_size)
        self._run: list = []
        self.reset()

    @property
    def window(self) -> int:
        """Number of non-spike values the baseline is the median of."""
        return self._window_size

    @property
    def threshold(self) -> float:
        """Ratio to the baseline that a spike exceeds."""
        return self._threshold

    @property
    def min_delta_mb(self) -> float:
        """MiB above the baseline that a spike exceeds."""
        return self._min_delta_mb

    @property
    def warmup(self) -> int:
        """Number of first values that are recorded but not judged."""
        return self._warmup

    @property
    def plateau_length(self) -> int:
        """Most times a new, steady level is flagged before it is accepted.

        `min(window, max(warmup, 4))`.
        """
        return self._plateau

    @property
    def warming_up(self) -> bool:
        """Whether the next value only seeds the baseline (is not judged)."""
        return self._warm_left > 0

    @property
    def baseline(self) -> Optional[float]:
        """The baseline in bytes that the last judged value was compared to.

        `None` until the first value is judged (during warm-up) and after
        `reset()`. Missing values leave it unchanged.
        """
        return self._baseline

    def reset(self) -> None:
        """Forgets everything: the next value starts a new warm-up."""
        self._window.clear()
        self._run.clear()
        self._run_floor = _INF
        self._warm_left = max(self._warmup, 1)
        self._baseline: Optional[float] = None

    def update(self, value_bytes: Optional[float]) -> bool:
        """Judges one value against the baseline, then records it.

        Args:
            value_bytes: The sampled value in bytes (usually the peak since
                the previous sample). `None`, NaN or an infinity is a
                missing value.

        Returns:
            True when the value is a spike, False otherwise (warm-up and
            missing values included).
        """
        if value_bytes is None or not (-_INF < value_bytes < _INF):
            return False
        window = self._window
        if self._warm_left:
            self._warm_left -= 1
            window.push(value_bytes)
            return False

        baseline = self._baseline = window.median

        if self.exceeds(value_bytes, baseline):
            run = self._run
            run.append(value_bytes)
            if value_bytes < self._run_floor:
                self._run_floor = value_bytes
            if len(run) >= self._plateau:
                self._maybe_accept_level()
            return True

        window.push(value_bytes)  # not a spike: into the baseline window
        run = self._run
        if run:
            if value_bytes + value_bytes > baseline + self._run_floor:
                # Closer to the run's level than to the baseline: the
                # elevated run goes on.
                run.append(value_bytes)
                if len(run) >= self._plateau:
                    self._maybe_accept_level()
            else:
                run.clear()
                self._run_floor = _INF
        return False

    def update_many(self, values_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`update` of each value in turn, a block at a time.

        While nothing is out of the ordinary (the window full, no elevated
        run, no spike) the block is judged at once: each value's baseline is
        the median of the window as it stood before it, every value joins
        the window. From the first spike on, values go through `update` one
        by one until the detector is back to ordinary.

        Args:
            values_bytes: the values, none missing.

        Returns:
            `(spikes, baselines)`: what `update` returned for each value, and
            `baseline` after it (NaN where None).
        """
        values = np.asarray(values_bytes)
        n = len(values)
        spikes = np.zeros(n, bool)
        baselines = np.full(n, np.nan)
        i = 0
        while i < n:
            ordinary = 0
            if not self._warm_left and not self._run and self._window.full:
                ordinary = self._push_ordinary(values[i:], baselines[i:])
            if not ordinary:
                spikes[i] = self.update(values[i].item())
                if self._baseline is not None:
                    baselines[i] = self._baseline
                ordinary = 1
            i += ordinary
        return spikes, baselines

    def _push_ordinary(self, values: np.ndarray, baselines: np.ndarray) -> int:
        """Judges the leading values that are no spike against a full window
        and pushes them; returns how many."""
        medians = self._window.medians_before(values)
        over = (values > medians * self._threshold) & (values > medians + self._min_delta)
        n = int(over.argmax()) if over.any() else len(values)
        if n:
            baselines[:n] = medians[:n]
            self._baseline = medians[n - 1].item()
            self._window.extend(values[:n].tolist())
        return n

    def exceeds(self, value_bytes: float, baseline_bytes: float) -> bool:
        """Whether a value is a spike against a baseline, by this detector's
        `threshold` and `min_delta_mb`."""
        return (value_bytes > baseline_bytes * self._threshold
                and value_bytes > baseline_bytes + self._min_delta)

    def _maybe_accept_level(self) -> None:
        """Makes the current run the baseline when it looks like a level."""
        run = self._run
        recent = run[-self._plateau :]
        ordered = sorted(recent)
        median = _median(ordered)
        top = ordered[-1]
        if not self.exceeds(top, median):
            seed = recent
        elif len(run) >= self._window_size:
            seed = run[-self._window_size :]
        else:
            return
        self._window.replace(seed)
        run.clear()
        self._run_floor = _INF

    def __repr__(self) -> str:
        return (
            f"SpikeDetector(window={self._window_size}, "
            f"threshold={self._threshold:g}, "
            f"min_delta_mb={self._min_delta_mb:g}, warmup={self._warmup})"
        )
