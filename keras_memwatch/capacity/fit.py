"""The line through (batch size, working memory), and what it predicts."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Optional

from keras_memwatch.units import format_bytes

MAX_RESIDUAL = 0.10  # of the largest measurement


@dataclasses.dataclass(frozen=True)
class LinearFit:
    """A least-squares line through (batch size, working bytes).

    Attributes:
        static_bytes: the intercept: working memory that does not grow
            with the batch.
        per_sample_bytes: the slope.
        residual: the largest distance of a measurement from the line, as
            a fraction of the largest measurement.
        r_squared: the coefficient of determination.
        batch_sizes: the sizes the line was fitted to.
        linear: whether the line is trusted for extrapolation.
        reason: why not, when it is not.

    The intercept may come out below zero (the line crosses zero above
    batch 0) by as much as the tolerance of the largest measurement; users
    of the line take the constant part as `constant_bytes`, never below 0.
    """

    static_bytes: float
    per_sample_bytes: float
    residual: float
    r_squared: float
    batch_sizes: tuple[int, ...]
    linear: bool
    reason: Optional[str] = None

    @property
    def constant_bytes(self) -> float:
        """The constant part of a step, never below 0 (NaN without a fit)."""
        if self.static_bytes != self.static_bytes:
            return self.static_bytes
        return max(self.static_bytes, 0.0)


def line_through(points: Sequence[tuple[int, int]]) -> LinearFit:
    """The least-squares line through `(batch_size, working_bytes)` points.

    Args:
        points: two or more points, at distinct batch sizes.

    Returns:
        A `LinearFit`, not judged (`linear` is `True`).
    """
    import numpy as np

    b = np.array([p[0] for p in points], dtype=np.float64)
    w = np.array([p[1] for p in points], dtype=np.float64)
    slope, intercept = np.polyfit(b, w, 1)
    predicted = intercept + slope * b
    scale = max(float(np.abs(w).max()), 1.0)
    residual = float(np.abs(w - predicted).max()) / scale
    total = float(((w - w.mean()) ** 2).sum())
    r2 = 1.0 - float(((w - predicted) ** 2).sum()) / total if total > 0 else 0.0
    return LinearFit(float(intercept), float(slope), residual, r2,
                     tuple(int(x) for x in b), True)


def _flaw(fit: LinearFit, points: Sequence[tuple[int, int]],
          tolerance: float) -> Optional[str]:
    """Why `fit` cannot be trusted for extrapolation, or `None`."""
    if fit.per_sample_bytes <= 0:
        first, last = points[0], points[-1]
        return (f"the working memory does not grow with the batch size "
                f"({format_bytes(first[1])} at batch {first[0]}, "
                f"{format_bytes(last[1])} at batch {last[0]})")
    if fit.residual > tolerance:
        return (f"the working memory is not linear in the batch size (a "
                f"measurement lies {fit.residual:.0%} of the largest one off the "
                f"line, more than {tolerance:.0%})")
    largest = max((w for _, w in points), default=0)
    if fit.static_bytes < -tolerance * max(largest, 1):
        crossing = -fit.static_bytes / fit.per_sample_bytes
        return (f"the line through the measurements reaches zero only at batch "
                f"{crossing:.0f}, so the smaller sizes were measured below what "
                "they need (the step reused memory the process already held) and "
                "the line cannot be extrapolated")
    # Extrapolation is what the line is for: the line through all but the
    # largest size must predict the largest.
    held = line_through(points[:-1]) if len(points) > 3 else None
    if held is None:
        (b1, w1), (b2, w2) = points[-3], points[-2]
        slope = (w2 - w1) / (b2 - b1)
        intercept = w1 - slope * b1
    else:
        slope, intercept = held.per_sample_bytes, held.static_bytes
    batch, working = points[-1]
    miss = abs(intercept + slope * batch - working) / max(working, 1)
    if miss > tolerance:
        return (f"the working memory is not linear in the batch size: the line "
                f"through the smaller sizes misses batch {batch} by {miss:.0%}, "
                f"more than {tolerance:.0%}")
    return None


def fit_linear(points: Sequence[tuple[int, int]],
               tolerance: float = MAX_RESIDUAL) -> LinearFit:
    """Fits working memory = static + per_sample x batch, and judges the fit.

    The line is fitted to all points; when it does not fit, the smallest
    batch sizes are dropped one by one (down to three points), since a
    constant part (gradients of the weights, workspaces) may dominate them.

    Args:
        points: `(batch_size, working_bytes)` pairs, at three or more
            distinct batch sizes.
        tolerance: the largest distance of a point from the line, as a
            fraction of the largest measurement. Defaults to `0.1`.

    Returns:
        A `LinearFit`; `linear` is `False` (with a `reason`) when fewer than
        three sizes were measured, when memory does not grow with the batch,
        when a point lies off the line by more than `tolerance`, or when
        the line through all sizes but the largest misses the largest by
        more than `tolerance` of it (the test of extrapolation).

    Example:

    >>> fit = fit_linear([(2, 1200), (4, 1400), (8, 1800)])
    >>> round(fit.static_bytes), round(fit.per_sample_bytes), fit.linear
    (1000, 100, True)
    """
    by_size: dict[int, list[int]] = {}
    for batch, working in points:
        by_size.setdefault(int(batch), []).append(int(working))
    pts = sorted((b, round(sum(ws) / len(ws))) for b, ws in by_size.items())
    if len(pts) < 3:
        return LinearFit(math.nan, math.nan, math.nan, math.nan,
                         tuple(b for b, _ in pts), False,
                         f"only {len(pts)} batch size(s) measured; a line needs three")
    first = line_through(pts)
    first_flaw = _flaw(first, pts, tolerance)
    if first_flaw is None:
        return first
    for start in range(1, len(pts) - 2):
        fit = line_through(pts[start:])
        if _flaw(fit, pts[start:], tolerance) is None:
            return fit
    return dataclasses.replace(first, linear=False, reason=first_flaw)


def predict_batch_size(limit_bytes: int, headroom: float, static_bytes: float,
                       per_sample_bytes: float) -> int:
    """The largest batch under the limit less the headroom, by the line.

    Args:
        limit_bytes: the device's limit.
        headroom: the fraction of the limit to keep free.
        static_bytes: the memory that does not grow with the batch.
        per_sample_bytes: the memory of one more sample.

    Returns:
        `floor((limit x (1 - headroom) - static) / per_sample)`, at least 0.

    Raises:
        ValueError: for `per_sample_bytes` that is not positive.
    """
    if per_sample_bytes <= 0:
        raise ValueError(
            f"Expected `per_sample_bytes` > 0. Received: {per_sample_bytes!r}")
    room = limit_bytes * (1.0 - headroom) - static_bytes
    return max(int(math.floor(room / per_sample_bytes)), 0)
