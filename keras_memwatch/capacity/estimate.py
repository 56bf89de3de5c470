"""`estimate_max_batch_size`: the argument checks, the run and the result."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch import options
from keras_memwatch.capacity import run_ahead, xla_compile
from keras_memwatch.capacity.batches import Batches
from keras_memwatch.capacity.confirm import confirm_by_training
from keras_memwatch.capacity.fit import LinearFit, fit_linear, predict_batch_size
from keras_memwatch.capacity.ladder import Ladder, climb
from keras_memwatch.capacity.meter import METHOD_WORDS, METHODS, Meter
from keras_memwatch.capacity.model_state import ModelState, build_for_training
from keras_memwatch.capacity.result import (
    LIMIT_HOST,
    Alternative,
    CapacityEstimate,
    check_headroom,
    sizes_text,
)
from keras_memwatch.capacity.xla_check import check_compiled
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")

__all__ = ["estimate_max_batch_size"]


def estimate_max_batch_size(
    model: Any,
    x: Any,
    y: Any = None,
    *,
    trial_sizes: Optional[Sequence[int]] = None,
    device: Optional[str] = None,
    headroom: float = 0.1,
    method: str = "auto",
    progress: Optional[Callable[[str], None]] = None,
    fresh_process: Optional[bool] = None,
) -> CapacityEstimate:
    """Predicts the largest training batch that fits in the device's memory.

    Trains `model` for two steps at each of a few small batch sizes,
    measures the second step's working memory, fits a line through
    (batch size, working memory), and solves for the largest batch under
    the device's limit less `headroom`: `floor((limit x (1 - headroom) -
    static) / per_sample)`, where `static` is the memory in use before the
    steps plus the line's constant part. (JAX on a GPU reads XLA's plan of
    the step, so it compiles the step at each size and trains none.) On a
    GPU the answer is then checked: on JAX by compiling the step at the
    sizes around it, on
    PyTorch and TensorFlow by training real steps near the limit and one
    at the answer itself (see `keras_memwatch.capacity`). Afterwards every
    variable of the model, its optimizer (slots, iteration counter) and its
    metrics holds exactly the value it had before. A model or optimizer
    not built yet is built first (as `fit` would), and stays built.

    Args:
        model: a compiled Keras model.
        x: a sample batch of inputs (arrays, or lists/dicts of arrays). It
            is repeated along its first axis to make larger batches.
        y: the matching targets. Defaults to `None` (a model whose loss
            needs no targets).
        trial_sizes: the batch sizes to measure, at least three. Defaults to
            `None`: an adaptive ladder from 2 that stays below a fifth of
            the free memory (see `keras_memwatch.capacity`).
        device: `"GPU:0"`, ... or `"host"`. Defaults to `None`: the first
            GPU the backend computes on, else the host.
        headroom: fraction of the limit to keep free. Defaults to `0.1`.
        method: how a step's working memory is measured: `"auto"`,
            `"xla"` (JAX), `"reserved"` (PyTorch on a GPU) or `"probes"`.
            Defaults to `"auto"`.
        progress: receives a line of text at each step, size and
            compilation while the estimate runs (a compilation on a GPU
            takes seconds). Defaults to `None`: the lines go to the
            `keras_memwatch` logger at level INFO.
        fresh_process: PyTorch on a GPU under an allocator cap: whether the
            largest batch is searched again, and the recommendation trained,
            in new Python processes (the model saved to a temporary `.keras`
            file), each training 4 epochs of 15 steps as a job started at
            that size would (25-35 s a size on an H200). A process that has
            trained can fit up to 10% more, and two steps up to 15% more
            than a job.
            Defaults to `None`: yes where it applies; `True` logs a warning
            where it cannot run, `False` never starts a process.

    Returns:
        A `CapacityEstimate`. Its `predicted_batch_size` is `None`, and its
        `explanation` says why, when the device has no known limit, fewer
        than three sizes could be measured, or the measurements are not
        linear in the batch size.

    Raises:
        ValueError: for a model that is not compiled, bad `trial_sizes`,
            `headroom`, `device` or `method`, or arrays of unequal length.
        TypeError: for `x` or `y` that are not arrays.

    Example:

    ```python
    estimate = keras_memwatch.estimate_max_batch_size(model, x[:64], y[:64])
    print(estimate)
    model.fit(x, y, batch_size=estimate.predicted_batch_size)
    ```
    """
    began = time.perf_counter()
    sizes = _check_arguments(model, trial_sizes, headroom, method)
    if progress is not None and not callable(progress):
        raise ValueError("Expected `progress` to be a callable taking a string, or "
                         f"None. Received: progress={progress!r}")
    if fresh_process is not None:
        options.boolean("fresh_process", fresh_process)
    say = progress if progress is not None else _log
    import keras

    backend = keras.backend.backend()
    data = Batches(x, y)
    build_for_training(model, data.take(1))
    state = ModelState(model)
    meter = Meter(backend, device, method)
    try:
        ladder = climb(model, data, meter, sizes, headroom, say)
        estimate = _result(ladder, meter, backend, headroom, data)
        if (estimate.predicted_batch_size is not None and meter.on_gpu
                and meter.method in ("probes", "reserved")):
            estimate = confirm_by_training(estimate, model, data, meter,
                                           meter.cache, say, ladder.failed,
                                           fresh_process)
        if backend == "jax" and not meter.on_gpu:
            estimate = _compare_with_xla(estimate, model, data, meter)
    finally:
        _put_back(state, meter)
    if meter.method == "xla" and estimate.predicted_batch_size is not None:
        planner = xla_compile.Planner(model, data.take(1), say)

        def check(line: CapacityEstimate) -> CapacityEstimate:
            return check_compiled(line, model, planner.sample, say, planner)

        estimate = run_ahead.recheck(estimate, check(estimate), model, data, planner,
                                     check, say)
    estimate = dataclasses.replace(
        estimate, seconds=round(time.perf_counter() - began, 2))
    logger.info("%s", estimate.explanation)
    return estimate


def _log(message: str) -> None:
    logger.info("%s", message)


def _check_arguments(model: Any, trial_sizes: Optional[Sequence[int]],
                     headroom: float, method: str) -> Optional[list[int]]:
    """Checks the arguments of `estimate_max_batch_size`.

    Returns:
        The distinct `trial_sizes`, sorted, or `None` for the adaptive
        ladder.

    Raises:
        ValueError: for bad `headroom`, `trial_sizes` or `method`, or a
            model that is not compiled.
    """
    check_headroom(headroom)
    sizes = _check_sizes(trial_sizes)
    options.choice("method", method, METHODS)
    if (getattr(model, "optimizer", None) is None
            or not getattr(model, "compiled", True)):
        raise ValueError(
            "Expected a compiled model (call `model.compile(optimizer=..., loss=...)` "
            f"first). Received: {type(model).__name__} without an optimizer")
    return sizes


def _check_sizes(trial_sizes: Optional[Sequence[int]]) -> Optional[list[int]]:
    """The distinct `trial_sizes`, sorted, or `None`."""
    if trial_sizes is None:
        return None
    sizes = list(trial_sizes)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes) \
            or len(set(sizes)) < 3:
        raise ValueError(
            "Expected `trial_sizes` to hold at least three distinct positive "
            f"integers. Received: trial_sizes={trial_sizes!r}")
    return sorted(set(sizes))


def _put_back(state: ModelState, meter: Meter) -> None:
    """Restores the model's state, then frees the memory the steps held."""
    try:
        state.restore()
    finally:
        try:
            if meter.cache is not None:
                meter.cache.free()
        finally:
            meter.close()


def _result(ladder: Ladder, meter: Meter, backend: str, headroom: float,
            data: Batches) -> CapacityEstimate:
    """The estimate from the ladder's measurements, with its explanation."""
    fit = _fitted(ladder, meter)
    where = f"{meter.device} ({backend}, {METHOD_WORDS[meter.words]})"
    limit_bytes, source, detail = ladder.limit
    common: dict[str, Any] = dict(
        limit_bytes=limit_bytes, limit_source=source, limit_detail=detail,
        measurements=tuple(ladder.points), headroom=headroom,
        in_use_bytes=meter.baseline, device=meter.device, backend=backend,
        method=meter.method, measured_by=METHOD_WORDS[meter.words])
    if ladder.reserved:
        common["reserved_measurements"] = tuple(ladder.reserved)
        reserved = fit_linear(ladder.reserved)
        if reserved.linear:
            common["reserved_static_bytes"] = int(round(reserved.constant_bytes))
            common["reserved_per_sample_bytes"] = reserved.per_sample_bytes
    reason = _no_prediction_reason(fit, ladder, meter)
    if reason is not None:
        return _without_prediction(fit, ladder, reason, where, common, data)
    return _with_prediction(fit, ladder, meter, where, headroom, common, data)


def _fitted(ladder: Ladder, meter: Meter) -> LinearFit:
    """The line through the measurements. On XLA's plans, where it is not
    one, the line through the largest sizes that make one (at least three):
    small batches' plans can hold a workspace that does not grow with the
    batch, and there the line only aims the search by compilations."""
    fit = fit_linear(ladder.points)
    if fit.linear or meter.method != "xla":
        return fit
    for first in range(1, len(ladder.points) - 2):
        upper = fit_linear(ladder.points[first:])
        if upper.linear:
            return upper
    return fit


def _repeated(data: Batches, ladder: Ladder) -> str:
    """A note that the trial batches repeat the sample given, or `""`."""
    largest = max((b for b, _ in ladder.points), default=0)
    if largest <= data.n:
        return ""
    return (f"; trial batches repeat the {data.n} samples given (memory does not "
            "depend on the values)")


def _no_prediction_reason(fit: LinearFit, ladder: Ladder,
                          meter: Meter) -> Optional[str]:
    """Why the measurements predict nothing, or `None` when they do."""
    if meter.baseline is None:
        return "no step ran"
    if not fit.linear:
        reason = fit.reason or ""
        largest = max((w for _, w in ladder.points), default=None)
        if largest is not None and largest < 64 * 2**20:
            reason += (f" (the largest working memory measured is only "
                       f"{format_bytes(largest)}: pass larger trial_sizes)")
        return reason
    if ladder.limit[0] is None:
        return f"no memory limit is known for {meter.device} ({ladder.limit[2]})"
    return None


def _without_prediction(fit: LinearFit, ladder: Ladder, reason: str, where: str,
                        common: dict[str, Any], data: Batches) -> CapacityEstimate:
    """An estimate without a prediction, saying what was measured and why."""
    limit_bytes, source, detail = ladder.limit
    measured = ("measured: " + ", ".join(f"batch {b} {format_bytes(w)}"
                                         for b, w in ladder.points)
                if ladder.points else "nothing measured")
    measured += _repeated(data, ladder)
    if ladder.bounded:
        measured += f"; {ladder.bounded}"
    if ladder.hidden:
        measured += (f"; sizes {sizes_text(ladder.hidden)} hidden under an earlier "
                     "high-water mark")
    if ladder.stopped:
        measured += f"; {ladder.stopped}"
    explanation = f"No prediction on {where}: {reason}; {measured}"
    if limit_bytes is not None:
        explanation += f"; limit: {source} {format_bytes(limit_bytes)} ({detail})"
    explanation += "."
    # A refused line keeps no figures (its slope or intercept may be
    # negative, and nothing should be read from it); a line refused only
    # for want of a limit keeps them.
    kept = fit if fit.linear else None
    return CapacityEstimate(
        predicted_batch_size=None, static_bytes=None,
        per_sample_bytes=kept.per_sample_bytes if kept else None,
        residual=kept.residual if kept else None,
        r_squared=kept.r_squared if kept else None,
        fit_batch_sizes=kept.batch_sizes if kept else (),
        step_static_bytes=int(round(kept.constant_bytes)) if kept else None,
        explanation=explanation, **common)


def _with_prediction(fit: LinearFit, ladder: Ladder, meter: Meter, where: str,
                     headroom: float, common: dict[str, Any],
                     data: Batches) -> CapacityEstimate:
    """The line's prediction under the limit less the headroom."""
    limit_bytes, source, detail = ladder.limit
    assert limit_bytes is not None and meter.baseline is not None
    constant = fit.constant_bytes
    static = int(round(meter.baseline + constant))
    predicted = predict_batch_size(limit_bytes, headroom, static, fit.per_sample_bytes)
    fit_sizes = fit.batch_sizes
    per_step = (f"+ {format_bytes(constant)} constant per step" if constant > 0 else
                "and no constant part per step"
                + (" (the line reaches zero just above batch 0, within the "
                   "measurements' noise: taken as 0)" if fit.static_bytes < 0 else ""))
    explanation = (
        f"Largest batch {predicted} on {where}: {source} "
        f"{format_bytes(limit_bytes)} less {headroom:.0%} headroom, minus "
        f"{format_bytes(static)} that does not grow with the batch "
        f"({format_bytes(meter.baseline)} in use {per_step}), at "
        f"{format_bytes(fit.per_sample_bytes)} per sample; "
        f"linear within {fit.residual:.1%} over batch sizes "
        f"{fit_sizes[0]}-{fit_sizes[-1]}"
        + (f"; size(s) {sizes_text(ladder.hidden)} hidden under an earlier "
           "high-water mark" if ladder.hidden else "")
        + (f"; {ladder.stopped}" if ladder.stopped else "")
        + (f"; {ladder.bounded}" if ladder.bounded else "")
        + _repeated(data, ladder)
        + (f" ({detail})" if source == LIMIT_HOST else "") + ".")
    if predicted == 0:
        explanation = "Not even a batch of 1 fits: " + explanation
    logger.info("%s", explanation)
    return CapacityEstimate(
        predicted_batch_size=predicted, static_bytes=static,
        per_sample_bytes=fit.per_sample_bytes, residual=fit.residual,
        r_squared=fit.r_squared, fit_batch_sizes=fit_sizes,
        step_static_bytes=int(round(constant)), explanation=explanation,
        **common)


#: Why the host's peak RSS answers on the CPU, where XLA's plan says more fits.
_RSS_KEPT = ("XLA's plan counts only XLA's own buffers, not the batch's host "
             "copies, the runtime's allocations outside the plan or what the "
             "allocator keeps from earlier steps; the host's peak RSS is what the "
             "host really holds, so its answer is used")
_XLA_KEPT = ("XLA's plan needs more per batch than the host's RSS grew by (buffers "
             "the CPU runtime may reuse or never touch); the smaller answer is used")


def _compare_with_xla(estimate: CapacityEstimate, model: Any, data: Batches,
                      meter: Meter) -> CapacityEstimate:
    """JAX on the CPU: XLA's plan beside the host's RSS, and which is used.

    The plans at the ladder's sizes come from JAX's cache (the ladder's
    steps compiled them). The answer is the smaller of the two; the other
    is kept in `alternatives`, with why.
    """
    if estimate.predicted_batch_size is None or estimate.limit_bytes is None:
        return estimate
    if meter.method == "xla":
        return dataclasses.replace(estimate, explanation=(
            f"{estimate.explanation} On the CPU the default method is the host's "
            "peak RSS, which also counts what XLA's plan leaves out (the batch's "
            "host copies, the runtime's own allocations): pass method='probes' "
            "to compare."))
    try:
        points = [(b, xla_compile.plan_one(model, data.take(1), b))
                  for b, _ in estimate.measurements]
    except Exception as e:
        logger.info("estimate_max_batch_size: no XLA plan to compare (%r)", e)
        return estimate
    fit = fit_linear(points)
    if not fit.linear or estimate.in_use_bytes is None:
        return estimate
    other = predict_batch_size(estimate.limit_bytes, estimate.headroom,
                               estimate.in_use_bytes + fit.constant_bytes,
                               fit.per_sample_bytes)
    own = estimate.predicted_batch_size
    words = METHOD_WORDS["xla"]
    if other >= own:
        alternative = Alternative("xla", words, other, fit.per_sample_bytes, _RSS_KEPT)
        text = (f" Method: {estimate.measured_by} (the default on the CPU). "
                f"{words} gives {other} ({format_bytes(fit.per_sample_bytes)} per "
                f"sample against {format_bytes(estimate.per_sample_bytes or 0)} "
                f"measured): {_RSS_KEPT}.")
        return dataclasses.replace(estimate, alternatives=(alternative,),
                                   explanation=estimate.explanation + text)
    alternative = Alternative("probes", estimate.measured_by, own,
                              estimate.per_sample_bytes, _XLA_KEPT)
    text = (f" Method: {words} gives {other}, less than the {own} of "
            f"{estimate.measured_by}: {_XLA_KEPT}.")
    return dataclasses.replace(
        estimate, predicted_batch_size=other, alternatives=(alternative,),
        explanation=estimate.explanation + text)
