"""Confirming the answer on a GPU by training real steps near the limit.

Where a step's working memory is read from the allocator (PyTorch,
TensorFlow), the line over small sizes says what the step *allocates*; what
the allocator needs from the device at the same size is more (block
rounding, fragmentation), and only a real step under the real limit tells.
So, once the line is fitted:

1. Under an allocator cap (`configure_memory(memory_limit_mb=...)`), the
   largest batch that trains under the whole limit is searched for with
   real steps (two per size: the second needs more): from the line's
   answer, down towards the answer of the line through the *reserved*
   peaks, then by bisection to 1%, at most `MAX_STEPS` sizes. Without a
   cap no step is tried above the recommendation: a device without a cap
   may be shared.
2. The recommendation under the headroom is the line's, scaled by what the
   allocator was found to need at that boundary (the boundary's free memory
   over the line's working memory there), and it is trained for real
   before it is reported; an out-of-memory error there steps it down
   by 5% (at most `MAX_DOWN` times).
3. On PyTorch the boundary is searched once more in new processes, each a
   job of several epochs, from the one found here down (at most
   `MAX_FRESH` sizes), and the recommendation is scaled from that boundary
   and trained in a new process: a process that has trained can fit more
   than a job started afresh, and a job's peak rises above its first
   steps' as reference cycles hold memory (`fresh_process`, `collector`).
4. On PyTorch, where `expandable_segments` is off and torch can switch it
   at run time, the boundary search is repeated with it on, upwards from
   the smallest size that failed without it (at most `MAX_EXPANDABLE`
   steps), and the setting is put back.

Each step starts from a freed cache; an out-of-memory error is caught, its
traceback dropped and the cache freed. The caller puts the model's state
back afterwards (the steps change the weights).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import time
from typing import Any, Callable, Optional

from keras_memwatch import columns as C
from keras_memwatch.capacity import collector
from keras_memwatch.capacity.allocator import STEPS_PER_SIZE, TorchCache, read_settings
from keras_memwatch.capacity.batches import Batches
from keras_memwatch.capacity.fresh_process import (
    JOB,
    JOB_EPOCHS,
    JOB_STEPS,
    FreshProcessError,
    FreshProcessSteps,
)
from keras_memwatch.capacity.meter import Meter
from keras_memwatch.capacity.result import LIMIT_ALLOCATOR, CapacityEstimate, Trial
from keras_memwatch.explain.oom import is_oom_error
from keras_memwatch.units import MIB, format_bytes

logger = logging.getLogger("keras_memwatch")

MAX_STEPS = 8  # sizes tried by the boundary search
MAX_DOWN = 4  # steps down from a recommendation that ran out of memory
MAX_EXPANDABLE = 4  # real steps with expandable_segments on
MAX_FRESH = 6  # sizes tried in new processes
MARGIN = 1.02  # free device memory a new process needs, over the limit
RESOLUTION = 0.01
DOWN = 0.95  # a recommendation that failed is stepped down by this


def search_boundary(runs: Callable[[int], bool], start: int, hint: Optional[int],
                    max_steps: int, resolution: float = RESOLUTION,
                    ) -> tuple[Optional[int], Optional[int]]:
    """The largest size for which `runs` holds, near `start`.

    Tries `start`; where it runs, its neighbour `resolution` above, then
    steps up by 5%, 10%, 20%...; where it fails, `hint` (a lower answer
    expected to run), else 10% less, then 15% less each time; then bisects
    until the bracket is within `resolution` of its lower end. Calls `runs`
    at most `max_steps` times, never twice for one size.

    Returns:
        `(largest size that ran, smallest size that failed)`; either is
        `None` when none was seen.
    """
    lo: Optional[int] = None
    hi: Optional[int] = None
    seen: dict[int, bool] = {}

    def check(size: int) -> bool:
        nonlocal lo, hi
        if size not in seen:
            seen[size] = bool(runs(size))
        if seen[size]:
            lo = size if lo is None else max(lo, size)
        else:
            hi = size if hi is None else min(hi, size)
        return seen[size]

    size = max(int(start), 1)
    check(size)
    up = resolution
    down = 0.90
    first_down = True
    while (lo is None or hi is None) and len(seen) < max_steps:
        if lo is None:
            assert hi is not None
            if hi == 1:
                break
            if first_down and hint is not None and 1 <= hint < hi:
                size = int(hint)
            else:
                size = max(min(int(hi * down), hi - 1), 1)
                down = 0.85
            first_down = False
        else:
            size = max(int(math.ceil(lo * (1 + up))), lo + 1)
            up = 0.05 if up < 0.05 else up * 2
        if size in seen:
            break
        check(size)
    while (lo is not None and hi is not None and hi - lo > max(1, resolution * lo)
           and len(seen) < max_steps):
        size = (lo + hi) // 2
        if size in seen:
            break
        check(size)
    return lo, hi


def scaled_recommendation(estimate: CapacityEstimate, boundary: Optional[int],
                          failed: Optional[int], headroom: float) -> Optional[int]:
    """The line's answer under `headroom`, scaled by what the boundary showed.

    Where the largest batch that trains under the whole limit is `boundary`,
    the allocator needs at most `k = free / line(boundary)` times what the
    line says (it needed no more than the free memory there; `failed`, the
    smallest size that did not train, bounds `k` from below and is not used:
    the larger `k` is the safer one). The recommendation is the largest
    batch whose `k x line(batch)` fits the free memory under the headroom.

    Returns:
        The batch size, or `None` without a line or a boundary.
    """
    if (boundary is None or estimate.limit_bytes is None
            or estimate.in_use_bytes is None or not estimate.per_sample_bytes):
        return None
    static = max(estimate.step_static_bytes or 0, 0)
    per_sample = estimate.per_sample_bytes
    free0 = estimate.limit_bytes - estimate.in_use_bytes
    line_at = static + per_sample * boundary
    if line_at <= 0 or free0 <= 0:
        return None
    k = free0 / line_at
    room = estimate.limit_bytes * (1 - headroom) - estimate.in_use_bytes
    return max(int(math.floor((room / k - static) / per_sample)), 0)


class RealSteps:
    """Trains real steps, `STEPS_PER_SIZE` per size, catching out-of-memory
    errors.

    Args:
        model: the model measured.
        data: its sample batch.
        meter: the device's meter (its allocated peak per step).
        cache: PyTorch's caching allocator of the device, or `None`.
        progress: receives one line per step.
    """

    def __init__(self, model: Any, data: Batches, meter: Meter,
                 cache: Optional[TorchCache], progress: Callable[[str], None]):
        self.model = model
        self.data = data
        self.meter = meter
        self.cache = cache
        self.progress = progress
        self.trials: list[Trial] = []
        self.expandable = False

    def _free(self) -> None:
        if self.cache is not None:
            self.cache.free()
        else:
            gc.collect()

    def run(self, size: int, purpose: str) -> bool:
        """Trains `STEPS_PER_SIZE` steps of `size` from a freed cache; whether
        they ran (not out of memory)."""
        batch = self.data.take(size)
        self._free()
        if self.cache is not None:
            self.cache.reset_peaks()
        self.meter.read()  # resets the peaks the probes can reset
        began = time.perf_counter()
        error = ""
        cyclic: Optional[int] = None
        with collector.paused(collect=False):  # _free() collected
            try:
                for _ in range(STEPS_PER_SIZE):
                    self.model.train_on_batch(batch[0], batch[1])
                self.meter.sync()
                ran = True
            except Exception as e:
                if not is_oom_error(e):
                    raise
                error = type(e).__name__
                ran = False
                del e
            if ran and self.cache is not None:
                cyclic = collector.freed_by_collection(self.cache.allocated)
        del batch
        allocated: Optional[int] = None
        reserved: Optional[int] = None
        if ran and self.cache is not None:
            allocated, reserved = self.cache.peaks()  # before a probe resets them
        elif ran:
            row = self.meter.read()
            allocated = row.get(self.meter.peak_column)
            reserved = row.get(C.ALLOCATOR_RESERVED)
        else:
            self._free()
        trial = Trial(batch_size=size, ran=ran, purpose=purpose,
                      expandable_segments=self.expandable,
                      allocated_peak_bytes=allocated,
                      reserved_peak_bytes=reserved,
                      seconds=round(time.perf_counter() - began, 3), error=error,
                      cyclic_bytes=cyclic)
        self.trials.append(trial)
        self.progress(
            f"estimate_max_batch_size: trained batch {size} ({purpose}"
            + (", expandable_segments" if self.expandable else "") + "): "
            + (f"ran, reserved peak {format_bytes(reserved)}" if ran and reserved
               else "ran" if ran else f"out of memory ({error})"))
        return ran


def confirm_by_training(estimate: CapacityEstimate, model: Any, data: Batches,
                        meter: Meter, cache: Optional[TorchCache],
                        progress: Callable[[str], None],
                        failed_before: Optional[int] = None,
                        fresh_process: Optional[bool] = None) -> CapacityEstimate:
    """The line's estimate, checked and corrected by real steps on the GPU.

    Args:
        estimate: the line's estimate, with a prediction, on a GPU.
        model: the model measured (its state is changed: put it back after).
        data: its sample batch.
        meter: the device's meter.
        cache: PyTorch's caching allocator of the device, or `None`.
        progress: receives one line per step.
        failed_before: a size that already ran out of memory (the ladder's
            last), or `None`: no search starts at or above it.
        fresh_process: whether the boundary is searched again, and the
            recommendation trained, in new processes (`fresh_process`).
            `None`: where the boundary is searched on PyTorch.

    Returns:
        The estimate with `predicted_batch_size` (trained for real),
        `ceiling_batch_size` (under a cap), `trials`, the allocator's
        settings and the gain of `expandable_segments` where measured.
    """
    steps = RealSteps(model, data, meter, cache, progress)
    settings = read_settings() if cache is not None else None
    capped = estimate.limit_source == LIMIT_ALLOCATOR
    line0 = estimate.batch_size_for(0.0) or 0
    start0 = line0 if failed_before is None else min(line0, failed_before - 1)
    reserved_line0 = estimate.reserved_batch_size_for(0.0)
    here = failed_here = None

    def runs(size: int) -> bool:
        if failed_before is not None and size >= failed_before:
            return False
        return steps.run(size, "boundary")

    if capped and start0 > 0:
        here, failed_here = search_boundary(
            runs, start0,
            reserved_line0 if reserved_line0 and reserved_line0 < start0 else None,
            MAX_STEPS)
    if failed_before is not None:
        failed_here = failed_before if failed_here is None else min(failed_here,
                                                                    failed_before)
    fresh, fresh_note = _fresh_steps(fresh_process, estimate, model, data, cache,
                                     steps.trials, progress, here, capped)
    boundary, failed, runner = here, failed_here, steps
    try:
        if fresh is not None:
            try:
                boundary, failed = _fresh_boundary(fresh, here, failed_here)
                runner = fresh
            except FreshProcessError as e:
                fresh_note = f"a new process could not train ({e})"
        start = _recommendation_start(estimate, boundary, failed)
        try:
            recommended = _train_recommendation(runner, start)
        except FreshProcessError as e:
            fresh_note = f"a new process could not train ({e})"
            runner = steps
            recommended = _train_recommendation(steps, start)
    finally:
        if fresh is not None:
            fresh.close()
    if fresh_note and fresh_process:
        logger.warning("estimate_max_batch_size: fresh_process=True, but %s; "
                       "the answer comes from the measuring process", fresh_note)
    in_process = here if runner is fresh else None
    if runner is not fresh:
        boundary, failed = here, failed_here
    expandable, expandable_note = _expandable(steps, settings, cache, here,
                                              failed_here, capped)
    explanation = _confirm_text(estimate, steps.trials, capped, line0, here,
                                failed_here, recommended, start, settings, expandable,
                                expandable_note)
    if in_process is not None:
        explanation += " " + _fresh_text(boundary, failed, here, failed_here)
    elif fresh_note:
        explanation += f" No answer from new processes: {fresh_note}."
    explanation += _cycles_text(steps.trials, in_process is not None)
    return dataclasses.replace(
        estimate, predicted_batch_size=recommended, ceiling_batch_size=boundary,
        in_process_ceiling_batch_size=in_process,
        fresh_process_note=fresh_note if in_process is None else "",
        trials=tuple(steps.trials),
        allocator_settings=settings.text() if settings else "",
        expandable_batch_size=expandable,
        explanation=f"{estimate.explanation} {explanation}")


def _recommendation_start(estimate: CapacityEstimate, boundary: Optional[int],
                          failed: Optional[int]) -> int:
    """The first size to train as the recommendation: the line's answer
    scaled by what the boundary showed, else the more cautious of the two
    lines' answers, below any size that failed."""
    line_rec = estimate.predicted_batch_size or 0
    if boundary is not None:
        start = scaled_recommendation(estimate, boundary, failed, estimate.headroom)
        return min(start if start is not None else line_rec, boundary)
    reserved_rec = estimate.reserved_batch_size_for(estimate.headroom)
    start = min(line_rec, reserved_rec) if reserved_rec else line_rec
    return start if failed is None else min(start, failed - 1)


