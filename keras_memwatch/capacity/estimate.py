"""`estimate_max_batch_size`: the argument checks, the run and the result."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Optional

from keras_memwatch import options
from keras_memwatch.capacity.batches import Batches
from keras_memwatch.capacity.fit import LinearFit, fit_linear, predict_batch_size
from keras_memwatch.capacity.ladder import Ladder, climb
from keras_memwatch.capacity.meter import METHOD_WORDS, METHODS, Meter
from keras_memwatch.capacity.model_state import ModelState, build_for_training
from keras_memwatch.capacity.result import (
    LIMIT_HOST,
    CapacityEstimate,
    check_headroom,
    signed_bytes,
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
) -> CapacityEstimate:
    """Predicts the largest training batch that fits in the device's memory.

    Trains `model` for two steps at each of a few small batch sizes,
    measures the second step's working memory, fits a line through
    (batch size, working memory), and solves for the largest batch under
    the device's limit less `headroom`: `floor((limit x (1 - headroom) -
    static) / per_sample)`, where `static` is the memory in use before the
    steps plus the line's constant part. Afterwards every variable of the
    model, its optimizer (slots, iteration counter) and its metrics holds
    exactly the value it had before. A model or optimizer not built yet is
    built first (as `fit` would), and stays built.

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
    sizes = _check_arguments(model, trial_sizes, headroom, method)
    import keras

    backend = keras.backend.backend()
    data = Batches(x, y)
    build_for_training(model, data.take(1))
    state = ModelState(model)
    meter = Meter(backend, device, method)
    try:
        ladder = climb(model, data, meter, sizes, headroom)
    finally:
        _put_back(state, meter)
    estimate = _result(ladder, meter, backend, headroom)
    if meter.method == "xla" and estimate.predicted_batch_size is not None:
        estimate = check_compiled(estimate, model, data.take(1))
    logger.info("%s", estimate.explanation)
    return estimate


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
        if meter.method == "reserved":
            import torch

            torch.cuda.empty_cache()
        meter.close()


def _result(ladder: Ladder, meter: Meter, backend: str,
            headroom: float) -> CapacityEstimate:
    """The estimate from the ladder's measurements, with its explanation."""
    fit = fit_linear(ladder.points)
    where = f"{meter.device} ({backend}, {METHOD_WORDS[meter.words]})"
    limit_bytes, source, detail = ladder.limit
    common: dict[str, Any] = dict(
        limit_bytes=limit_bytes, limit_source=source, limit_detail=detail,
        measurements=tuple(ladder.points), headroom=headroom,
        in_use_bytes=meter.baseline, device=meter.device, backend=backend,
        method=meter.method, measured_by=METHOD_WORDS[meter.words])
    reason = _no_prediction_reason(fit, ladder, meter)
    if reason is not None:
        return _without_prediction(fit, ladder, reason, where, common)
    return _with_prediction(fit, ladder, meter, where, headroom, common)


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
                        common: dict[str, Any]) -> CapacityEstimate:
    """An estimate without a prediction, saying why."""
    limit_bytes, source, detail = ladder.limit
    sizes = [b for b, _ in ladder.points]
    measured = (f"measured at batch sizes {sizes_text(sizes)}" if sizes
                else "nothing measured")
    if ladder.hidden:
        measured += (f"; sizes {sizes_text(ladder.hidden)} hidden under an earlier "
                     "high-water mark")
    if ladder.stopped:
        measured += f"; {ladder.stopped}"
    explanation = f"No prediction on {where}: {reason}; {measured}"
    if limit_bytes is not None:
        explanation += f"; limit: {source} {format_bytes(limit_bytes)} ({detail})"
    explanation += "."
    fitted = fit if fit.static_bytes == fit.static_bytes else None
    return CapacityEstimate(
        predicted_batch_size=None, static_bytes=None,
        per_sample_bytes=fitted.per_sample_bytes if fitted else None,
        residual=fitted.residual if fitted else None,
        r_squared=fitted.r_squared if fitted else None,
        fit_batch_sizes=fit.batch_sizes if fitted else (),
        step_static_bytes=int(fitted.static_bytes) if fitted else None,
        explanation=explanation, **common)


def _with_prediction(fit: LinearFit, ladder: Ladder, meter: Meter, where: str,
                     headroom: float, common: dict[str, Any]) -> CapacityEstimate:
    """The line's prediction under the limit less the headroom."""
    limit_bytes, source, detail = ladder.limit
    assert limit_bytes is not None and meter.baseline is not None
    static = int(round(meter.baseline + fit.static_bytes))
    predicted = predict_batch_size(limit_bytes, headroom, static, fit.per_sample_bytes)
    fit_sizes = fit.batch_sizes
    explanation = (
        f"Largest batch {predicted} on {where}: {source} "
        f"{format_bytes(limit_bytes)} less {headroom:.0%} headroom, minus "
        f"{format_bytes(static)} that does not grow with the batch "
        f"({format_bytes(meter.baseline)} in use {signed_bytes(fit.static_bytes)} "
        f"constant per step), at {format_bytes(fit.per_sample_bytes)} per sample; "
        f"linear within {fit.residual:.1%} over batch sizes "
        f"{fit_sizes[0]}-{fit_sizes[-1]}"
        + (f"; size(s) {sizes_text(ladder.hidden)} hidden under an earlier "
           "high-water mark" if ladder.hidden else "")
        + (f"; {ladder.stopped}" if ladder.stopped else "")
        + (f" ({detail})" if source == LIMIT_HOST else "") + ".")
    if predicted == 0:
        explanation = "Not even a batch of 1 fits: " + explanation
    logger.info("%s", explanation)
    return CapacityEstimate(
        predicted_batch_size=predicted, static_bytes=static,
        per_sample_bytes=fit.per_sample_bytes, residual=fit.residual,
        r_squared=fit.r_squared, fit_batch_sizes=fit_sizes,
        step_static_bytes=int(round(fit.static_bytes)), explanation=explanation,
        **common)
