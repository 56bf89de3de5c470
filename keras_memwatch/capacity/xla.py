"""XLA's memory plan of `fit`'s train step, compiled (never run) at any size.

JAX has no allocator peak that can be reset, but XLA plans every buffer of
a compiled step ahead of time (`keras_memwatch.judge.xla_plan`), and
compiling a size that does not fit is harmless. Where a plan would not fit
the device, XLA recomputes activations instead of keeping them, so the
plans stop growing with the batch well before a size fails: only a
compilation tells where that ends.

A step needs its plan less the training state (in memory already) plus the
batches a `fit` holds on an accelerator ahead of the running step
(`xla_plan.BATCHES_AHEAD`). Sizes compile side by side on a pool of
threads (XLA's compiler releases the GIL); tracing runs one at a time. On
a GPU the ladder and the aims compile without autotuning and with cheaper
code generation (`AIM_OPTIONS`: quicker, the same buffers; their plans only
aim, `calibration`), and every check compiles as `fit` compiles, which `fit`
then finds in JAX's cache (in a new process, with the persistent
compilation cache: `configure.compilation_cache`). A round's checks compile
side by side, or one after another where the step is mostly convolutions:
XLA picks each convolution's algorithm holding the GPU, so side by side
in one process they wait for each other (docs/capacity.md). With a
`deadline`, compilations still running then are abandoned.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch.measure.batches import Batches
from keras_memwatch.measure.device import Device
from keras_memwatch.capacity import stored_record
from keras_memwatch.capacity.evidence import AIMED, PLAN, Observation
from keras_memwatch.oom_errors import is_oom_error
from keras_memwatch.judge import xla_plan
from keras_memwatch.units import format_bytes

#: Compiler options of the quick, aimed compilations on a GPU: no
#: autotuning, and cheaper code generation. The GEMMs stay fused as `fit`
#: fuses them (Triton's), so that the buffers are those of `fit`'s plan;
#: `calibration` reads any difference left (docs/capacity.md).
AIM_OPTIONS: dict[str, Any] = {"xla_gpu_autotune_level": 0,
                               "xla_gpu_disable_gpuasm_optimizations": True,
                               "xla_backend_optimization_level": 0,
                               "xla_llvm_disable_expensive_passes": True}
#: Checks a round asks: each answer and the size above it. They compile
#: side by side, each autotuning kernels on every core, unless the step is
#: `mostly_convolutions`.
CHECKS_AT_ONCE = 4


def mostly_convolutions(program: str) -> bool:
    """Whether a lowered step (StableHLO text) holds more convolutions
    than matrix products."""
    return program.count("stablehlo.convolution") > program.count(
        "stablehlo.dot_general")


class Plans:
    """Answers "what does batch b need, and does it fit?" with XLA's plans.

    Args:
        model: a compiled, built Keras model on the JAX backend.
        data: its sample batch.
        device: the device measured.
        progress: receives a line per compilation.
    """

    how = PLAN
    above_limit = True

    def __init__(self, model: Any, data: Batches, device: Device,
                 progress: Callable[[str], None]):
        import jax

        self.model = model
        self.sample = data.take(1)
        self.device = device
        self.progress = progress
        self.accelerator = jax.default_backend() != "cpu"
        self.device_kind = jax.devices()[0].device_kind
        self.aim_options: Optional[dict[str, Any]] = (
            dict(AIM_OPTIONS) if self.accelerator else None)
        self.ladder_width = max(1, min(8, (os.cpu_count() or 1) // 2))
        self.check_width = CHECKS_AT_ONCE
        #: Whether checks compile one after another (`mostly_convolutions`),
        #: read off the first step lowered on an accelerator.
        self.checks_in_turn: Optional[bool] = None if self.accelerator else False
        self._said_in_turn = False
        self._tracing = threading.Lock()
        #: Steps already lowered, by size (`fingerprint`'s), used once.
        self._lowered: dict[int, tuple[Any, int, int]] = {}
        #: A `time.perf_counter()` time: compilations still running then are
        #: abandoned, and none starts after it. `None`: no limit.
        self.deadline: Optional[float] = None
        self._abandoned = False
        xla_plan.jitted_train_step(model)  # the step `fit` runs
        self.in_use = device.in_use()
        self.limit, self.limit_words, _ = device.limit(self.in_use)

    @property
    def words(self) -> str:
        """What a size's need is read from: the plan and, on an accelerator,
        the batches `fit` may hold ahead of the step, counted whether a run
        holds them or not (a host slower than the device holds fewer)."""
        plan = "XLA's plan of the step as `fit` compiles it"
        if not self.accelerator:
            return plan
        sample = format_bytes(xla_plan.batch_bytes(self.sample, 1))
        return (f"{plan}, with the {xla_plan.BATCHES_AHEAD} batches `fit` may hold "
                f"ahead of it, {sample} a sample each")

    def ladder(self, sizes: Sequence[int], beyond: Sequence[int] = ()
               ) -> list[Observation]:
        """The ladder's plans (quick ones on a GPU) and, in the same round,
        quick plans of `beyond` that only aim (not on the ladder)."""
        aimed = self.aim_options is not None
        jobs = [(b, aimed, True) for b in dict.fromkeys(sizes)]
        if aimed:
            jobs += [(b, True, False) for b in dict.fromkeys(beyond) if b not in sizes]
        return self._run(jobs, self.ladder_width)

    @property
    def aims(self) -> bool:
        """Whether `aim` is quicker than `check` (a GPU)."""
        return self.aim_options is not None

    def aim(self, sizes: Sequence[int]) -> list[Observation]:
        """Quick plans without autotuning: they only aim the checks."""
        return self._plans(sizes, aimed=True, width=self.ladder_width, ladder=False)

    def check(self, sizes: Sequence[int]) -> list[Observation]:
        if self.checks_in_turn and not self._said_in_turn:
            self._said_in_turn = True
            self.progress("estimate_max_batch_size: the step is mostly "
                          "convolutions: its checks compile one at a time")
        width = 1 if self.checks_in_turn else CHECKS_AT_ONCE
        return self._plans(sizes, aimed=False, width=width, ladder=False)

    def fingerprint(self, **more: Any) -> str:
        """What decides this step's plans (`stored_record.fingerprint`): its
        program, the limit, JAX, the device and the compiler's options, and
        `more` (what else tells records apart: the caller's)."""
        import jax
        import jaxlib

        with self._tracing:
            lowered = self._lower(1)
            self._lowered[1] = lowered  # the ladder's first size: traced once
        # XLA recomputes activations to fit the limit on an accelerator only
        limit = self.limit if self.accelerator else None
        return stored_record.fingerprint(
            lowered[0].as_text(), limit, jax=jax.__version__,
            jaxlib=jaxlib.__version__, device=self.device_kind,
            xla_flags=os.environ.get("XLA_FLAGS", ""),
            aim_options=self.aim_options, batches_ahead=xla_plan.BATCHES_AHEAD,
            **more)

    def ahead(self, size: int) -> int:
        """Bytes of the batches a `fit` holds ahead of a step of `size`."""
        if not self.accelerator:
            return 0
        return xla_plan.BATCHES_AHEAD * xla_plan.batch_bytes(self.sample, size)

    def _plans(self, sizes: Sequence[int], aimed: bool, width: int,
               ladder: bool) -> list[Observation]:
        """Each size compiled (largest first: it takes longest)."""
        return self._run([(b, aimed, ladder) for b in dict.fromkeys(sizes)], width)

    def _run(self, jobs: Sequence[tuple[int, bool, bool]], width: int
             ) -> list[Observation]:
        """`(size, aimed, ladder)` compiled side by side, in their order;
        those not done by `deadline` are abandoned (left out)."""
        pool = concurrent.futures.ThreadPoolExecutor(max(1, min(width, len(jobs))))
        futures = {i: pool.submit(self._plan, *jobs[i])
                   for i in sorted(range(len(jobs)),
                                   key=lambda i: (-jobs[i][0], jobs[i][1]))}
        timeout = None if self.deadline is None else max(
            self.deadline - time.perf_counter(), 0.0)
        done, pending = concurrent.futures.wait(futures.values(), timeout=timeout)
        if pending:
            self._abandoned = True
            pool.shutdown(wait=False, cancel_futures=True)
            with self._tracing:  # no tracing still touches the model
                pass
            self.progress(f"estimate_max_batch_size: out of time; abandoned "
                          f"{len(pending)} compilation(s)")
        else:
            pool.shutdown()
        made = [futures[i].result() for i in range(len(jobs)) if futures[i] in done]
        return [o for o in made if o is not None]

    def _lower(self, size: int) -> tuple[Any, int, int]:
        """`fit`'s step lowered at `size` (holding `_tracing`); the first
        lowering on an accelerator also decides `checks_in_turn`."""
        lowered = xla_plan.lower_step(self.model, self.sample, size, batches_ahead=0)
        if self.checks_in_turn is None:
            self.checks_in_turn = mostly_convolutions(lowered[0].as_text())
        return lowered

    def _plan(self, size: int, aimed: bool, ladder: bool) -> Optional[Observation]:
        began = time.perf_counter()
        with self._tracing:  # tracing runs Keras's Python: one at a time
            if self.deadline is not None and time.perf_counter() >= self.deadline:
                return None
            lowered = self._lowered.pop(size, None) or self._lower(size)
        compiling = time.perf_counter() - began  # traced, one size at a time
        options = self.aim_options if aimed else None
        need: Optional[int] = None
        ran = True
        try:
            need = xla_plan.compiled_working_bytes(*lowered, options)
        except Exception as e:
            if is_oom_error(e):
                ran = False
            elif options is None:
                raise
            else:  # XLA refused the options: compile as `fit` does
                self.aim_options, aimed = None, False
                need = xla_plan.compiled_working_bytes(*lowered, None)
        if need is not None:
            need += self.ahead(size)
        seconds = time.perf_counter() - began
        if self._abandoned:  # the estimate is over: say nothing
            return None
        self.progress(f"estimate_max_batch_size: compiled the step for batch {size}"
                      + (" without autotuning" if aimed else "") + ": "
                      + (format_bytes(need) if ran else "out of memory")
                      + f" ({seconds:.1f} s; compiling began at {compiling:.1f} s)")
        return Observation(size, need, AIMED if aimed else PLAN, ran=ran,
                           ladder=ladder, seconds=round(seconds, 3))
