"""Checking the line's answer, and finding the ceiling, by compiling the step.

XLA's plans grow with the batch as the line says until a plan would not
fit the device, where XLA starts recomputing activations instead. So the
line's answer under the headroom is checked (and corrected) at the sizes
around it, and the ceiling is searched upward from the line's answer
without headroom. The step is compiled at each size, never run.

To be quick, the searches run rounds of compilations side by side
(`keras_memwatch.capacity.xla_compile`). On a GPU, where a compilation as
`fit` makes it is mostly autotuning, which compiles hundreds of candidate
kernels on every core (an H200, a transformer: 11.6 s alone, 16-17 s for
two side by side, in threads or in processes alike), both searches aim
with compilations without autotuning (`xla_compile.AIM_OPTIONS`), and
only the sizes the answers rest on are compiled as `fit` compiles them:
the ceiling, where autotuning can change the plan much more, since XLA
recomputes activations there; then the answer, only where the ceiling's
check leaves it unproven (`_answer_proven`). The ceiling is told to 3%.

The ceiling is aimed from the answer's first round on, beside the
answer's later rounds, in a table of its own: plans far above the answer,
where XLA recomputes, are not monotonic (the block's: 5.27 GiB at batch
326, 5.35 GiB at 295) and would move the answer. Compilations are bound
by the CPU, so this saves only the time a round leaves cores idle.
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
AGREE = 0.01  # autotuned and aimed plans that agree this well are one
AUTOTUNED_WIDTH = 2  # autotuned compilations a round of the answer's search (GPU)
ANSWER_WIDTH = 4  # aimed compilations a round of the answer's search (GPU)
MAX_CEILING_AUTOTUNED = 6  # autotuned compilations for the ceiling (GPU)
#: The ceiling's aimed search steps up by this from the answer (GPU): XLA's
#: recomputation put ceilings 1.3-1.7x above it (five models on an H200), so
#: a first round of six sizes leaves a bracket that one more round, of
#: three sizes where batches are in the hundreds, tells to 3%.
CEILING_FACTOR = 1.12
FAR = 8  # steps down, at most, that one round of the ceiling's search jumps


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
            # both are aimed side by side, and the ceiling is checked as fit
            # compiles it. The answer is compiled so only where that check
            # leaves it unproven (`_answer_proven`).
            made = xla_compile.search([answer], aim, aimed, MAX_AIM, ANSWER_WIDTH,
                                      max_rounds=1)
            aimed_ceiling.update(aimed)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                answering = pool.submit(xla_compile.search, [answer], aim, aimed,
                                        MAX_AIM - made, ANSWER_WIDTH)
                xla_compile.search([ceiling], aim, aimed_ceiling, MAX_AIM,
                                   planner.parallel)
                answering.result()
            aimed_ceiling = {**aimed, **aimed_ceiling}
            answer, ceiling = _both_as_fit_compiles(planner, answer, ceiling, aimed,
                                                    aimed_ceiling, need, room)
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
                                aimed_above=accelerator and hi not in need,
                                aimed_answer=accelerator and lo not in need)
                   + _ceiling_text(estimate, plans, full, ceiling.lo, ceiling.hi,
                                   line_ceiling, _ceiling_how(accelerator, ceiling),
                                   aimed_above=accelerator and ceiling.hi not in need)
                   + count)
    return dataclasses.replace(estimate, predicted_batch_size=predicted,
                               ceiling_batch_size=ceiling.lo,
                               checked=_checked(plans), explanation=explanation)


def _both_as_fit_compiles(planner: xla_compile.Planner, answer: xla_compile.Target,
                          ceiling: xla_compile.Target, aimed: dict[int, float],
                          aimed_all: dict[int, float], need: dict[int, float],
                          room: float) -> tuple[xla_compile.Target, xla_compile.Target]:
    """The ceiling checked as `fit` compiles it, then the answer where that
    leaves it unproven (`_answer_proven`); `need` receives the plans."""
    ceiling, tuned = _ceiling_as_fit_compiles(planner, ceiling, aimed_all)
    need.update(tuned)
    if not _answer_proven(answer.lo, ceiling, aimed_all, need):
        answer = _as_fit_compiles(planner, answer, aimed, need, room)
        ceiling.admit(need)  # the answer's may be the largest that fits
    return answer, ceiling


def _answer_proven(answer: Optional[int], ceiling: xla_compile.Target,
                   aimed: dict[int, float], need: dict[int, float]) -> bool:
    """Whether the aimed answer stands without its own compilation as `fit`
    makes it (13-16 s of an H200's every core, a fifth of the estimate).

    It does where the ceiling's check found a size at least as large that
    fits the whole limit as `fit` compiles it (then the answer trains), and
    no size that fits as `fit` compiles it came out more than `AGREE` over
    its aimed plan: such a size needed no recomputation to fit, so the
    excess is the plans' own, and the answer, planned the same way, may
    carry it into the headroom. Sizes that fail say nothing of it: there
    XLA recomputes as far as it can, and the transformer's plans as `fit`
    compiles them came out 3-6% over the aimed ones at sizes that failed
    (248 under 6 GiB, 160 and 164 under 4 GiB) and 0.8-3.2% under at its
    answers. So the answer's plan as `fit` compiles it is bounded, not
    known: an H200 put it from 3.2% under the aimed one to within 0.2% of
    it at the answers of six models, inside the headroom.
    """
    if answer is None:
        return True
    if ceiling.lo is None or ceiling.lo < answer:
        return False
    return not any(need[b] <= ceiling.free and (r := _ratio(b, aimed, need)) is not None
                   and r > 1 + AGREE for b in need)


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


def _ratio(size: Optional[int], aimed: dict[int, float],
           need: dict[int, float]) -> Optional[float]:
    """The plan of `size` as `fit` compiles it over the aimed one, or None
    where either is unknown. A size not aimed is read off the line between
    the aimed sizes on either side of it (the ceiling's walk goes between
    them)."""
    if size is None or size not in need:
        return None
    known = {b: v for b, v in aimed.items() if math.isfinite(v)}
    below = max((b for b in known if b <= size), default=None)
    above = min((b for b in known if b >= size), default=None)
    if below is None or above is None:
        return None
    aimed_bytes = known[below] if below == above else (
        known[below] + (known[above] - known[below]) * (size - below) / (above - below))
    if not math.isfinite(need[size]) or aimed_bytes <= 0:
        return None
    return need[size] / aimed_bytes


def _ceiling_as_fit_compiles(planner: xla_compile.Planner,
                             aimed_ceiling: xla_compile.Target,
                             aimed: dict[int, float]
                             ) -> tuple[xla_compile.Target, dict[int, float]]:
    """The ceiling checked with the compilation `fit` makes (autotuned).

    Near the ceiling, where XLA recomputes activations, autotuning can
    move the plan far more than at the answer, either way (an H200 under
    6 GiB, against the aimed plans: the transformer's 0.8% under at its
    answer, 4% under at 241, then 3% over at 248, past a jump at 243, which
    ran out of memory). So the aimed ceiling is compiled as `fit` compiles
    it, and where it fits, the bracket stands (the transformer's aimed
    ceilings, 235 and 240 in two runs, fitted; 241 was the largest that
    trained), unless its plan as `fit` compiles it is more than `AGREE`
    smaller than the aimed one: then more may fit, and the search goes up.
    Where it does not fit, the search goes down a step (3%) at a time, or
    where the line through the lowest failing plans reaches the limit; far
    off (more than `FAR` steps), the aimed plans scaled by the ratio of the
    two plans aim instead. One compilation a round, `MAX_CEILING_AUTOTUNED`
    in all: autotuning takes every core, so two side by side took about as
    long as one after the other (an H200: 25-27 s, one 13-16 s), and the
    first often settles what the second was for (the transformer under
    4 GiB: 160 failed, and 164 beside it failed too).

    Args:
        planner: compiles the plans.
        aimed_ceiling: the ceiling's bracket from the aimed plans.
        aimed: the aimed plans.

    Returns:
        The ceiling's bracket (`lo` None where no size tried fits) and the
        plans compiled for it.
    """
    top, above = aimed_ceiling.lo, aimed_ceiling.hi
    own: dict[int, float] = {}
    if top is None:
        return aimed_ceiling, own
    tuned = xla_compile.Target(aimed_ceiling.free, top, resolution=CEILING_RESOLUTION)

    def by_ratio() -> Optional[int]:
        return _aimed_by_ratio(aimed, own, tuned.free)

    size: Optional[int] = top
    while size is not None and size not in own:
        xla_compile.record(planner.plans([size]), own)
        tuned.update(own)
        ratio = _ratio(top, aimed, own)
        smaller = ratio is not None and ratio < 1 - AGREE  # then more may fit
        if tuned.lo == top and tuned.hi is None and not smaller:
            tuned.hi = above  # it fits as fit compiles it too: the bracket stands
            break
        if tuned.done or len(own) >= MAX_CEILING_AUTOTUNED:
            break
        size = (_upward(tuned, by_ratio) if tuned.hi is None
                else _downward(tuned, own, by_ratio))
    return tuned, own


def _upward(tuned: xla_compile.Target, by_ratio: Callable[[], Optional[int]]) -> int:
    """The next size of a ceiling search where every size tried fits: a step
    up, which closes the bracket where it fails; where the aimed plans
    scaled by the ratio reach the limit further up, there (at most `FAR`
    steps up)."""
    lo = tuned.lo
    assert lo is not None
    step = tuned.step(lo)
    guess = by_ratio()
    if guess is None or guess <= lo + 2 * step:
        return lo + step
    return min(guess, lo + FAR * step)


def _downward(tuned: xla_compile.Target, own: dict[int, float],
              by_ratio: Callable[[], Optional[int]]) -> Optional[int]:
    """The next size of a ceiling search whose top does not fit: inside the
    bracket where one is closed; else a step down, or further where the
    line through the failing plans (or the ratio) says (at most `FAR`
    steps down)."""
    lo, hi = tuned.lo, tuned.hi
    assert hi is not None
    if lo is not None:
        inside = tuned.propose(1, set(own))
        return inside[0] if inside else None
    walk = hi - tuned.step(hi)
    guess = tuned.interpolate()  # None where the failing plans are flat
    if guess is not None and guess < walk - FAR * tuned.step(walk):
        guess = by_ratio()
    if guess is not None and guess < walk - 2 * tuned.step(walk):
        return max(guess, walk - FAR * tuned.step(walk), 1)
    return walk


def _aimed_by_ratio(aimed: dict[int, float], need: dict[int, float],
                    free: float) -> Optional[int]:
    """The size where the plans reach `free`: the autotuned ones where
    compiled, else the aimed ones scaled by the autotuned-to-aimed ratio
    (interpolated between the sizes compiled both ways, flat beyond them);
    None without a size compiled both ways."""
    both = sorted((b, need[b] / aimed[b]) for b in need
                  if b in aimed and aimed[b] > 0 and math.isfinite(aimed[b])
                  and math.isfinite(need[b]))
    if not both:
        return None

    def ratio(b: int) -> float:
        if b <= both[0][0]:
            return both[0][1]
        for (b1, r1), (b2, r2) in zip(both, both[1:]):
            if b <= b2:
                return r1 + (r2 - r1) * (b - b1) / (b2 - b1)
        return both[-1][1]

    scaled = xla_compile.Target(free, 1)
    estimated = {b: n * ratio(b) for b, n in aimed.items() if math.isfinite(n)}
    scaled.update({**estimated, **need})
    guess = scaled.interpolate()
    if guess is None:
        return scaled.lo
    low = scaled.lo or 1
    high = scaled.hi if scaled.hi is not None else guess + 1
    return min(max(guess, low), high - 1) if high > low else low


def _ceiling_how(accelerator: bool, ceiling: xla_compile.Target) -> str:
    """How the ceiling was planned, where plans were compiled two ways."""
    if not accelerator:
        return ""
    told = f", to {CEILING_RESOLUTION:.0%}" if ceiling.done else ""
    return f" (as `fit` compiles it{told})"


def _checked(need: dict[int, float]) -> tuple[tuple[int, int], ...]:
    """The plans compiled, as `(batch, bytes)`; failed ones left out."""
    return tuple((b, int(n)) for b, n in need.items() if math.isfinite(n))


def _bytes(n: float) -> str:
    return (format_bytes(n) if math.isfinite(n)
            else "more than the device holds (its compilation ran out of memory)")


def _answer_text(estimate: CapacityEstimate, need: dict[int, float], room: float,
                 lo: Optional[int], hi: Optional[int], line: int,
                 aimed_above: bool = False, aimed_answer: bool = False) -> str:
    """The explanation of the answer under the headroom; with `aimed_above`
    (`aimed_answer`), the plan of `hi` (`lo`) is said to be an aimed one."""
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
    how = (" without autotuning (the larger ceiling fits as `fit` compiles it)"
           if aimed_answer else "")
    return (f"Largest batch {lo} on {where}, checked by compiling the "
            f"step{how}: it needs {format_bytes(need[lo])} of {under}, "
            f"{beyond}; {fitted}.")


def _ceiling_text(estimate: CapacityEstimate, need: dict[int, float], full: float,
                  ceiling: Optional[int], above: Optional[int],
                  line_ceiling: int, how: str = "", aimed_above: bool = False) -> str:
    """The explanation of the ceiling without headroom, or `""`; with
    `aimed_above`, the plan of `above` is said to be an aimed one."""
    if ceiling is None:
        return ("" if above is None or not how else
                f" Without headroom, batch {above}, the smallest tried for the "
                f"ceiling, would need {_bytes(need[above])} of {format_bytes(full)}"
                f"{how}: the ceiling lies lower and is not known.")
    text = (f" Without headroom, up to batch {ceiling} fits{how} "
            f"({format_bytes(need[ceiling])} of {format_bytes(full)}"
            + ("" if above is None else
               f"; {above} would need {_bytes(need[above])}"
               + (" as planned without autotuning" if aimed_above else "")) + ")")
    line_bytes = ((estimate.step_static_bytes or 0)
                  + (estimate.per_sample_bytes or 0) * ceiling)
    if ceiling > line_ceiling and need[ceiling] < 0.95 * line_bytes:
        text += (f": XLA plans {1 - need[ceiling] / line_bytes:.0%} "
                 "less there than the line, by recomputing activations "
                 "(slower steps)")
    return text + "."