def _fresh_steps(asked: Optional[bool], estimate: CapacityEstimate, model: Any,
                 data: Batches, cache: Optional[TorchCache], trials: list,
                 progress: Callable[[str], None], here: Optional[int], capped: bool
                 ) -> tuple[Optional[FreshProcessSteps], str]:
    """New-process steps where asked for (or by default) and possible: a
    cap, a boundary found here, room on the device beside this process and
    a model Keras can save; else `None` and why not."""
    if asked is False:
        return None, ""
    if cache is None:
        why = "only PyTorch on a GPU trains in new processes"
    elif not capped:
        why = "no allocator cap is set, so no step tried the limit"
    elif here is None:
        why = "no batch trained under the whole limit in this process"
    else:
        cache.free()
        free, limit = cache.device_free(), estimate.limit_bytes
        if free is not None and free < limit * MARGIN:
            return None, (f"GPU:{cache.index} has {format_bytes(free)} free beside "
                          f"this process, less than the limit of "
                          f"{format_bytes(limit)} a new process would need")
        return FreshProcessSteps.prepare(model, data, limit, cache.index, trials,
                                         progress)
    return None, why if asked else ""


def _fresh_boundary(fresh: FreshProcessSteps, here: int, failed_here: Optional[int]
                    ) -> tuple[Optional[int], Optional[int]]:
    """The boundary searched again in new processes, from the measuring
    process's: a size that failed there is not tried."""

    def runs(size: int) -> bool:
        if failed_here is not None and size >= failed_here:
            return False
        return fresh.run(size, "boundary")

    lo, hi = search_boundary(runs, here, None, MAX_FRESH)
    if failed_here is not None:
        hi = failed_here if hi is None else min(hi, failed_here)
    return lo, hi


