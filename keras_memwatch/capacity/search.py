"""Which batch sizes to ask about: the ladder, then checks at the answers.

Written once for every way of measuring. A *strategy* (`steps.Steps`,
`xla.Plans`, `fresh_process.Jobs`) answers "what does batch b need, and
does it run?"; this module decides which b to ask about:

1. The ladder: sizes from 1, growing 2 to 8 times a step, until a size
   needs `TARGET` of the whole room (at least two sizes; a ladder that gets
   there in two gets the sizes in between). It never tries a size the
   sizes before it say would need more than `SAFE` of the room, nor one
   whose own arrays would take more than `HOST_BATCH` of the host's
   available memory; on the host it stops after a step slower than
   `SLOW_S` (the answer then says how far beyond the ladder it lies).
   Where the strategy has quick plans, the first round's spare places
   hold quick plans `BEYOND` the ladder; those the ladder would have
   climbed to itself (`ladder.rungs`) join it, the rest aim only.
2. On a GPU, the checks: the answer under the headroom and, where sizes
   above the limit may be tried (XLA's plans, or an allocator's cap), the
   answer without headroom, each asked about, then the size `RESOLUTION`
   above it, until the record brackets every answer to `RESOLUTION` or
   `MAX_CHECKS` sizes were asked. Each round re-reads the whole record
   (`evidence.Evidence`), so what a check shows moves the next one; a gap
   between a size that fitted and one that failed, where the record
   cannot tell, is cut into as many parts as the strategy asks about at
   once (`check_width`: compilations side by side, or one real step).
   Where the strategy has a quicker way (XLA's plans without
   autotuning), it brackets the answers with that first, a wide round at
   a time (`FAN` above the answer, where XLA may recompute), until one
   round of checks can ask every size each answer needs
   (`proposals.one_round`); every quick plan is read through the ratio
   of the two kinds where checks measured both (`calibration`), and where
   the checks show the quick plans off, they aim again. Where a check
   fails at a size whose quick plan fit the room (the quick plans went on
   recomputing where `fit`'s compilation gave up), or where the quick
   plans in the gap are held flat, the checks cut the gap themselves
   (`proposals.untrusted_gap`). A round's spare places go where a miss
   would send the next round: just below an answer not yet checked, or
   between an answer seen to fit and the round's next size above it.
3. Every answer's bracket is closed to `RESOLUTION`: the gap between the
   largest size that fits the room of that headroom and the smallest
   that does not (under the whole limit: that failed) is cut, where its
   sizes may be tried (below a size that ran, or under a cap).

With a `Deadline`, no round starts that the rounds before it say cannot
end in time, and the strategy abandons what is still compiling when it
passes; only the first two sizes of the ladder (without which nothing
can be answered) are always measured. `open` says which answers were
left open, and why.

The time goes in rounds, not sizes, where sizes compile side by side: a
round of GPT-2-base's step takes as long as one compilation.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from itertools import zip_longest
from typing import Callable, Optional, Protocol

from keras_memwatch.capacity.brackets import RESOLUTION, bracketed, left_open
from keras_memwatch.capacity.calibration import calibrated
from keras_memwatch.capacity.deadline import Deadline, expected_seconds
from keras_memwatch.capacity.evidence import AIMED, PLAN, Evidence, Observation
from keras_memwatch.capacity.ladder import (  # noqa: F401 (the ladder's, read here)
    HOST_BATCH, MAX_LADDER, SAFE, SLOW_S, START, TARGET, host_largest_batch, next_sizes,
    rungs)
from keras_memwatch.capacity.progress import Progress
from keras_memwatch.capacity.proposals import (
    FAN, between, one_round, proposals, untrusted_gap)

MAX_CHECKS = 16
MAX_AIMED = 24  # quick, aimed plans (JAX on a GPU): three rounds of eight
#: How far below an answer not yet seen to fit the spare places of a
#: round of checks reach.
CHECKS_BELOW = 3
#: Multiples of the first ladder round's largest size that quick plans ask
#: in its spare places: where the answer lies within them, the aims start
#: from a bracket instead of fanning out (one round fewer).
BEYOND = (2, 3, 4, 6)


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
    #: Whether a round's checks compile one after another (`None`: not
    #: known yet, as `False`).
    checks_in_turn: Optional[bool]
    aims: bool  # whether it has quick plans, `aim(sizes)`, that only aim
    #: A `perf_counter()` time after which work in flight is abandoned, or
    #: `None`; set by the search.
    deadline: Optional[float]

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
        deadline: when to stop asking. Defaults to `None`: no limit.
        progress: shows each round. Defaults to `None`: nothing shown.
        known: observations of this step made before (`stored_record`):
            the search starts from them, with no ladder where they draw the
            line, and asks only what they leave open. Defaults to `()`.
        in_use: the bytes in use that the record is read against. Defaults
            to `None`: the strategy's `in_use`.
    """

    def __init__(self, strategy: Strategy, on_gpu: bool,
                 host_largest: Optional[int], *, deadline: Optional[Deadline] = None,
                 progress: Optional[Progress] = None,
                 known: Sequence[Observation] = (), in_use: Optional[int] = None):
        self.strategy = strategy
        self.in_use = strategy.in_use if in_use is None else in_use
        self.on_gpu = on_gpu
        self.host_largest = host_largest
        self.deadline = deadline if deadline is not None else Deadline(None)
        self.progress = progress
        self.observations: list[Observation] = list(known)
        self.stopped = ""  # why the ladder stopped where it did
        self.checks_left = ""  # what the checks left open
        #: Each answer left open (by headroom), and why.
        self.open: dict[float, str] = {}
        self.out_of_time = False
        #: Each round: `(kind, sizes asked, wall seconds)`.
        self.rounds: list[tuple[str, list[int], float]] = []
        self._headroom = 0.0
        self._beyond_asked = 0  # quick plans asked in the ladder's rounds

    @property
    def evidence(self) -> Evidence:
        return Evidence(tuple(self.observations), self.strategy.limit, self.in_use)

    def run(self, headroom: float, sizes: Optional[Sequence[int]]) -> Evidence:
        """The ladder (or `sizes`), then the checks; the record."""
        self._headroom = headroom
        if sizes is not None:
            self._given(list(sizes))
            self._reach_down()
        elif self.evidence.line is None:
            self._climb()
        if self.on_gpu and self.strategy.limit is not None and not self.out_of_time:
            self._check(headroom)
        if (self.on_gpu or self.out_of_time) and self.strategy.limit is not None:
            self._say_open(headroom)
        if self.out_of_time and not self.stopped and self.evidence.line is None:
            self.stopped = "out of time"
        return self.evidence

    # -- asking, in rounds, within the time ---------------------------------

    def _ask(self, kind: str, sizes: Sequence[int],
             beyond: Sequence[int] = ()) -> list[Observation]:
        """One round: `sizes` measured by `kind` (`"ladder"`, `"aim"`,
        `"check"`), and on the ladder quick plans of `beyond` beside them;
        shown, and added to the record."""
        sizes = list(sizes)
        began = time.perf_counter()
        measure = getattr(self.strategy, kind)
        made = (measure(sizes, beyond) if beyond else measure(sizes)) if sizes else []
        sizes += [b for b in beyond if b not in sizes]
        self.observations += made
        self.rounds.append((kind, sizes, time.perf_counter() - began))
        if self.progress is not None:
            best = (self.evidence.batch_size_for(self._headroom)
                    if self.strategy.limit is not None else None)
            self.progress.round(kind, sizes, best)
        if self.deadline.passed and self._answerable():
            self.out_of_time = True
        return made

    def _answerable(self) -> bool:
        """Whether the record can answer: the time limit binds from here."""
        return self.evidence.line is not None

    def _in_time(self, kind: str, sizes: Sequence[int]) -> bool:
        """Whether a round of `sizes` can end before the deadline (always,
        until the record can answer). Arms the strategy's own deadline."""
        if self.deadline.at is None or not self._answerable():
            return True
        self.strategy.deadline = self.deadline.at
        if not self.deadline.allows(self._expected(kind, sizes)):
            self.out_of_time = True
        return not self.out_of_time

    def _expected(self, kind: str, sizes: Sequence[int]) -> float:
        return expected_seconds(
            self.rounds, kind, sizes, side_by_side=self.strategy.how == PLAN,
            in_turn=kind == "check" and bool(self.strategy.checks_in_turn))

    # -- the ladder ----------------------------------------------------------

    def _given(self, sizes: list[int]) -> None:
        """`trial_sizes`: a round at once where sizes compile side by side,
        else one at a time while there is time."""
        if self.strategy.ladder_width > 1:
            self._ask("ladder", sizes)
            return
        for i, b in enumerate(sizes):
            if not self._in_time("ladder", [b]):
                self.stopped = (f"out of time (max_seconds) after batch "
                                f"{sizes[i - 1]}; not measured: "
                                + ", ".join(map(str, sizes[i:])))
                return
            self._ask("ladder", [b])

    def _reach_down(self) -> None:
        """Where fewer than two given sizes ran (a wanted batch far above
        the limit), halves the smallest size that ran (or, where none ran,
        the smallest asked) until two ran and draw the line, or batch 1 was
        asked."""
        while self.evidence.line is None:
            asked = {o.batch_size for o in self.observations if o.ladder}
            ran = [o.batch_size for o in self.observations if o.ladder and o.ran]
            b = min(ran or asked, default=0) // 2
            if b < 1 or b in asked:
                return
            if not self._in_time("ladder", [b]):
                self.stopped = f"out of time (max_seconds) before batch {b}"
                return
            self._ask("ladder", [b])

    def _climb(self) -> None:
        room = (self.evidence.room(0.0) if self.strategy.limit is not None
                else None)
        queue = ([START, 2 * START, 4 * START, 8 * START]
                 if self.strategy.ladder_width > 1 else [START])
        beyond = self._beyond(queue)
        while queue and len(self._ladder_sizes()) < MAX_LADDER:
            if not self._in_time("ladder", queue):
                self.stopped = (f"out of time (max_seconds) before batch "
                                f"{max(queue)}")
                return
            made = self._ask("ladder", queue, beyond)
            if beyond:
                self._join_ladder(rungs(self.observations, room))
            self._beyond_asked += len(beyond)
            beyond = []
            if not made or self.out_of_time:
                self.stopped = f"out of time (max_seconds) after batch {max(queue)}"
                break
            failed = [o.batch_size for o in made if not o.ran and o.ladder]
            if failed:
                self.stopped = f"batch {min(failed)} ran out of memory"
                break
            # a slow step on the host stops the ladder; a slow compilation
            # of a plan (never run) does not
            if not self.on_gpu and self.strategy.how != PLAN and \
                    max(o.seconds for o in made) > SLOW_S:
                self.stopped = (f"batch {max(queue)} took "
                                f"{max(o.seconds for o in made):.1f} s")
                break
            queue, self.stopped = next_sizes(self.observations, room,
                                             self.strategy.above_limit,
                                             self.host_largest)
        self._fill_in()

    def _beyond(self, queue: Sequence[int]) -> list[int]:
        """Quick plans for the first round's spare places: `BEYOND` times
        its largest size, where the strategy has quick plans (they aim
        only; the aims that follow start from them)."""
        if not self.strategy.aims:
            return []
        spare = self.strategy.ladder_width - len(queue)
        return [max(queue) * f for f in BEYOND][:max(spare, 0)]

    def _join_ladder(self, sizes: Sequence[int]) -> None:
        """Puts the observations of `sizes` on the ladder."""
        self.observations = [
            dataclasses.replace(o, ladder=True) if o.batch_size in sizes else o
            for o in self.observations]

    def _ladder_sizes(self) -> list[int]:
        return sorted({o.batch_size for o in self.observations if o.ladder})

    def _fill_in(self) -> None:
        """Sizes in between where the ladder measured only two."""
        sizes = self._ladder_sizes()
        if len(sizes) != 2 or not all(o.ran for o in self.observations):
            return
        low, high = sizes
        between = sorted({(low + high) // 2, (low + 3 * high) // 4} - {low, high})
        if between and self._in_time("ladder", between):
            self._ask("ladder", between)

    # -- the checks ----------------------------------------------------------

    def _aimed(self) -> Evidence:
        """The record as the quick plans, calibrated, see it."""
        return calibrated(self.evidence)

    def _check(self, headroom: float) -> None:
        targets = [headroom] + ([0.0] if headroom > 0 and
                                self.strategy.above_limit else [])
        if self.strategy.aims:
            # Quick plans, calibrated, bracket the answers first, until one
            # round of checks can ask every size of each bracket; where the
            # checks show the quick plans off, they aim again.
            while True:
                self._rounds(targets, self._aimed, "aim",
                             MAX_AIMED - self._asked("aim") - self._beyond_asked,
                             self.strategy.ladder_width, near=True)
                before = self._asked("check")
                left = self._settle(targets, MAX_CHECKS - before,
                                    self.strategy.check_width, rounds=1)
                if not left or self._asked("check") == before or self.out_of_time \
                        or self._asked("check") >= MAX_CHECKS:
                    break
        else:
            left = self._rounds(targets, lambda: self.evidence, "check",
                                MAX_CHECKS, self.strategy.check_width)
        if left and not self.out_of_time:
            self.checks_left = (
                f"the checks stopped after {MAX_CHECKS} sizes with the answer "
                + " and ".join(f"under {h:.0%} headroom" for h in left)
                + f" not bracketed to {RESOLUTION:.0%}")

    def _asked(self, kind: str) -> int:
        """How many sizes rounds of `kind` asked so far."""
        return sum(len(sizes) for k, sizes, _ in self.rounds if k == kind)

    def _settle(self, targets: Sequence[float], budget: int, width: int,
                rounds: Optional[int] = None) -> list[float]:
        """Checks, as `fit` compiles them, where the calibrated quick plans
        say each answer lies and the size just above it (every size of a
        bracket narrower than `width`), a round at a time, until the record
        brackets each answer, `rounds` rounds ran, `budget` sizes were
        asked or the time is out; returns the headrooms left open."""
        done = 0
        while True:
            real = self.evidence
            view = self._aimed()
            unbracketed = [h for h in targets if not bracketed(real, h)]
            exact = {o.batch_size for o in real.observations
                     if o.how != AIMED and not o.ladder}
            asks: list[int] = []
            # an untrusted gap shares the round with the other open answers
            parts = max(1, width - (len(unbracketed) - 1))
            for h in reversed(unbracketed):
                untrusted = untrusted_gap(real, h, parts)
                if untrusted:
                    asks += [b for b in untrusted if b not in exact]
                    continue
                needed = one_round(view, h, self.strategy.check_width)
                if needed:  # the quick plans' bracket
                    asks += [b for b in needed if b not in exact]
                    continue
                b = view.crossing(h)
                if not b:
                    continue
                failed = real.smallest_failure
                if failed is not None:
                    b = min(b, failed - 1)
                step = max(1, int(RESOLUTION * b))
                if b not in exact:
                    asks.append(b)
                if self.strategy.above_limit and \
                        not any(b < s <= b + step for s in exact):
                    asks.append(b + step)
            top = view.crossing(targets[-1])
            failed = real.smallest_failure
            if self._asked("check") and top and self.strategy.above_limit and \
                    (failed is None or failed > top * FAN[-1]):
                # the quick plans aimed low before: where nothing failed
                # above the ceiling, the spare sizes look further up
                asks += [int(top * f) for f in FAN]
            asks = [b for b in dict.fromkeys(asks) if b not in exact][:width]
            if asks:
                # spare places of the round, for the answers the checks have
                # not bracketed (beside a bracketed one they would only slow
                # the round)
                asks += _spare(view, unbracketed, exact, asks, width - len(asks))
            if not asks or (rounds is not None and done >= rounds):
                return unbracketed
            done += 1
            if budget <= 0 or not self._in_time("check", asks):
                return unbracketed
            self._ask("check", asks)
            budget -= len(asks)

    def _rounds(self, targets: Sequence[float], view: Callable[[], Evidence],
                kind: str, budget: int, width: int, near: bool = False) -> list[float]:
        """Asks, a round of at most `width` sizes at a time, what `view`'s
        answers need, until each is bracketed (or, with `near`, until one
        round of checks can ask what each needs), `budget` sizes were asked or
        the time is out; returns the headrooms left open. A round asks
        first what every answer rests on, then the sizes above them, the
        ceiling's first (they fan out: `proposals`)."""
        while True:
            if near:
                known = {h: one_round(view(), h, self.strategy.check_width)
                         for h in targets}
                if all(known.values()) and \
                        len(set().union(*known.values())) <= self.strategy.check_width:
                    return []  # one round of checks asks every size needed
            first: list[int] = []
            then: list[int] = []
            share = max(1, width // len(targets))
            for h in reversed(targets):  # the ceiling's sizes above first
                if near and (len(known[h] or ()) in (1, 2)
                             or untrusted_gap(self.evidence, h, 1)):
                    continue
                needed, above = proposals(view(), h, share,
                                          fan=h == targets[-1] and width > 1,
                                          above_limit=self.strategy.above_limit)
                first = needed + first
                then += above
            asks = list(dict.fromkeys(first + then))
            if not asks:
                return []
            if budget <= 0:
                return self._unsettled(targets, view())
            asks = asks[:min(width, budget)]
            if not self._in_time(kind, asks):
                return self._unsettled(targets, view())
            self._ask(kind, asks)
            budget -= len(asks)

    def _unsettled(self, targets: Sequence[float], view: Evidence) -> list[float]:
        """The headrooms whose answers `view` would still ask about."""
        return [h for h in targets
                if any(proposals(view, h, 1, False, self.strategy.above_limit))]

    # -- what is left open ---------------------------------------------------

    def _say_open(self, headroom: float) -> None:
        """`open`, and `checks_left` where the time ran out."""
        self.open = left_open(self.evidence, headroom, self.strategy.above_limit,
                              out_of_time=self.out_of_time,
                              checks_stopped=bool(self.checks_left))
        if self.out_of_time and self.open:
            self.checks_left = (
                f"out of time (max_seconds) after {self.deadline.spent():.1f} s: "
                + "; ".join(f"the answer under {h:.0%} headroom is not bracketed "
                            f"to {RESOLUTION:.0%} ({why})"
                            for h, why in self.open.items()))


def _spare(view: Evidence, targets: Sequence[float], exact: set,
           asks: list[int], places: int) -> list[int]:
    """Up to `places` sizes that settle the answers `view` gives under
    `targets` should this round's `asks` miss, taking turns between them:
    above an answer a check has seen fit (`exact`: every checked size below
    an answer fits), sizes that cut the gap up to the round's next size
    above it; below any other, the sizes just under it down to the largest
    checked, nearest first, which the next round would ask where a check
    shows the quick plans low there. None in `exact` or `asks`."""
    per_answer = []
    for b in (view.batch_size_for(h) for h in targets):
        if not b:
            continue
        above = [s for s in asks if s > b]
        if b in exact:
            per_answer.append(between(b, min(above), places) if above else [])
        else:
            floor = max((s for s in exact if s < b), default=0)
            per_answer.append([b - k for k in range(1, CHECKS_BELOW + 1)
                               if b - k > floor])
    taken = exact | set(asks)
    out = [b for turn in zip_longest(*per_answer) for b in turn
           if b is not None and b not in taken]
    return list(dict.fromkeys(out))[:places]
