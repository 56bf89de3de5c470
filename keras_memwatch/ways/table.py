"""The ways-to-fit table: a row per lever from its measurement, and which
levers to measure together."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Optional

from keras_memwatch.capacity.steps import build_left_words
from keras_memwatch.explain.ways_text import AS_IS, WAYS_COLUMNS
from keras_memwatch.ways.levers import Lever, compatible
from keras_memwatch.ways.measure import Measured

__all__ = ["AS_IS", "WAYS_COLUMNS", "Account", "best_combinations", "frame",
           "measured_row", "unmeasured_row"]


class Account:
    """The one account every row is read in: the limit, what is in use
    apart from any model's state, the headroom, and the model as it is.

    Args:
        as_is: the model as it is, measured.
        headroom: the fraction of the limit kept free.
    """

    def __init__(self, as_is: Measured, headroom: float):
        self.as_is = as_is
        self.headroom = headroom
        self.limit = as_is.limit_bytes
        self.base = max(as_is.in_use_bytes - as_is.state_bytes, 0)
        self.need: Optional[int] = None
        self.need, _ = self.read(as_is)[:2]

    def read(self, m: Measured, accumulation: int = 1) -> tuple[Any, ...]:
        """`(need_bytes, how, largest_batch, fits)` of a measurement."""
        evidence = m.evidence(self.base, self.limit)
        step, how = m.step_bytes(evidence)
        need = None if step is None else m.state_bytes + step
        device_largest = (evidence.batch_size_for(self.headroom)
                          if self.limit is not None else None)
        largest = None if device_largest is None else device_largest * accumulation
        if device_largest is not None:
            fits: Optional[bool] = device_largest >= m.device_batch
        elif need is not None and self.limit is not None:
            fits = need <= self.limit * (1 - self.headroom) - self.base
        else:
            fits = None
        return need, how, largest, fits

    def ratio(self, m: Measured) -> Optional[float]:
        """`m`'s seconds a sample over the model as it is, at the largest
        batch both timed (each at its own largest where they share none)."""
        a, b = self.as_is.sample_seconds, m.sample_seconds
        if not a or not b:
            return None
        shared = set(a) & set(b)
        size_a, size_b = (max(shared),) * 2 if shared else (max(a), max(b))
        return None if a[size_a] <= 0 else round(b[size_b] / a[size_a], 3)


def measured_row(lever: str, change: str, notes: str, m: Measured,
                 account: Account, accumulation: int = 1) -> dict[str, Any]:
    need, how, largest, fits = account.read(m, accumulation)
    if accumulation > 1:
        how += f", {accumulation} steps of {m.device_batch}"
    if m.left_open:
        how += f"; {m.left_open}"
    saved = None if need is None or account.need is None else account.need - need
    return {"lever": lever, "change": change, "need_bytes": need,
            "saved_bytes": saved, "largest_batch": largest,
            "step_time_ratio": account.ratio(m), "fits": fits, "how": how,
            "notes": notes}


def as_is_notes(m: Measured) -> str:
    """The first row's notes: the model as compiled, and what Keras's build
    left that `CollectCycles` would free (not measured)."""
    size, left = m.build_left
    if not left:
        return "the model as compiled"
    return f"the model as compiled; {build_left_words(size, left)} (not measured)"


def unmeasured_row(lever: str, change: str, how: str, notes: str) -> dict[str, Any]:
    """A lever's row without figures: why it was not measured."""
    return {"lever": lever, "change": change, "need_bytes": None,
            "saved_bytes": None, "largest_batch": None, "step_time_ratio": None,
            "fits": None, "how": how, "notes": notes}


def best_combinations(saved: Sequence[tuple[Lever, int]],
                      sizes: Sequence[int] = (2, 3)) -> list[list[Lever]]:
    """For each size, the compatible levers whose single savings add up to
    the most (only levers that saved something), to be measured together."""
    useful = [(lever, s) for lever, s in saved if s is not None and s > 0]
    out = []
    for n in sizes:
        best = max((c for c in itertools.combinations(useful, n)
                    if compatible([lever for lever, _ in c])),
                   key=lambda c: sum(s for _, s in c), default=None)
        if best is not None:
            out.append([lever for lever, _ in best])
    return out


def frame(first: dict[str, Any], levers: list[dict[str, Any]],
          combos: list[dict[str, Any]], attrs: dict[str, Any]) -> Any:
    """The DataFrame: the model as it is, the levers by what they save (the
    most first; those not measured last), then the combinations."""
    import pandas as pd

    levers = sorted(levers, key=lambda r: (r["saved_bytes"] is None,
                                           -(r["saved_bytes"] or 0)))
    table = pd.DataFrame([first] + levers + combos, columns=list(WAYS_COLUMNS))
    for column in ("need_bytes", "saved_bytes", "largest_batch"):
        table[column] = table[column].astype("Int64")
    table["step_time_ratio"] = table["step_time_ratio"].astype("float64")
    table["fits"] = table["fits"].astype("boolean")
    table.attrs.update(attrs)
    return table
