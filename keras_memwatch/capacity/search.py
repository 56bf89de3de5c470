"""Which batch sizes to ask about: the ladder, then checks at the answers.

Written once for every way of measuring. A *strategy* (`steps.Steps`,
`xla.Plans`, `fresh_process.Jobs`) answers "what does batch b need, and
does it run?"; this module decides which b to ask about:

1. The ladder: sizes from 1, growing 2 to 8 times a step, until a size
   needs `TARGET` of the whole room (at least two sizes; a ladder that gets
   there in two gets the sizes in between). It never tries a size the
   sizes before it say would need more than `SAFE` of the room, nor one
   whose own arrays would take more than `HOST_BATCH` of the host's
   available memory; on the host it stops after a size slower than
   `SLOW_S` (the answer then says how far beyond the ladder it lies).
2. On a GPU, the checks: the answer under the headroom and, where sizes
   above the limit may be tried (XLA's plans, or an allocator's cap), the
   answer without headroom, each asked about, then the size `RESOLUTION`
   above it, until the record brackets every answer to `RESOLUTION` or
   `MAX_CHECKS` sizes were asked. Each round re-reads the whole record
   (`evidence.Evidence`), so what a check shows moves the next one; a gap
   between a size that fitted and one that failed, where the record
   cannot tell, is cut into as many parts as the strategy asks about at
   once (`check_width`: compilations side by side, or one real step).
   Where the strategy has a quicker, rougher way (XLA's plans without
   autotuning), it brackets the answers with that first, a wide round at
   a time (`FAN` above the answer, where XLA may recompute), and the
   checks start at the answers it found.

The time goes in rounds, not sizes, where sizes compile side by side: a
round of GPT-2-base's step takes as long as one compilation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Callable, Optional, Protocol

from keras_memwatch.capacity.evidence import AIMED, PLAN, Evidence, Observation

START = 1
TARGET = 0.25  # the ladder's largest need, of the whole room
SAFE = 0.5  # never try a size expected to need more, of the room
HOST_BATCH = 0.05  # a trial batch's arrays, of the host's available memory
SLOW_S = 2.0  # on the host, the ladder stops after a size this slow
MAX_LADDER = 12
RESOLUTION = 0.02
MAX_CHECKS = 12
MAX_AIMED = 16  # quick, aimed plans (JAX on a GPU): two rounds of eight
#: Where quick plans have not yet failed above an answer, they also ask
#: these multiples of it (XLA may recompute activations up there).
FAN = (1.1, 1.25, 1.5, 2.0)


class Strategy(Protocol):
    """What `search` needs of a way of measuring."""

    how: str
    words: str
    in_use: int
    limit: Optional[int]
    limit_words: str
    above_limit: bool
    ladder_width: int
    check_width: int  # sizes a round of checks asks about

    def ladder(self, sizes: Sequence[int]) -> list[Observation]: ...

    def check(self, sizes: Sequence[int]) -> list[Observation]: ...


class Search:
    """The sizes asked about, and why the asking stopped.

    Args:
        strategy: how each size is measured.
        on_gpu: whether the checks run (never on the host: a size near the
            host's limit would swap the machine).
        host_largest: the largest batch whose arrays the host has room for,
            or `None`.
    """

    def __init__(self, strategy: Strategy, on_gpu: bool,
                 host_largest: Optional[int]):
        self.strategy = strategy
        self.on_gpu = on_gpu
        self.host_largest = host_largest
        self.observations: list[Observation] = []
        self.stopped = ""  # why the ladder stopped where it did
        self.checks_left = ""  # what the checks left open

    @property
    def evidence(self) -> Evidence:
        return Evidence(tuple(self.observations), self.strategy.limit,
                        self.strategy.in_use)

    def run(self, headroom: float, sizes: Optional[Sequence[int]]) -> Evidence:
        """The ladder (or `sizes`), then the checks; the record."""
        if sizes is not None:
            self.observations += self.strategy.ladder(sizes)
        else:
            self._climb()
        if self.on_gpu and self.strategy.limit is not None:
            self._check(headroom)
        return self.evidence

    # -- the ladder ----------------------------------------------------------

    def _climb(self) -> None:
        room = (self.evidence.room(0.0) if self.strategy.limit is not None
                else None)
        queue = ([START, 2 * START, 4 * START, 8 * START]
                 if self.strategy.ladder_width > 1 else [START])
        while queue and len(self._ladder_sizes()) < MAX_LADDER:
            made = self.strategy.ladder(queue)
            self.observations += made
            failed = [o.batch_size for o in made if not o.ran]
            if failed:
                self.stopped = f"batch {min(failed)} ran out of memory"
                break
            if not self.on_gpu and max(o.seconds for o in made) > SLOW_S:
                self.stopped = (f"batch {max(queue)} took "
                                f"{max(o.seconds for o in made):.1f} s")
                break
            queue = self._next(room)
        self._fill_in()

    def _ladder_sizes(self) -> list[int]:
        return sorted({o.batch_size for o in self.observations if o.ladder})

    def _next(self, room: Optional[float]) -> list[int]:
        """The next size up, or none where the ladder is done."""
        points = sorted((o.batch_size, o.need_bytes) for o in self.observations
                        if o.ladder and o.need_bytes is not None)
        if not points:
            self.stopped = "no peak could be read"
            return []
        top, need = points[-1]
        per_sample = max(need / top, _slope(points), 1.0)
        if room is None:
            return [top * 2] if len(points) < 4 else []
        if need >= TARGET * room and len(points) >= 2:
            self.stopped = ""
            return []
        aim = int(TARGET * room / per_sample)
        size = min(max(aim, top * 2), top * 8)
        while size > top * 2 and need + per_sample * (size - top) > SAFE * room:
            size //= 2
        if need + per_sample * (size - top) > SAFE * room and \
                not self.strategy.above_limit:
            self.stopped = (f"batch {size} would need more than {SAFE:.0%} of the "
                            "room")
            return []
        if self.host_largest is not None and size > self.host_largest:
            self.stopped = (f"batch {size} would take more than {HOST_BATCH:.0%} of "
                            "the host's available memory for its arrays")
            return []
        return [size]

    def _fill_in(self) -> None:
        """Sizes in between where the ladder measured only two."""
        sizes = self._ladder_sizes()
        if len(sizes) != 2 or not all(o.ran for o in self.observations):
            return
        low, high = sizes
        between = sorted({(low + high) // 2, (low + 3 * high) // 4} - {low, high})
        if between:
            self.observations += self.strategy.ladder(between)

    # -- the checks ----------------------------------------------------------

    def _aimed(self) -> Evidence:
        """The record as the quick, aimed plans see it: each read as a plan."""
        return Evidence(tuple(dataclasses.replace(o, how=PLAN)
                              if o.how == AIMED and not o.ladder else o
                              for o in self.observations),
                        self.strategy.limit, self.strategy.in_use)

    def _check(self, headroom: float) -> None:
        targets = [headroom] + ([0.0] if headroom > 0 and
                                self.strategy.above_limit else [])
        if getattr(self.strategy, "aims", False):
            # Quick plans bracket the answers first; the first checks then
            # ask about the aimed answers, and the size above the ceiling.
            self._rounds(targets, self._aimed, self.strategy.aim, MAX_AIMED,
                         self.strategy.ladder_width)
            aimed = self._aimed()
            first = {aimed.batch_size_for(h) for h in targets}
            ceiling = aimed.batch_size_for(targets[-1])
            if ceiling and self.strategy.above_limit:
                first.add(ceiling + max(1, int(RESOLUTION * ceiling)))
            first.discard(0)
            first.discard(None)
            self.observations += self.strategy.check(sorted(first))
        asked = sum(1 for o in self.observations if not o.ladder and o.how != AIMED)
        left = self._rounds(targets, lambda: self.evidence, self.strategy.check,
                            MAX_CHECKS - asked, self.strategy.check_width)
        if left:
            self.checks_left = (
                f"the checks stopped after {MAX_CHECKS} sizes with the answer "
                + " and ".join(f"under {h:.0%} headroom" for h in left)
                + f" not bracketed to {RESOLUTION:.0%}")

    def _rounds(self, targets: Sequence[float], view: Callable[[], Evidence],
                ask: Callable[[list[int]], list[Observation]], budget: int,
                width: int) -> list[float]:
        """Asks, a round of at most `width` sizes at a time, what `view`'s
        answers need, until each is bracketed or `budget` sizes were asked;
        returns the headrooms left open. A round asks first what every
        answer rests on, then the sizes above them, the ceiling's first
        (they fan out: `_proposals`)."""
        while True:
            first: list[int] = []
            then: list[int] = []
            for h in reversed(targets):  # the ceiling's sizes above first
                needed, above = self._proposals(view(), h, width,
                                                fan=h == targets[-1] and width > 1)
                first = needed + first
                then += above
            proposals = list(dict.fromkeys(first + then))
            if not proposals:
                return []
            if budget <= 0:
                return [h for h in targets if any(self._proposals(view(), h, 1, False))]
            proposals = proposals[:min(width, budget)]
            self.observations += ask(proposals)
            budget -= len(proposals)

    def _proposals(self, evidence: Evidence, headroom: float, width: int,
                   fan: bool) -> tuple[list[int], list[int]]:
        """What to ask next for the answer under `headroom`, as `(needed,
        above)`:

        - while a gap between the largest size seen to fit and the smallest
          that failed is open (every answer rests on where the limit lies
          in it), sizes that cut it into `width + 1` equal parts;
        - else the answer, where nothing at or just below it was asked, and
          the size just above it;
        - nothing where both are known.

        With `fan`, while nothing above the answer has failed, the sizes
        above it also fan out to twice the answer (`FAN`): XLA may
        recompute there, and a size that does not fit brackets the answer
        in the same round.
        """
        b = evidence.batch_size_for(headroom)
        if not b:
            return [], []
        step = max(1, int(RESOLUTION * b))
        checked = [o for o in evidence.observations
                   if not o.ladder and o.how != AIMED]
        fits = [o.batch_size for o in checked
                if o.batch_size <= b and not evidence.failed(o)]
        failed, fitted = evidence.smallest_failure, evidence.largest_fitting
        if failed is not None and fitted is not None \
                and failed - fitted > max(1, int(RESOLUTION * fitted)):
            return _between(fitted, failed, width), []
        if not self.strategy.above_limit:
            above = []
        elif any(b < o.batch_size <= b + step for o in checked):
            above = []
        else:
            above = ([int(b * f) for f in FAN] if fan and failed is None
                     else []) + [b + step]
        if not fits or b - max(fits) > step:
            return [b], above
        return [], above


def _between(low: int, high: int, parts: int) -> list[int]:
    """Up to `parts` sizes that cut `low`..`high` into equal parts."""
    return sorted({low + (high - low) * i // (parts + 1)
                   for i in range(1, parts + 1)} - {low, high})


def _slope(points: Sequence[tuple[int, float]]) -> float:
    """The slope between the two largest points, or 0."""
    if len(points) < 2:
        return 0.0
    (b1, n1), (b2, n2) = points[-2], points[-1]
    return max((n2 - n1) / (b2 - b1), 0.0)


def host_largest_batch(bytes_per_sample: int, available: Optional[int]) -> Optional[int]:
    """The largest trial batch whose own arrays fit `HOST_BATCH` of the
    host's available memory, or `None`."""
    if available is None or bytes_per_sample <= 0:
        return None
    return max(int(HOST_BATCH * available // bytes_per_sample), 2 * START)