def _fresh_text(boundary: Optional[int], failed: Optional[int], here: int,
                failed_here: Optional[int]) -> str:
    """What the new processes showed, in words (they try no size that failed
    here, so a smaller `failed` is theirs)."""
    if boundary is None:
        return (f"In new processes (a job started afresh, {JOB}), no batch from {here} "
                f"down trained in {MAX_FRESH} tries; the smallest that failed was "
                f"{failed}.")
    text = f"In new processes (each a job started afresh, {JOB}), batch {boundary} ran"
    if failed is not None and failed != failed_here:
        text += f", {failed} ran out of memory"
    elif failed is not None:
        text += f" ({failed}, which failed in this process, was not tried)"
    if boundary < here:
        text += (f": {(here - boundary) / here:.0%} less than {STEPS_PER_SIZE} steps "
                 "in this process")
    return text + "; the recommendation comes from them and trained in one."


def _cycles_text(trials: list[Trial], fresh: bool) -> str:
    """What reference cycles held after the steps, where they held any
    (`collector`), in words, or `""`; `fresh`: the answer comes from jobs in
    new processes."""
    held = [t for t in trials if t.ran and (t.cyclic_bytes or 0) >= MIB]
    if not held:
        return ""
    most = max(held, key=lambda t: t.cyclic_bytes or 0)
    where = ("the boundary and the recommendation come from jobs of "
             f"{JOB_EPOCHS * JOB_STEPS} steps in new processes" if fresh else
             "these steps are too few to show how far a long job's peak rises: "
             "train a few epochs at the recommendation before relying on it")
    return (f" Reference cycles held up to {format_bytes(most.cyclic_bytes or 0)} "
            f"of device memory (batch {most.batch_size}, freed by one garbage "
            "collection after its steps): Keras's PyTorch backend leaves each "
            "step's inputs, and some activations, in cycles that only Python's "
            "garbage collector frees (keras-team/keras#23110), at moments no job "
            f"controls, so a job's peak rises above its first steps'; {where}. "
            "A longer job can hold more: train it with "
            "`keras_memwatch.CollectCycles()` among its callbacks (a full "
            "collection every 50 batches).")


