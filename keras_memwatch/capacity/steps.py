"""Real training steps in this process, measured by the device's peak.

Any backend on the host (the peak resident set size, reset through
`/proc/self/clear_refs` on Linux), PyTorch and TensorFlow on a GPU (the
allocator's peak since the previous read). Each size trains `fit`'s own
step (`batches.fit_steps`).

On the host, each size starts from a clean state (garbage collected, the
heap trimmed) after a first step at that shape (tracing, compiling), and
the collector stays paused during the measured step, so that each size
meets the same garbage: a step's inputs that Keras's PyTorch backend
leaves in reference cycles (keras-team/keras#23110) are freed at moments
no job controls.

On a GPU the steps stand for the first steps of a job in a new process
near the limit: from a clean state (on PyTorch, the caching allocator's
cache handed back), a first step at that shape, then the measured steps
with nothing freed in between and the collector running, as in a job. A
step meets what the steps before it left: blocks the caching allocator
split, arrays held in reference cycles. On PyTorch the first step follows
Keras's build of the model at that shape, as a new process's first `fit`
does (`build_as_a_first_fit`), and what the build leaves in reference
cycles stays through the measured steps (`gc.freeze`): in a job, only a
full collection frees it, which may not come for many steps
(`CollectCycles` runs one before the first). Without these, checks ran
sizes that jobs in new processes could not (docs/ways-to-fit.md). Where
this Keras holds each step's arrays in reference cycles, a job's steps
meet them or not as the collector falls, and the words say so and name
`break_tree_cycles`. A size keeps its step time (`step_seconds`) only
where PyTorch's caching allocator did not free its cache to retry an
allocation during its measured steps: near the cap that slows a step by
an amount of its own.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch.measure.batches import Batches, fit_steps
from keras_memwatch.measure.device import Device
from keras_memwatch.measure.host_heap import trim_host_heap
from keras_memwatch.capacity.evidence import STEP, Observation
from keras_memwatch.configure.tree_cycles import tree_holds_cycles
from keras_memwatch.oom_errors import device_ran_out, is_oom_error
from keras_memwatch.record.batch_shapes import input_specs
from keras_memwatch.units import format_bytes

#: Steps measured per size on a GPU, after the first: a job's third step can
#: meet blocks the first two left split (keras-hub Phi-3 under PyTorch).
GPU_STEPS = 3

#: What Keras's build may leave before the explanation says so.
BUILD_LEFT_SAID = 2**20

TREE_CYCLES_WORDS = (
    "Keras's PyTorch backend holds each step's arrays in reference cycles until "
    "Python's collector runs (keras-team/keras#23110), so a `fit` near the limit "
    "may meet earlier steps' arrays; `keras_memwatch.break_tree_cycles()` before "
    "`fit` stops it")

logger = logging.getLogger("keras_memwatch")


def build_as_a_first_fit(model: Any, x: Any) -> None:
    """Runs Keras's build of `model` from the shapes of the inputs `x`, as a
    process's first `fit` does before its first step.

    On PyTorch, where the forward pass cannot run on the meta device
    (keras-hub's Phi-3), Keras runs it on the model's device at that shape,
    and its arrays stay in reference cycles until a full collection: the
    first steps of a new process meet them. Nothing is collected here.
    """
    from keras.src import backend

    backend.compute_output_spec(model, input_specs(x), training=False)


def build_left_words(size: int, left: int) -> str:
    """What Keras's build left (`left` bytes at batch `size`) and how a user
    frees it, in words."""
    return (f"Keras's build for the first batch left {format_bytes(left)} at "
            f"batch {size} in reference cycles, held through the steps here, "
            "since this model's forward pass cannot run on PyTorch's meta "
            "device; `keras_memwatch.CollectCycles()` in `fit`'s callbacks frees "
            "it before the first step, where a larger batch may fit")


class Steps:
    """Answers "what does batch b need, and does it run?" with real steps.

    Args:
        model: a compiled, built Keras model.
        data: its sample batch.
        device: the device measured.
        progress: receives a line per size.
    """

    how = STEP
    aims = False  # no quicker way than a step
    checks_in_turn = False  # read for plans only
    deadline: Optional[float] = None  # a step is never abandoned

    def __init__(self, model: Any, data: Batches, device: Device,
                 progress: Callable[[str], None]):
        self.model = model
        self.data = data
        self.device = device
        self.progress = progress
        self.torch = None
        if device.on_gpu and device.backend == "torch":
            import torch

            self.torch = torch
        #: Each size's first step follows Keras's build at its shape, as in
        #: a new process (on PyTorch, where that build may run on the GPU).
        self.builds_first = self.torch is not None
        #: The largest bytes a build left, and at which size: `(0, 0)` where
        #: its forward pass ran on the meta device, leaving nothing.
        self.build_left = (0, 0)
        #: Whether this Keras holds a step's arrays in reference cycles.
        self.tree_cycles = (device.on_gpu and device.backend == "torch"
                            and tree_holds_cycles())
        self.steps = GPU_STEPS if device.on_gpu else 1
        fit_steps(model, data.take(1), 1)  # builds, compiles, warms up
        self._clean()
        self.in_use = device.in_use()
        self.limit, self.limit_words, capped = device.limit(self.in_use)
        #: Sizes above the limit may be tried: only under an allocator's
        #: cap, where running out of memory is this process's alone.
        self.above_limit = capped
        self.ladder_width = 1
        self.check_width = 1
        #: Whether the device had room for all of the cap when measuring
        #: began: only then does a step that finds it full (PyTorch's
        #: message) mean that other processes took it.
        self.cap_fits_device = capped and self._room_for_cap()
        self.device_full_said = False

    @property
    def words(self) -> str:
        """What a size's need is read from, what Keras's build left, and
        whether Keras holds steps' arrays in reference cycles."""
        measured = f"{self.device.peak_words} of real steps"
        if not self.device.on_gpu:
            return measured
        size, left = self.build_left
        parts = [measured] + ([build_left_words(size, left)] if left else [])
        return "; ".join(parts + ([TREE_CYCLES_WORDS] if self.tree_cycles else []))

    def ladder(self, sizes: Sequence[int]) -> list[Observation]:
        return [self._measure(b, ladder=True) for b in sizes]

    def check(self, sizes: Sequence[int]) -> list[Observation]:
        return [self._measure(b, ladder=False) for b in sizes]

    def _clean(self) -> None:
        gc.collect()
        if self.torch is not None:
            self.torch.cuda.synchronize(self.device.gpu_index)
            self.torch.cuda.empty_cache()
        elif not self.device.on_gpu:
            trim_host_heap()

    def _build_first(self, size: int, x: Any) -> None:
        before = self.device.in_use()
        try:
            build_as_a_first_fit(self.model, x)
        except Exception as e:  # noqa: BLE001 - the build is an emulation
            if is_oom_error(e):
                raise
            self.builds_first = False
            logger.warning("estimate_max_batch_size: Keras's build of the model "
                           "from a batch's shapes raised %s; sizes are measured "
                           "without it", type(e).__name__)
            return
        left = self.device.in_use() - before
        if left >= BUILD_LEFT_SAID and left > self.build_left[1]:
            self.build_left = (size, left)

    def _measure(self, size: int, ladder: bool) -> Observation:
        batch = self.data.take(size)
        began = time.perf_counter()  # the measured steps', after the first
        collecting, frozen = gc.isenabled(), False
        full = False  # out of memory because the device was, under the cap
        try:
            # The first step at a new shape traces and compiles, and on a
            # GPU picks its kernels: not what a step of a long job needs.
            if self.device.on_gpu:
                self._clean()
            if self.builds_first:
                self._build_first(size, batch[0])
                gc.freeze()  # what the build left, out of the collector's reach
                frozen = True
            fit_steps(self.model, batch, 1)
            if not self.device.on_gpu:
                self._clean()
                gc.disable()
            self.device.read()  # resets the peaks
            retries = self._retries()
            began = time.perf_counter()
            fit_steps(self.model, batch, self.steps)
            if self.torch is not None:
                self.torch.cuda.synchronize(self.device.gpu_index)
            undisturbed = self._retries() == retries
            need = self.device.need(self.in_use)
            ran = True
        except Exception as e:
            if not is_oom_error(e):
                raise
            need, ran, undisturbed = None, False, False
            full = self.cap_fits_device and device_ran_out(e)
            del e
        finally:
            if frozen:
                gc.unfreeze()  # the next clean state collects it
            if collecting:
                gc.enable()
        seconds = time.perf_counter() - began
        del batch
        if not ran:
            self._clean()
        if full:
            self._device_full(size)
        self.progress(f"estimate_max_batch_size: batch {size}, {self.steps} real "
                      f"step(s) on {self.device.name}: "
                      + (f"out of memory{' (the device was full)' if full else ''}"
                         if not ran else
                         "no peak read" if need is None else
                         f"{format_bytes(need)} above what was in use"))
        return Observation(size, need, STEP, ran=ran, ladder=ladder,
                           seconds=round(seconds, 3),
                           step_seconds=(seconds / self.steps if undisturbed
                                         else None))

    def _room_for_cap(self) -> bool:
        """Whether PyTorch's device has free all that the cap leaves."""
        if self.torch is None or self.limit is None:
            return False
        try:
            free = self.torch.cuda.mem_get_info(self.device.gpu_index)[0]
        except Exception:  # noqa: BLE001 - unknown: no such claim
            return False
        return free >= self.limit - self.in_use

    def _device_full(self, size: int) -> None:
        """Says once that other processes filled the device under the cap."""
        if self.device_full_said:
            return
        self.device_full_said = True
        logger.warning(
            "estimate_max_batch_size: batch %d ran out of memory on %s before its "
            "cap: other processes hold the device, so sizes that fail now may fit "
            "alone, and the answers may read low", size, self.device.name)

    def _retries(self) -> Optional[int]:
        """How often PyTorch's caching allocator has freed its cache to
        retry an allocation (`None` elsewhere): steps it retried in are
        slowed by it."""
        if self.torch is None:
            return None
        stats = self.torch.cuda.memory_stats(self.device.gpu_index)
        return stats.get("num_alloc_retries", 0)
