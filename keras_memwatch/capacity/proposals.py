"""Which sizes would bracket an answer, read off the record as it stands.

`search.Search` runs the rounds; this module says what a round should ask
for one answer (`proposals`), when one round of checks can close an
answer's bracket (`one_round`), and which gap the quick plans cannot aim
into (`untrusted_gap`). Each reads an `evidence.Evidence` only.
"""

from __future__ import annotations

from typing import Optional

from keras_memwatch.capacity.brackets import RESOLUTION, room_gap
from keras_memwatch.capacity.evidence import AIMED, PLAN, Evidence

__all__ = ["FAN", "between", "one_round", "proposals", "untrusted_gap"]

#: Where quick plans have not yet failed above an answer, they also ask
#: these multiples of it (XLA may recompute activations up there: GPT-2
#: base fits twice the batch the small-batch line says).
FAN = (1.1, 1.3, 1.6, 2.0, 2.5, 3.0)


def between(low: int, high: int, parts: int) -> list[int]:
    """Up to `parts` sizes that cut `low`..`high` into equal parts."""
    return sorted({low + (high - low) * i // (parts + 1)
                   for i in range(1, parts + 1)} - {low, high})


def proposals(evidence: Evidence, headroom: float, width: int, fan: bool,
              above_limit: bool) -> tuple[list[int], list[int]]:
    """What to ask next for the answer under `headroom`, as `(needed,
    above)`:

    - while a gap between the largest size seen to fit and the smallest
      that failed is open and the answer lies at its foot (it rests on
      where the limit lies in it), sizes that cut it into `width + 1`
      equal parts;
    - while a gap between the largest size that fits the room of this
      headroom and the smallest that does not is open, sizes that cut it,
      where they may be tried (below a size that ran, or where sizes above
      the limit may be tried: `above_limit`);
    - else the answer, where nothing at or just below it was asked, and
      the size just above it;
    - nothing where both are known.

    With `fan`, while nothing above the answer has failed, the sizes above
    it also fan out to three times the answer (`FAN`): XLA may recompute
    there, and a size that does not fit brackets the answer in the same
    round.
    """
    b = evidence.batch_size_for(headroom)
    if not b:
        return [], []
    step = max(1, int(RESOLUTION * b))
    checked = [o for o in evidence.observations if not o.ladder and o.how != AIMED]
    fits = [o.batch_size for o in checked
            if o.batch_size <= b and not evidence.failed(o)]
    failed = evidence.smallest_failure
    gap = _failure_gap(evidence, headroom)
    if gap is not None:
        return between(*gap, width), []
    low, high, high_ran = room_gap(evidence, headroom)
    if low is not None and high is not None \
            and high - low > max(1, int(RESOLUTION * low)) \
            and (high_ran or above_limit):
        return between(low, high, width), []
    above: list[int]
    if not above_limit or any(b < o.batch_size <= b + step for o in checked):
        above = []
    else:
        above = ([int(b * f) for f in FAN] if fan and failed is None
                 else []) + [b + step]
    if not fits or b - max(fits) > step:
        return [b], above
    return [], above


def _failure_gap(evidence: Evidence, headroom: float) -> Optional[tuple[int, int]]:
    """`(largest size seen to fit, smallest that failed)` where they are more
    than `RESOLUTION` apart and the answer under `headroom` lies at the
    gap's foot (it rests on where the limit lies in it); else `None`."""
    failed, fitted = evidence.smallest_failure, evidence.largest_fitting
    if failed is None or fitted is None or \
            failed - fitted <= max(1, int(RESOLUTION * fitted)) or \
            (evidence.batch_size_for(headroom) or 0) < fitted:
        return None
    return fitted, failed


def untrusted_gap(evidence: Evidence, headroom: float, parts: int) -> list[int]:
    """`parts` sizes that cut the gap the answer under `headroom` rests on
    (`_failure_gap`) where the quick plans cannot aim into it, and checks
    cut it themselves; `[]` elsewhere. They cannot where XLA recomputes
    activations to fit the limit:

    - a plan as `fit` compiles it failed at a size whose quick plan fit
      the room (the quick plans went on recomputing where `fit`'s
      compilation gave up);
    - the quick plans in the gap grow, a sample, by less than half what
      the small-batch line grows (held flat by recomputing: no calibration
      of them reaches where the plans stop fitting).
    """
    gap = _failure_gap(evidence, headroom)
    if gap is None:
        return []
    if not (_quick_fit_where_fit_failed(evidence) or _held_flat(evidence, *gap)):
        return []
    return between(*gap, parts)


def _quick_fit_where_fit_failed(evidence: Evidence) -> bool:
    room = evidence.room(0.0)
    quick_fit = {o.batch_size for o in evidence.observations if o.how == AIMED
                 and o.need_bytes is not None and o.need_bytes <= room}
    return any(o.how == PLAN and o.batch_size in quick_fit and evidence.failed(o)
               for o in evidence.observations)


def _held_flat(evidence: Evidence, low: int, high: int) -> bool:
    line = evidence.line
    quick = sorted((o.batch_size, o.need_bytes) for o in evidence.observations
                   if o.how == AIMED and o.need_bytes is not None
                   and low <= o.batch_size <= high)
    if line is None or len(quick) < 2 or quick[-1][0] == quick[0][0]:
        return False
    (b0, n0), (b1, n1) = quick[0], quick[-1]
    return (n1 - n0) / (b1 - b0) < line.per_sample_bytes / 2


def one_round(view: Evidence, headroom: float, width: int) -> list[int]:
    """The sizes a round of `width` checks asks to bracket the answer under
    `headroom` where `view` (the quick plans) brackets it: the answer and
    the bracket's top where they are `RESOLUTION` apart, every size of the
    bracket where it holds fewer than `width`; else `[]`."""
    low, high, _ = room_gap(view, headroom)
    if low is None or high is None:
        return []
    if high - low <= max(1, int(RESOLUTION * low)):
        answer: Optional[int] = view.crossing(headroom)
        return [min(max(answer or low, low), high - 1), high]
    if high - low < width:
        return list(range(low, high + 1))
    return []
