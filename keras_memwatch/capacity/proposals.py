"""Which sizes would bracket an answer, read off the record as it stands.

`search.Search` runs the rounds; this module says what a round should ask
for one answer (`proposals`), and when one round of checks can close an
answer's bracket (`one_round`). Both read an `evidence.Evidence` only.
"""

from __future__ import annotations

from typing import Optional

from keras_memwatch.capacity.brackets import RESOLUTION, room_gap
from keras_memwatch.capacity.evidence import AIMED, Evidence

__all__ = ["FAN", "between", "one_round", "proposals"]

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
    failed, fitted = evidence.smallest_failure, evidence.largest_fitting
    if failed is not None and fitted is not None and b >= fitted \
            and failed - fitted > max(1, int(RESOLUTION * fitted)):
        return between(fitted, failed, width), []
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
