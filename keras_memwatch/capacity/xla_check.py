"""Checking the line's answer, and finding the ceiling, by compiling the step.

XLA's plans grow with the batch as the line says until a plan would not
fit the device, where XLA starts recomputing activations instead. So the
line's answer under the headroom is checked (and corrected) at the sizes
around it, and the ceiling is searched upward from the line's answer
without headroom. The step is compiled at each size, never run.

To be quick, the searches run rounds of compilations side by side
(`keras_memwatch.capacity.xla_compile`). On a GPU, where a compilation as
`fit` makes it is mostly autotuning, which compiles hundreds of candidate
kernels on every core (an H200: 13-16 s each, two side by side as long as
two in turn), both searches aim with compilations without autotuning
(`xla_compile.AIM_OPTIONS`, about half the time), and one size is compiled
as `fit` compiles it: the answer, the size `fit` then finds in JAX's
cache. The ceiling is told to 3% by the aimed plans alone (`_ceiling_text`
says how close that comes).

The ceiling is aimed from the answer's first round on, beside the
answer's later rounds and its compilation as `fit` makes it, in a table of
its own: plans far above the answer, where XLA recomputes, are not
monotonic (the block's: 5.27 GiB at batch 326, 5.35 GiB at 295) and would
move the answer. Compilations are bound by the CPU, so this saves the time
a round leaves cores idle: on an H200, the ceiling's second aimed round
(13 s alone) and the answer's compilation as `fit` makes it (16 s alone)
took 16 s side by side (`gpt`: its ceiling's first round and its answer's
compilation 20 s together, where they had taken 12 s and 16 s in turn).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import time
from typing import Any, Callable, Optional

from keras_memwatch.capacity import xla_compile
from keras_memwatch.capacity.result import CapacityEstimate
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")

MAX_CHECKS = 10  # compilations of XLA's plan after the fit, per search
MAX_AIM = 24  # compilations without autotuning, per search (GPU)
CEILING_RESOLUTION = 0.03  # the ceiling without headroom is told to 3%
AUTOTUNED_WIDTH = 2  # autotuned compilations a round of the answer's search (GPU)
ANSWER_WIDTH = 4  # aimed compilations a round of the answer's search (GPU)
#: The ceiling's aimed search steps up by this from the answer (GPU): XLA's
#: recomputation put ceilings 1.3-1.7x above it (five models on an H200), so
#: a first round of six sizes leaves a bracket that one more round, of
#: three sizes where batches are in the hundreds, tells to 3%.
CEILING_FACTOR = 1.12


def _quiet(message: str) -> None:
    logger.info("%s", message)


def check_compiled(estimate: CapacityEstimate, model: Any, sample: tuple[Any, Any],
                   progress: Callable[[str], None] = _quiet,
                   planner: Optional[xla_compile.Planner] = None) -> CapacityEstimate:
    """Checks an estimate of method `"xla"` against XLA's compiled plans.

    Args:
        estimate: the line's estimate, with a prediction.
        model: the model measured.
        sample: `(x, y)`, a batch of one sample.
        progress: receives a line per compilation.
        planner: compiles the plans. Defaults to a new
            `xla_compile.Planner`.

    Returns:
        The estimate with `predicted_batch_size`, `ceiling_batch_size`,
        `checked` and `explanation` from the compiled plans; where a plan
        cannot be compiled, the line's estimate, saying so.
    """
    assert estimate.limit_bytes is not None and estimate.in_use_bytes is not None
    began = time.perf_counter()
    planner = planner or xla_compile.Planner(model, sample, progress)
    full = estimate.limit_bytes - estimate.in_use_bytes
    room = full - estimate.limit_bytes * estimate.headroom
    need: dict[int, float] = {}  # as fit compiles the step
    aimed: dict[int, float] = {}  # the answer's, without autotuning (GPU)
    aimed_ceiling: dict[int, float] = {}  # the ceiling's
    line = estimate.predicted_batch_size or 0
    line_ceiling = estimate.batch_size_for(0.0) or 0
    accelerator = planner.aim_options is not None
    ceiling_start = max(line_ceiling, line, 1)
    answer = xla_compile.Target(room, max(line, 1))
    ceiling = xla_compile.Target(full, ceiling_start, more_likely=accelerator,
                                 resolution=CEILING_RESOLUTION,
                                 factor=CEILING_FACTOR if accelerator else 1.25)
    try:
        if accelerator:
            def aim(sizes: list[int]) -> dict[int, Any]:
                return planner.plans(sizes, aim=True)

            # The answer's first round bounds the ceiling's search too; then
            # the ceiling is aimed while the answer is aimed on and compiled
            # as fit compiles it.
            made = xla_compile.search([answer], aim, aimed, MAX_AIM, ANSWER_WIDTH,
                                      max_rounds=1)
            aimed_ceiling.update(aimed)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                answering = pool.submit(_answer, planner, aim, answer, aimed,
                                        MAX_AIM - made, need, room)
                xla_compile.search([ceiling], aim, aimed_ceiling, MAX_AIM,
                                   planner.parallel)
                answer = answering.result()
            aimed_ceiling = {**aimed, **aimed_ceiling}
        else:
            xla_compile.search([answer, ceiling], planner.plans, need,
                               2 * MAX_CHECKS, planner.parallel)
    except Exception as e:
        logger.warning("estimate_max_batch_size: XLA's plan could not be compiled "
                       "at larger sizes (%r); the prediction is the line's", e)
        return dataclasses.replace(
            estimate, checked=_checked({**aimed, **aimed_ceiling, **need}),
            explanation=f"{estimate.explanation} Not checked by compiling the step "
                        f"({type(e).__name__}).")
    plans = {**aimed_ceiling, **need}
    lo, hi = answer.lo, answer.hi
    predicted = lo if lo is not None else 0 if hi == 1 else None
    seconds = time.perf_counter() - began
    count = (f" {planner.compilations} compilations"
             + (f" ({planner.aim_compilations} without autotuning, "
                f"{planner.parallel} side by side)" if planner.aim_compilations
                else f", {planner.parallel} side by side" if planner.parallel > 1
                else "")
             + f", {seconds:.0f} s.")
    explanation = (_answer_text(estimate, plans, room, lo, hi, line,
                                aimed_above=accelerator and hi not in need)
                   + _ceiling_text(estimate, plans, full, ceiling.lo, ceiling.hi,
                                   line_ceiling, aimed=accelerator,
                                   told=ceiling.done)
                   + count)
    return dataclasses.replace(estimate, predicted_batch_size=predicted,
                               ceiling_batch_size=ceiling.lo,
                               checked=_checked(plans), explanation=explanation)


def _answer(planner: xla_compile.Planner,
            aim: Callable[[list[int]], dict[int, Any]], answer: xla_compile.Target,
            aimed: dict[int, float], budget: int, need: dict[int, float],
            room: float) -> xla_compile.Target:
    """The answer's aimed search to its end, then its check as `fit`
    compiles it (`_as_fit_compiles`)."""
    xla_compile.search([answer], aim, aimed, budget, ANSWER_WIDTH)
    return _as_fit_compiles(planner, answer, aimed, need, room)


def _as_fit_compiles(planner: xla_compile.Planner, aimed_answer: xla_compile.Target,
                     aimed: dict[int, float], need: dict[int, float],
                     room: float) -> xla_compile.Target:
    """The answer checked with the compilation `fit` makes (autotuned).

    Below the sizes where XLA recomputes activations, autotuning often
    changes the plan by little (a transformer on an H200: equal to 0.1%
    from batch 140 to 155), so one compilation of the aimed answer confirms
    it, and `fit` at that size then finds it in JAX's cache. Where that
    plan fits, the answer stands, even where it is smaller than the aimed
    one: a search upward would take autotuned rounds of 15-23 s for a few
    percent more (the transformer under 4 GiB on an H200: 3.2% smaller at
    100, and 103 fitted too). Where it does not fit, the answer is aimed
    again by the aimed plans scaled by that ratio and searched with
    autotuned compilations, two at a time: below the recomputation the
    line through the plans aims well, and a size with the one above it
    brackets the answer in one round (two side by side took 16-27 s on an
    H200, one 11.6-16 s).
    """
    lo = aimed_answer.lo
    if lo is None:
        return aimed_answer
    got = xla_compile.record(planner.plans([lo]), need)[lo]
    if got <= room:
        confirmed = xla_compile.Target(room, lo)
        confirmed.lo, confirmed.hi = lo, aimed_answer.hi
        return confirmed
    start = lo
    if math.isfinite(got) and aimed[lo] > 0:
        reaim = xla_compile.Target(room * aimed[lo] / got, lo)
        reaim.update(aimed)
        start = reaim.interpolate() or lo
    confirmed = xla_compile.Target(room, max(start, 1))
    xla_compile.record(
        planner.plans([confirmed.start, confirmed.start + confirmed.step(start)]), need)
    xla_compile.search([confirmed], planner.plans, need, MAX_CHECKS - 3,
                       AUTOTUNED_WIDTH)
    return confirmed


def _checked(need: dict[int, float]) -> tuple[tuple[int, int], ...]:
    """The plans compiled, as `(batch, bytes)`; failed ones left out."""
    return tuple((b, int(n)) for b, n in need.items() if math.isfinite(n))


def _bytes(n: float) -> str:
    return (format_bytes(n) if math.isfinite(n)
            else "more than the device holds (its compilation ran out of memory)")


def _answer_text(estimate: CapacityEstimate, need: dict[int, float], room: float,
                 lo: Optional[int], hi: Optional[int], line: int,
                 aimed_above: bool = False) -> str:
    """The explanation of the answer under the headroom; with `aimed_above`,
    the plan of `hi` is said to be an aimed one."""
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
                f"{_bytes(need[hi])} of {under}; {fitted}.")
    beyond = ("every size checked fits" if hi is None else
              f"batch {hi} would need {_bytes(need[hi])}"
              + (" as planned without autotuning" if aimed_above else ""))
    return (f"Largest batch {lo} on {where}, checked by compiling the step: it "
            f"needs {format_bytes(need[lo])} of {under}, {beyond}; {fitted}.")


def _ceiling_text(estimate: CapacityEstimate, need: dict[int, float], full: float,
                  ceiling: Optional[int], above: Optional[int], line_ceiling: int,
                  aimed: bool = False, told: bool = False) -> str:
    """The explanation of the ceiling without headroom, or `""`; with
    `aimed` (a GPU), its plans are said to be aimed ones, and with `told`,
    told to `CEILING_RESOLUTION`.

    An aimed ceiling is not checked as `fit` compiles it, so it can lie a
    percent or two either side of the largest batch that trains. Of six
    estimates on an H200 (five models under 6 GiB, the transformer also
    under 4 GiB; each size a job of 150 steps in a new process), four
    ceilings trained, 0-2.3% below the largest batch that trained, and two
    ran out of memory, one batch above it (`gpt`: 95, where 94 trained; the
    transformer under 4 GiB: 160, where 159 trained). Checking it as `fit`
    compiles it took one or two compilations of 13-16 s, which put those
    two estimates over a minute.
    """
    how = " as planned without autotuning" if aimed else ""
    if ceiling is None:
        return ("" if above is None or not aimed else
                f" Without headroom, batch {above}, the smallest tried for the "
                f"ceiling, would need {_bytes(need[above])} of {format_bytes(full)}"
                f"{how}: the ceiling lies lower and is not known.")
    told_to = f", to {CEILING_RESOLUTION:.0%}" if aimed and told else ""
    text = (f" Without headroom, up to batch {ceiling} fits{how}{told_to} "
            f"({format_bytes(need[ceiling])} of {format_bytes(full)}"
            + ("" if above is None else f"; {above} would need {_bytes(need[above])}")
            + ")")
    line_bytes = ((estimate.step_static_bytes or 0)
                  + (estimate.per_sample_bytes or 0) * ceiling)
    if ceiling > line_ceiling and need[ceiling] < 0.95 * line_bytes:
        text += (f": XLA plans {1 - need[ceiling] / line_bytes:.0%} "
                 "less there than the line, by recomputing activations "
                 "(slower steps)")
    return text + "." + (" Autotuning, as `fit` compiles the step, moves such "
                         "plans by a few percent either way, so the largest batch "
                         "that trains can lie a percent or two either side."
                         if aimed else "")
