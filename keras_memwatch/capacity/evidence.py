"""The record of what an estimate observed, and the one rule that reads it.

An estimate gathers `Observation`s: a batch size, the bytes a step of it
needed beyond the memory already in use, how that was obtained, and
whether it ran. `Evidence` holds them with the device's limit and the
memory in use, and answers every question from them by one rule:

    room(h)            = limit x (1 - h) - in use
    batch_size_for(h)  = the largest batch b such that no batch up to b
                         needs more than room(h), below every size that
                         failed.

What a batch needs is read from the record as follows:

1. The *small-batch line* is the least-squares line through the ladder's
   observations (the small sizes measured first).
2. Every other observation tells how far the line is off near it, as a
   ratio of need to line:
   - a compiled plan (`PLAN`) gives the ratio at its size exactly, and
     fails where it needs more than the whole room;
   - a step or job that ran (`STEP`, `JOB`) needed at least what it
     measured, and at most the whole room;
   - a step, job or compilation that ran out of memory needed more than
     the whole room.
   Such a lower bound holds for every smaller batch too: what the line
   misses (the allocator's rounding and fragmentation) does not shrink
   for smaller batches.
3. At each observed size the need is the line times the ratio (exact
   ratios interpolated, raised to every lower bound that applies); between
   observed sizes it is interpolated, and beyond them it follows the line
   times the nearest ratio.
4. A step or job that ran under the whole limit shows that it, and every
   smaller batch, fits the whole room: their need is capped there.

Between the largest size seen to fit and the smallest that failed the
record cannot tell where the limit lies, so it is taken at the largest
seen to fit: an answer never lies in between, and that size counts as
needing the whole room. So
`batch_size_for` never reaches a size that failed, never rises as `h`
grows, and holds every size that ran under the whole limit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Optional

#: Real training steps in the measuring process: the peak above the memory
#: in use (the allocator's on a GPU, the resident set on the host).
STEP = "step"
#: A job trained in a new process: it ran or ran out of memory.
JOB = "job"
#: XLA's memory plan of the step as `fit` compiles it (JAX): exact.
PLAN = "plan"
#: XLA's plan compiled without autotuning: quicker, it only draws the line.
AIMED = "aimed plan"
HOWS = (STEP, JOB, PLAN, AIMED)

#: A plan this far under the line (after its ratio at the smallest plan)
#: shows XLA recomputing activations to fit.
RECOMPUTE = 0.05


@dataclasses.dataclass(frozen=True)
class Observation:
    """One batch size, and what it needed.

    Attributes:
        batch_size: the batch.
        need_bytes: bytes a step needed beyond the memory in use, or `None`
            where nothing was read (it ran out of memory).
        how: `STEP`, `JOB`, `PLAN` or `AIMED` (see the module).
        ran: `False` where the step, job or compilation ran out of memory.
        ladder: measured by the ladder: the small-batch line goes through it.
        seconds: how long the observation took.
        step_seconds: one measured step's seconds, where real steps ran
            undisturbed (not slowed by the allocator freeing its cache to
            make room); else `None`.
    """

    batch_size: int
    need_bytes: Optional[int]
    how: str
    ran: bool = True
    ladder: bool = False
    seconds: float = 0.0
    step_seconds: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Line:
    """`need = static_bytes + per_sample_bytes x batch`, fitted by least squares."""

    static_bytes: float
    per_sample_bytes: float
    batch_sizes: tuple[int, ...]

    def __call__(self, batch: float) -> float:
        return self.static_bytes + self.per_sample_bytes * batch

    def batch_size_for(self, room: float) -> int:
        """The largest batch the line puts under `room` (0 where none)."""
        return max(int(math.floor((room - self.static_bytes) / self.per_sample_bytes)), 0)


def fit_line(points: Sequence[tuple[int, int]]) -> Optional[Line]:
    """The least-squares line through `(batch, bytes)` points at two or more
    sizes, or `None` without two sizes or where it does not rise."""
    sizes = sorted({b for b, _ in points})
    if len(sizes) < 2:
        return None
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_w = sum(w for _, w in points) / n
    var = sum((b - mean_b) ** 2 for b, _ in points)
    slope = sum((b - mean_b) * (w - mean_w) for b, w in points) / var
    if slope <= 0:
        return None
    return Line(mean_w - slope * mean_b, slope, tuple(sizes))


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Everything an estimate observed on one device, and its answers.

    Attributes:
        observations: in the order made.
        limit_bytes: the device's limit, or `None` where none is known.
        in_use_bytes: memory in use before the steps (weights, optimizer
            state, the runtime).
    """

    observations: tuple[Observation, ...]
    limit_bytes: Optional[int]
    in_use_bytes: int

    def room(self, headroom: float) -> float:
        """Bytes a step may need under the limit less `headroom`."""
        assert self.limit_bytes is not None
        return self.limit_bytes * (1.0 - headroom) - self.in_use_bytes

    @property
    def line(self) -> Optional[Line]:
        """The small-batch line: through the ladder's observations."""
        return fit_line([(o.batch_size, o.need_bytes) for o in self.observations
                         if o.ladder and o.ran and o.need_bytes is not None])

    def failed(self, o: Observation) -> bool:
        """Whether `o` shows its size does not fit the whole limit."""
        return not o.ran or (o.how == PLAN and o.need_bytes is not None
                             and self.limit_bytes is not None
                             and o.need_bytes > self.room(0.0))

    @property
    def smallest_failure(self) -> Optional[int]:
        """The smallest batch seen not to fit the whole limit."""
        return min((o.batch_size for o in self.observations if self.failed(o)),
                   default=None)

    def needs(self) -> Optional[list[tuple[int, float]]]:
        """`(batch, bytes)` at each size the rule rests on, in order of size
        (the line's ends and every observed size), or `None` without a
        line or a limit."""
        line = self.line
        if line is None or self.limit_bytes is None:
            return None
        room0 = self.room(0.0)
        exact: dict[int, float] = {}
        floors: dict[int, float] = {}
        for o in self.observations:
            b, at = o.batch_size, line(o.batch_size)
            if at <= 0 or o.how == AIMED:
                continue
            if o.how == PLAN and o.need_bytes is not None:
                exact[b] = o.need_bytes / at  # fitting or not
            elif self.failed(o):
                floors[b] = max(floors.get(b, 0.0), room0 / at)
            elif o.need_bytes is not None and not o.ladder:
                floors[b] = max(floors.get(b, 0.0), o.need_bytes / at)
        # Between the largest size seen to fit and the smallest that failed,
        # the record cannot tell where the limit lies: it is taken at the
        # largest seen to fit (where its need is not known exactly).
        failed = self.smallest_failure
        fitted = self.largest_fitting
        if fitted is not None and fitted not in exact and line(fitted) > 0:
            floors[fitted] = max(floors.get(fitted, 0.0), room0 / line(fitted))
        # A size that ran under the whole limit shows that it, and every
        # smaller batch, fits the whole room.
        ran = max((o.batch_size for o in self.observations
                   if o.ran and o.how in (STEP, JOB)
                   and (failed is None or o.batch_size < failed)), default=0)
        out = []
        for b in sorted({*exact, *floors, *line.batch_sizes}):
            need = self._ratio(b, exact, floors) * line(b)
            out.append((b, min(need, room0) if b <= ran else need))
        return out

    @staticmethod
    def _ratio(b: int, exact: dict[int, float], floors: dict[int, float]) -> float:
        """Need over line at `b`: exact ratios interpolated (1 without any),
        raised to every lower bound at `b` or above."""
        if exact:
            known = sorted(exact.items())
            if b <= known[0][0]:
                r = known[0][1]
            elif b >= known[-1][0]:
                r = known[-1][1]
            else:
                r = _interpolate(known, b)
        else:
            r = 1.0
        return max([r] + [f for size, f in floors.items() if size >= b])

    def batch_size_for(self, headroom: float) -> Optional[int]:
        """The largest batch whose need, and every smaller batch's, fits
        `room(headroom)`, below every size that failed; where that falls
        between the largest size seen to fit and the smallest that failed,
        where the record cannot tell, the largest seen to fit. `None`
        without a line or a limit."""
        needs = self.needs()
        line = self.line
        if needs is None or line is None:
            return None
        answer = _first_over(needs, line, self.room(headroom)) - 1
        failed = self.smallest_failure
        if failed is not None:
            answer = min(answer, failed - 1)
            fitted = self.largest_fitting
            if fitted is not None and answer > fitted:
                answer = fitted
        return max(answer, 0)

    def crossing(self, headroom: float) -> Optional[int]:
        """Where the record's reading of the need crosses `room(headroom)`,
        not capped at the sizes seen to fail: where to look next, never an
        answer. `None` without a line or a limit."""
        needs = self.needs()
        line = self.line
        if needs is None or line is None:
            return None
        return max(_first_over(needs, line, self.room(headroom)) - 1, 0)

    @property
    def largest_fitting(self) -> Optional[int]:
        """The largest size seen to fit below the smallest that failed, where
        one failed (an aimed plan shows nothing)."""
        failed = self.smallest_failure
        if failed is None:
            return None
        return max((o.batch_size for o in self.observations
                    if o.how != AIMED and not self.failed(o)
                    and o.batch_size < failed), default=None)

    def line_batch_size_for(self, headroom: float) -> Optional[int]:
        """The small-batch line's answer alone, without the checks."""
        line = self.line
        if line is None or self.limit_bytes is None:
            return None
        return line.batch_size_for(self.room(headroom))

    @property
    def recomputes_from(self) -> Optional[int]:
        """The smallest checked size (off the ladder) whose plan lies
        `RECOMPUTE` or more under the small-batch line: there XLA recomputes
        activations to fit, and steps run slower."""
        line = self.line
        plans = sorted((o.batch_size, o.need_bytes) for o in self.observations
                       if o.how == PLAN and o.ran and o.need_bytes is not None
                       and not o.ladder)
        if line is None or not plans:
            return None
        for b, need in plans:
            if need < (1 - RECOMPUTE) * line(b):
                return b
        return None


