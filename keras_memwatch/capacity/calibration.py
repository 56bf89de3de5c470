"""Quick plans read through plans compiled as `fit` compiles them (JAX).

A quick plan (`evidence.AIMED`: no autotuning, cheaper code generation)
is made in less time than a plan as `fit` compiles it, and its buffers
are mostly the same (docs/capacity.md); where a model's are not, alone
it would aim off.
Where both kinds were compiled, their ratio at that size says how far the
quick plans are off there: `calibrated` scales every quick plan by the
ratio at its size (interpolated between sizes where both are known, the
nearest ratio beyond), so that the search aims at where the plans as
`fit` compiles them would cross the room. The record's answers never read
these scaled plans: only the plans as `fit` compiles them decide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

from keras_memwatch.capacity.evidence import AIMED, PLAN, Evidence, Observation

__all__ = ["calibrated", "ratios"]


def _quick_at(quick: Sequence[tuple[int, int]], b: int) -> Optional[float]:
    """The quick plans' need at `b`: exact, or interpolated between the
    nearest sizes on either side; `None` outside them."""
    for size, need in quick:
        if size == b:
            return float(need)
    below = [(s, n) for s, n in quick if s < b]
    above = [(s, n) for s, n in quick if s > b]
    if not below or not above:
        return None
    (b1, n1), (b2, n2) = below[-1], above[0]
    return n1 + (n2 - n1) * (b - b1) / (b2 - b1)


def ratios(observations: Sequence[Observation]) -> list[tuple[int, float]]:
    """`(batch, plan as fit compiles / quick plan)` at each size where both
    are known, in order of size."""
    quick = sorted({(o.batch_size, o.need_bytes) for o in observations
                    if o.how == AIMED and o.ran and o.need_bytes})
    out = {}
    for o in observations:
        if o.how != PLAN or not o.ran or not o.need_bytes:
            continue
        at = _quick_at(quick, o.batch_size)
        if at:
            out[o.batch_size] = o.need_bytes / at
    return sorted(out.items())


def _ratio_at(points: Sequence[tuple[int, float]], b: int) -> float:
    if not points:
        return 1.0
    if b <= points[0][0]:
        return points[0][1]
    if b >= points[-1][0]:
        return points[-1][1]
    for (b1, r1), (b2, r2) in zip(points, points[1:]):
        if b1 <= b <= b2:
            return r1 + (r2 - r1) * (b - b1) / (b2 - b1)
    return points[-1][1]


def calibrated(evidence: Evidence) -> Evidence:
    """The record as the quick plans, calibrated, see it: each quick plan
    off the ladder read as a plan of its need times the ratio at its size
    (where no plan as `fit` compiles it was made at that size)."""
    points = ratios(evidence.observations)
    exact = {o.batch_size for o in evidence.observations if o.how == PLAN}
    out = []
    for o in evidence.observations:
        if o.how == AIMED and not o.ladder:
            if o.batch_size in exact:
                continue
            need = (None if o.need_bytes is None
                    else int(o.need_bytes * _ratio_at(points, o.batch_size)))
            o = dataclasses.replace(o, how=PLAN, need_bytes=need)
        out.append(o)
    return dataclasses.replace(evidence, observations=tuple(out))
