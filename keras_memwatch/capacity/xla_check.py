"""Checking the line's answer, and finding the ceiling, by compiling the step.

XLA's plans grow with the batch as the line says until a plan would not
fit the device, where XLA starts recomputing activations instead. So the
line's answer under the headroom is checked (and corrected) at the sizes
around it, and the ceiling is searched upward from the line's answer
without headroom. The step is compiled at each size, never run.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

from keras_memwatch import xla_plan
from keras_memwatch.capacity.result import CapacityEstimate
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")

MAX_CHECKS = 10  # compilations of XLA's plan after the fit, per search


def check_compiled(estimate: CapacityEstimate, model: Any,
                   sample: tuple[Any, Any]) -> CapacityEstimate:
    """Checks an estimate of method `"xla"` against XLA's compiled plans.

    Args:
        estimate: the line's estimate, with a prediction.
        model: the model measured.
        sample: `(x, y)`, a batch of one sample.

    Returns:
        The estimate with `predicted_batch_size`, `ceiling_batch_size`,
        `checked` and `explanation` from the compiled plans; where a plan
        cannot be compiled, the line's estimate, saying so.
    """
    assert estimate.limit_bytes is not None and estimate.in_use_bytes is not None
    full = estimate.limit_bytes - estimate.in_use_bytes
    room = full - estimate.limit_bytes * estimate.headroom
    need: dict[int, int] = {}

    def fitting(free: float) -> Callable[[int], bool]:
        def fits(size: int) -> bool:
            if size not in need:
                need[size] = xla_plan.working_bytes(model, sample, size)
            return need[size] <= free
        return fits

    line = estimate.predicted_batch_size or 0
    line_ceiling = estimate.batch_size_for(0.0) or 0
    try:
        lo, hi = xla_plan.largest_that_fits(fitting(room), max(line, 1), MAX_CHECKS)
        ceiling, above = xla_plan.largest_that_fits(
            fitting(full), max(line_ceiling, lo or 1), MAX_CHECKS)
    except Exception as e:
        logger.warning("estimate_max_batch_size: XLA's plan could not be compiled "
                       "at larger sizes (%r); the prediction is the line's", e)
        return dataclasses.replace(
            estimate, checked=tuple(need.items()),
            explanation=f"{estimate.explanation} Not checked by compiling the step "
                        f"({type(e).__name__}).")
    predicted = lo if lo is not None else 0 if hi == 1 else None
    explanation = (_answer_text(estimate, need, room, lo, hi, line)
                   + _ceiling_text(estimate, need, full, ceiling, above, line_ceiling)
                   + f" {len(need)} compilations.")
    return dataclasses.replace(estimate, predicted_batch_size=predicted,
                               ceiling_batch_size=ceiling,
                               checked=tuple(need.items()), explanation=explanation)


def _answer_text(estimate: CapacityEstimate, need: dict[int, int], room: float,
                 lo: Optional[int], hi: Optional[int], line: int) -> str:
    """The explanation of the answer under the headroom."""
    where = f"{estimate.device} ({estimate.backend}, {estimate.measured_by})"
    sizes = estimate.fit_batch_sizes
    fitted = (f"the line fitted over batch sizes {sizes[0]}-{sizes[-1]} "
              f"({format_bytes(estimate.per_sample_bytes or 0)} per sample, within "
              f"{estimate.residual:.1%}) gives {line}")
    under = (f"the {format_bytes(room)} free under the {estimate.limit_source} "
             f"{format_bytes(estimate.limit_bytes)} less {estimate.headroom:.0%} "
             "headroom")
    if lo is None:
        assert hi is not None
        head = (f"Not even a batch of 1 fits on {where}" if hi == 1 else
                f"No prediction on {where}: no size checked fits")
        return (f"{head}: compiled for batch {hi}, the step needs "
                f"{format_bytes(need[hi])} of {under}; {fitted}.")
    beyond = ("every size checked fits" if hi is None else
              f"batch {hi} would need {format_bytes(need[hi])}")
    return (f"Largest batch {lo} on {where}, checked by compiling the "
            f"step: it needs {format_bytes(need[lo])} of {under}, "
            f"{beyond}; {fitted}.")


def _ceiling_text(estimate: CapacityEstimate, need: dict[int, int], full: float,
                  ceiling: Optional[int], above: Optional[int],
                  line_ceiling: int) -> str:
    """The explanation of the ceiling without headroom, or `""`."""
    if ceiling is None:
        return ""
    text = (f" Without headroom, up to batch {ceiling} fits "
            f"({format_bytes(need[ceiling])} of {format_bytes(full)}"
            + ("" if above is None else
               f"; {above} would need {format_bytes(need[above])}") + ")")
    line_bytes = ((estimate.step_static_bytes or 0)
                  + (estimate.per_sample_bytes or 0) * ceiling)
    if ceiling > line_ceiling and need[ceiling] < 0.95 * line_bytes:
        text += (f": XLA plans {1 - need[ceiling] / line_bytes:.0%} "
                 "less there than the line, by recomputing activations "
                 "(slower steps)")
    return text + "."
