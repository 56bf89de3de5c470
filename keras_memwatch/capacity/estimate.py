"""`estimate_max_batch_size`: the arguments, the strategy, the run, the result."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

from keras_memwatch import options
from keras_memwatch.capacity import stored_record
from keras_memwatch.capacity.deadline import Deadline
from keras_memwatch.capacity.progress import Progress
from keras_memwatch.measure.batches import Batches
from keras_memwatch.measure.device import Device
from keras_memwatch.measure.host_memory import host_available_bytes
from keras_memwatch.measure.model_state import state_kept
from keras_memwatch.capacity.result import CapacityEstimate
from keras_memwatch.capacity.search import Search, host_largest_batch
from keras_memwatch.configure.compilation_cache import use_compilation_cache
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")

__all__ = ["METHODS", "estimate_max_batch_size"]

#: `"xla"`: XLA's plans (JAX); `"steps"`: real steps and the device's peak.
METHODS = ("auto", "xla", "steps")


def estimate_max_batch_size(
    model: Any,
    x: Any,
    y: Any = None,
    *,
    headroom: float = 0.1,
    trial_sizes: Optional[Sequence[int]] = None,
    device: Optional[str] = None,
    method: str = "auto",
    fresh_process: bool = False,
    progress: Optional[Callable[[str], None]] = None,
    max_seconds: Optional[float] = None,
    compilation_cache: Union[None, bool, str, "os.PathLike[str]"] = None,
    verbose: Union[str, int] = "auto",
) -> CapacityEstimate:
    """Finds the largest training batch that fits in the device's memory.

    Measures what a training step needs at a few small batch sizes (the
    ladder) and, on a GPU, checks the answers near the limit, then reads
    every answer from that record by one rule (see `CapacityEstimate`).
    How a step is measured:

    - JAX on a GPU (`method="xla"`): XLA's memory plan of `fit`'s step,
      compiled at each size, never run. Where a plan would not fit, XLA
      recomputes activations; `recomputes_from` says from which batch.
    - Otherwise (`"steps"`): `fit`'s own step, trained for real, and the
      device's peak: the allocator's (PyTorch, TensorFlow on a GPU; on the
      host, TensorFlow's where it keeps statistics) or the host's resident
      memory. On a GPU under an allocator cap
      (`configure_memory(memory_limit_mb=...)`), sizes around the answers
      are trained until one runs and the next does not; without a cap,
      nothing above the answer is tried. On the host nothing near the
      limit is tried, and the answer says how far it lies beyond the
      sizes measured.

    Every variable of the model, its optimizer and its metrics is put back
    bit for bit afterwards. A model not built yet is built, as `fit` would.

    Args:
        model: a compiled Keras model.
        x: a sample batch of inputs (arrays, or lists/dicts of arrays),
            repeated along its first axis to make larger batches.
        y: the matching targets. Defaults to `None`.
        headroom: fraction of the limit to keep free. Defaults to `0.1`.
        trial_sizes: the ladder's batch sizes, at least two. Defaults to
            `None`: an adaptive ladder from 1.
        device: `"GPU:0"`, ... or `"host"`. Defaults to `None`: the first
            GPU the backend computes on, else the host.
        method: `"auto"`, `"xla"` (JAX) or `"steps"`. Defaults to `"auto"`:
            `"xla"` for JAX on a GPU, else `"steps"`.
        fresh_process: PyTorch on a GPU under a cap: train the checks as
            jobs in new Python processes (the model saved to a temporary
            `.keras` file) rather than in this one, where a process that
            has trained can fit a few percent more than a job started
            afresh. A size fits where two jobs of it trained. Slower: a
            process start per job (up to four side by side, where the
            device has room for their caps). Defaults to `False`.
        progress: receives a line per size measured, whatever `verbose`
            says. Defaults to `None`: the `keras_memwatch` logger at INFO.
        max_seconds: stop asking after this many seconds: no round starts
            that the rounds before it say cannot end in time, and
            compilations still running then are abandoned. The answers are
            the record's so far; `left_open` and the explanation say which
            are not bracketed. The first two sizes of the ladder, without
            which nothing can be answered, are always measured. Defaults
            to `None`: no limit.
        compilation_cache: JAX: a directory for JAX's persistent
            compilation cache (created where missing), or `True` for
            `~/.cache/keras_memwatch/jax` (under `$XDG_CACHE_HOME` where
            set), so that a second estimate, and the `fit` that follows in
            a new process, find the compilations on disk; the estimate's
            record is kept there too, so a second estimate of the same step
            under the same limit asks nothing again. A cache the user
            set (`jax_compilation_cache_dir`, `JAX_COMPILATION_CACHE_DIR`)
            always wins. PyTorch, TensorFlow: accepted, does nothing.
            Defaults to `None`: none set.
        verbose: `"auto"`, `0`, `1` or `2`, as `fit`'s: `1` draws a
            `keras.utils.Progbar` of the search's rounds (sizes asked, the
            best answer so far, seconds), `2` prints one line per round, `0`
            shows nothing. Defaults to `"auto"`: `1` where the output is a
            terminal or a notebook, else `2`.

    Returns:
        A `CapacityEstimate`.

    Raises:
        ValueError: for a model that is not compiled, or a bad `headroom`,
            `trial_sizes`, `device`, `method`, `max_seconds`,
            `compilation_cache` or `verbose`.
        TypeError: for arguments of the wrong type, or `x`/`y` that are not
            arrays.

    Example:

    ```python
    estimate = keras_memwatch.estimate_max_batch_size(model, x[:64], y[:64])
    print(estimate)
    model.fit(x, y, batch_size=estimate.predicted_batch_size)
    ```
    """
    began = time.perf_counter()
    headroom = options.fraction("headroom", headroom)
    sizes = None if trial_sizes is None else options.batch_sizes("trial_sizes",
                                                                 trial_sizes)
    options.choice("method", method, METHODS)
    options.boolean("fresh_process", fresh_process)
    callback = options.optional_callable("progress", progress)
    max_seconds = options.optional_seconds("max_seconds", max_seconds)
    cache = options.cache_directory("compilation_cache", compilation_cache)
    verbose = options.verbosity("verbose", verbose)
    options.compiled_model("model", model)
    import keras

    backend = keras.backend.backend()
    data = Batches(x, y)
    cache_directory = use_compilation_cache(cache, backend=backend)
    shown = Progress(verbose, callback, began)
    say = shown.line
    with state_kept(model, data.take(1)):
        dev = Device(backend, device)
        strategy = None
        try:
            strategy = _strategy(method, backend, dev, model, data, fresh_process,
                                 say)
            key = (strategy.fingerprint() if cache_directory and sizes is None
                   and hasattr(strategy, "fingerprint") else None)
            known = (stored_record.Stored([]) if key is None
                     else stored_record.load(cache_directory, key))
            if known.observations:
                say(f"estimate_max_batch_size: {len(known.observations)} sizes "
                    f"from the estimate stored in {cache_directory}")
            search = Search(strategy, dev.on_gpu,
                            host_largest_batch(data.bytes_per_sample,
                                               host_available_bytes()[0]),
                            deadline=Deadline(max_seconds, began), progress=shown,
                            known=known.observations)
            search.stopped = known.stopped
            evidence = search.run(headroom, sizes)
            if key is not None and len(evidence.observations) > len(
                    known.observations):
                stored_record.save(cache_directory, key, evidence.observations,
                                   search.stopped)
        finally:
            if strategy is not None and hasattr(strategy, "close"):
                strategy.close()
            dev.close()
    estimate = CapacityEstimate(
        evidence, headroom, dev.name, backend, strategy.words,
        limit_detail=strategy.limit_words,
        refusal=_refusal(evidence, strategy, search.stopped),
        stopped=search.stopped, unsettled=search.checks_left,
        samples_given=data.n, seconds=round(time.perf_counter() - began, 2),
        max_seconds=max_seconds, left_open=dict(search.open),
        stored=len(known.observations))
    shown.done(estimate.predicted_batch_size)
    logger.info("%s", estimate.explanation)
    return estimate


def _strategy(method: str, backend: str, dev: Device, model: Any, data: Batches,
              fresh_process: bool, say: Callable[[str], None]) -> Any:
    """The way of measuring that `method` asks for on this device."""
    if method == "auto":
        method = "xla" if backend == "jax" and dev.on_gpu else "steps"
    if method == "xla":
        if backend != "jax":
            raise ValueError("Expected method='xla' only with the JAX backend. "
                             f"Received: method='xla' on {backend}")
        from keras_memwatch.capacity.xla import Plans

        return Plans(model, data, dev, say)
    if backend == "jax" and dev.on_gpu:
        raise ValueError(
            "Expected method='xla' or 'auto' for JAX on a GPU: its allocator has "
            "no peak that can be reset, so real steps cannot be measured one by "
            f"one. Received: method={method!r}")
    from keras_memwatch.capacity.steps import Steps

    steps = Steps(model, data, dev, say)
    if fresh_process:
        from keras_memwatch.capacity.fresh_process import Jobs

        return Jobs.around(steps)
    return steps


def _refusal(evidence: Any, strategy: Any, stopped: str) -> str:
    """Why nothing can be answered from `evidence`, or `""`."""
    measured = ", ".join(
        f"batch {o.batch_size} " + ("out of memory" if not o.ran else
                                    "no peak" if o.need_bytes is None else
                                    format_bytes(o.need_bytes))
        for o in evidence.observations) or "nothing"
    why = f" (the ladder stopped: {stopped})" if stopped else ""
    if evidence.limit_bytes is None:
        return (f"no memory limit is known ({strategy.limit_words}); measured "
                f"{measured}. Pass `device=` a device with a known limit, or "
                "set one with `keras_memwatch.configure_memory(memory_limit_mb=...)`")
    if evidence.line is None:
        return (f"the need does not grow with the batch over the sizes measured "
                f"({measured}){why}. Pass larger `trial_sizes`")
    return ""