def _interpolate(points: Sequence[tuple[int, float]], b: float) -> float:
    """Linear interpolation between sorted `(x, y)` points, at `b` inside."""
    for (b1, y1), (b2, y2) in zip(points, points[1:]):
        if b1 <= b <= b2:
            return y1 + (y2 - y1) * (b - b1) / (b2 - b1)
    raise ValueError(f"{b} lies outside {points[0][0]}-{points[-1][0]}")


def _first_over(needs: Sequence[tuple[int, float]], line: Line, room: float) -> int:
    """The smallest batch (from 1) whose need exceeds `room`: below the first
    size and above the last, the line times that end's ratio; between,
    interpolated."""
    first_b, first_n = needs[0]
    scale = first_n / line(first_b) if line(first_b) > 0 else 1.0
    below = _crossing(lambda b: scale * line(b), 1, first_b, room)
    if below is not None:
        return below
    for (b1, n1), (b2, n2) in zip(needs, needs[1:]):
        if n2 > room:
            # the first integer in (b1, b2] above room on the segment
            if n2 == n1:
                return b1 + 1
            cross = b1 + (room - n1) * (b2 - b1) / (n2 - n1)
            return max(int(math.floor(cross)) + 1, b1 + 1)
    last_b, last_n = needs[-1]
    at = line(last_b)
    ratio = last_n / at if at > 0 else 1.0
    per_sample = ratio * line.per_sample_bytes
    return last_b + max(int(math.floor((room - last_n) / per_sample)) + 1, 1)


def _crossing(need, lo: int, hi: int, room: float) -> Optional[int]:
    """The first integer in [lo, hi] whose `need` (increasing) exceeds
    `room`, or `None`."""
    if hi < lo or need(hi) <= room:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if need(mid) > room:
            hi = mid
        else:
            lo = mid + 1
    return lo