def _train_recommendation(steps: Any, start: int) -> Optional[int]:
    """Trains at `start` with `steps` (`RealSteps` or `FreshProcessSteps`),
    stepping down 5% on out-of-memory."""
    size = start
    for _ in range(MAX_DOWN + 1):
        if size < 1:
            return 0
        if steps.run(size, "recommended"):
            return size
        size = min(int(size * DOWN), size - 1)
    return None


def _expandable(steps: RealSteps, settings: Any, cache: Optional[TorchCache],
                boundary: Optional[int], failed: Optional[int],
                capped: bool) -> tuple[Optional[int], str]:
    """The largest batch with `expandable_segments` on, and a note."""
    if settings is None:
        return None, ""
    if not settings.caching:
        return None, (f"allocator backend {settings.backend}: expandable_segments "
                      "does not apply")
    if settings.expandable:
        return None, "PyTorch's expandable_segments is on already"
    how = ("to measure it, run again with "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    if not capped or boundary is None or failed is None:
        why = ("no allocator cap is set, so no step tried the limit" if not capped
               else "the search found no size that failed")
        return None, f"the gain of expandable_segments was not measured ({why}); {how}"
    if cache is None:
        return None, f"the gain of expandable_segments was not measured; {how}"
    cache.free()
    if not cache.set_expandable(True):
        return None, (f"the gain of expandable_segments was not measured (this "
                      f"torch cannot switch it at run time); {how}")
    steps.expandable = True
    try:
        lo, _ = search_boundary(lambda b: steps.run(b, "expandable_segments"),
                                failed, None, MAX_EXPANDABLE)
    finally:
        steps.expandable = False
        cache.free()
        cache.set_expandable(False)
        cache.free()
    if lo is None or lo <= boundary:
        return None, ("with expandable_segments:True (measured in this process, "
                      "switched for new segments) no larger batch trained: batch "
                      f"{failed} still ran out of memory")
    return lo, ""


def _confirm_text(estimate: CapacityEstimate, trials: list[Trial], capped: bool,
                  line0: int, boundary: Optional[int], failed: Optional[int],
                  recommended: Optional[int], start: int, settings: Any,
                  expandable: Optional[int], expandable_note: str) -> str:
    """What the real steps showed, in words."""
    parts = []
    if capped and boundary is not None:
        text = (f"Trained for real under the whole limit: batch {boundary} ran"
                + (f", {failed} ran out of memory" if failed is not None else
                   " (nothing larger tried failed)")
                + f"; the line through the allocated peaks said {line0}")
        if boundary < line0:
            text += (f", {(line0 - boundary) / line0:.0%} too many: what the "
                     "allocator needs beyond what it allocates (block rounding, "
                     "fragmentation) and whatever else the line does not see")
        parts.append(text + ".")
    elif capped:
        parts.append(f"No batch from {line0} down trained under the whole limit "
                     f"in {MAX_STEPS} steps.")
    else:
        parts.append("No allocator cap is set (the limit is the device's total "
                     "memory), so no step tried the limit.")
    if recommended is None:
        parts.append(f"The recommendation could not be confirmed: batch {start} "
                     f"and {MAX_DOWN} sizes below it ran out of memory.")
    else:
        trial = next((t for t in reversed(trials) if t.batch_size == recommended
                      and t.ran and not t.expandable_segments), None)
        held = ""
        if trial is not None and trial.reserved_peak_bytes and estimate.limit_bytes:
            held = (f", the allocator reserving {format_bytes(trial.reserved_peak_bytes)}"
                    f" ({trial.reserved_peak_bytes / estimate.limit_bytes:.0%} of "
                    "the limit)")
        steps = (f"{JOB} in a new process"
                 if trial is not None and trial.fresh_process else
                 f"{STEPS_PER_SIZE} real steps")
        parts.append(f"Recommended batch {recommended} (under {estimate.headroom:.0%} "
                     f"headroom) trained {steps}{held}.")
    if settings is not None:
        parts.append(f"Allocator: {settings.text()}.")
    if expandable is not None and boundary:
        gain = (expandable - boundary) / boundary
        parts.append(f"With expandable_segments:True (measured in this process, "
                     f"switched for new segments) batch {expandable} trained "
                     f"({gain:+.0%} on {boundary}): set "
                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before "
                     "torch starts to train larger batches.")
    if expandable_note:
        parts.append(expandable_note[0].upper() + expandable_note[1:] + ".")
    return " ".join(parts)
