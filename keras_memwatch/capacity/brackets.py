"""Whether the record brackets an answer, and, where not, why.

An answer under a headroom is *bracketed* when the record holds a size at
most `RESOLUTION` below it (or at it) and, at most `RESOLUTION` above it,
a size that the record reads as not fitting the room of that headroom
(under the whole limit: one that failed).
The search closes each bracket (`search.Search`); what it leaves open is
said in the estimate's explanation.
"""

from __future__ import annotations

from typing import Optional

from keras_memwatch.capacity.evidence import AIMED, PLAN, Evidence

__all__ = ["RESOLUTION", "left_open", "room_gap"]

RESOLUTION = 0.02


def room_gap(evidence: Evidence, headroom: float
             ) -> tuple[Optional[int], Optional[int], bool]:
    """The bracket of the answer under `headroom`: `(the largest size below
    the smallest that does not fit the room, that smallest, whether it
    ran)`, `None` where there is none. A size that fits above one that does
    not (plans out of order near the limit) is not the answer's. Quick
    plans off the ladder say nothing; those on it (the small-batch line)
    only fit."""
    room = evidence.room(headroom)
    seen = [o for o in evidence.observations if o.how != AIMED or o.ladder]
    over = [o for o in seen if o.how != AIMED
            and (evidence.failed(o) or o.need_bytes is not None
                 and o.need_bytes > room)]
    high = min((o.batch_size for o in over), default=None)
    fit = [o.batch_size for o in seen if not evidence.failed(o)
           and (high is None or o.batch_size < high)
           and (o.need_bytes is not None and o.need_bytes <= room
                or o.need_bytes is None and headroom == 0.0 and o.ran)]
    low = max(fit, default=None)
    if high is None:
        return low, None, False
    ran = any(o.batch_size == high and o.ran and o.how != PLAN
              and not evidence.failed(o) for o in over)
    return low, high, ran


def bracketed(evidence: Evidence, headroom: float) -> bool:
    """Whether the answer `b` under `headroom` is bracketed: a size in
    `[b - step, b]` was measured (it fits, by the rule), and one in
    `(b, b + step]` that the record reads as needing more than the room,
    `step` being `RESOLUTION` of `b` (at least 1)."""
    b = evidence.batch_size_for(headroom)
    needs = evidence.needs()
    if not b or needs is None:
        return False
    step = max(1, int(RESOLUTION * b))
    reading = dict(needs)
    room = evidence.room(headroom)
    seen = [o for o in evidence.observations if o.how != AIMED or o.ladder]
    below = any(b - step <= o.batch_size <= b for o in seen)
    above = any(b < o.batch_size <= b + step and o.how != AIMED
                and (evidence.failed(o) or reading.get(o.batch_size, 0.0) > room)
                for o in seen)
    return below and above


def left_open(evidence: Evidence, headroom: float, above_limit: bool, *,
              out_of_time: bool = False, checks_stopped: bool = False
              ) -> dict[float, str]:
    """Each answer (under `headroom`, and without) that the record leaves
    unbracketed, with why, in words."""
    out: dict[float, str] = {}
    for h in dict.fromkeys([headroom, 0.0]):
        if evidence.batch_size_for(h) is None or bracketed(evidence, h):
            continue
        low, high, _ = room_gap(evidence, h)
        if out_of_time:
            why = "out of time"
        elif checks_stopped:
            why = "the checks ran out of sizes"
        elif not above_limit:
            why = ("without an allocator cap no size above the answer is tried; "
                   "set one with configure_memory(memory_limit_mb=...)")
        else:
            why = "the sizes around it could not be told apart"
        if low is not None and high is not None:
            what = f"{low} fits, {high} does not"
        elif low is not None:
            what = f"{low} fits, nothing above it was measured"
        else:
            what = "no size was seen to fit"
        out[h] = f"{what}: {why}"
    return out
