"""XLA's memory plan of the train step at many batch sizes, side by side.

Each size is one compilation of Keras's jitted train step for that input
shape (`keras_memwatch.judge.xla_plan`): traced and lowered here, one at a time
(tracing runs Python), then compiled on a pool of threads, since XLA's
compiler releases the GIL. A size `fit` already compiled comes from JAX's
cache. On a GPU, where most of a compilation as `fit` makes it is
autotuning kernels (compiling hundreds of candidates on every core), sizes
that only *aim* a search are compiled without autotuning and without
Triton's matrix multiplications (`AIM_OPTIONS`); the answer is compiled
as `fit` compiles it (`keras_memwatch.capacity.xla_check`).

`search` drives several searches at once over one shared table of plans:
each target (the answer under the headroom, the ceiling under the whole
limit) proposes sizes, the proposals of a round are compiled together, and
each target narrows its bracket from the plans.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch.judge import xla_plan
from keras_memwatch.explain.oom import is_oom_error

logger = logging.getLogger("keras_memwatch")

#: Compiler options of the compilations that only aim a search, on a GPU.
#: Without autotuning XLA still compiles a default Triton kernel for every
#: matrix multiplication; with cuBLAS's instead, an aimed compilation took
#: half the time on an H200 (a transformer: 5.6-6.1 s against 9.2-10.5 s)
#: and its plans came nearer fit's (the block's equal them to 0.1% from
#: batch 296 to 552; the transformer's within 5% where they were 14% under).
AIM_OPTIONS: dict[str, Any] = {"xla_gpu_autotune_level": 0,
                               "xla_gpu_enable_triton_gemm": False}
MAX_WORKERS = 8
MAX_SIZE = 2**31
#: A round probes upward up to this times the largest size that fits (XLA's
#: recomputation lifted ceilings 1.5x above the line on an H200); larger
#: sizes take longest to compile, and a later round goes on upward.
MAX_ABOVE = 2.0


def workers() -> int:
    """How many compilations run side by side: half the CPUs, 1 to 8."""
    return max(1, min(MAX_WORKERS, (os.cpu_count() or 1) // 2))


def _on_accelerator() -> bool:
    import jax

    return jax.default_backend() != "cpu"


class Planner:
    """Compiles the train step of `model` at batch sizes, and reads the plans.

    Args:
        model: a compiled, built Keras model on the JAX backend.
        sample: `(x, y)` with at least one sample (shapes and dtypes only).
        progress: receives a line per compilation.
        parallel: compilations side by side. Defaults to `workers()`.
    """

    def __init__(self, model: Any, sample: tuple[Any, Any],
                 progress: Callable[[str], None], parallel: Optional[int] = None):
        self.model = model
        self.sample = sample
        self.progress = progress
        self.parallel = workers() if parallel is None else max(1, parallel)
        self.compilations = 0
        self.aim_compilations = 0
        # Two searches may compile at once (see `xla_check`).
        self._counting = threading.Lock()
        self._tracing = threading.Lock()
        self.began = time.perf_counter()
        self.aim_options: Optional[dict[str, Any]] = None
        self.accelerator = False
        try:
            self.accelerator = _on_accelerator()
        except Exception:
            pass
        if self.accelerator:
            self.aim_options = dict(AIM_OPTIONS)
        #: The batches a `fit` holds ahead of the step, counted on an
        #: accelerator (see `xla_plan.BATCHES_AHEAD`, `capacity.run_ahead`).
        self.batches_ahead = xla_plan.BATCHES_AHEAD
        # (size, aimed) -> the plan less the state, or the exception: a
        # second search (another count ahead) compiles only new sizes.
        self._compiled: dict[tuple[int, bool], Any] = {}

    def plans(self, sizes: Sequence[int], aim: bool = False) -> dict[int, Any]:
        """The working bytes of the step at each size (or the exception).

        Args:
            sizes: batch sizes.
            aim: compile with `AIM_OPTIONS` (on a GPU), to aim a search.

        Returns:
            `{size: working bytes}`; a size whose compilation failed maps to
            its exception (an out-of-memory one is retried alone first).
        """
        options = self.aim_options if aim else None
        aimed = options is not None  # the cache's key for this round
        out: dict[int, Any] = {}
        lowered: dict[int, tuple[Any, int, int]] = {}
        jobs: dict[int, concurrent.futures.Future] = {}
        new = [b for b in set(sizes) if (b, aimed) not in self._compiled]
        # Each size compiles as soon as it is lowered, largest first: it
        # takes longest (lowering a transformer's step took 0.2-0.35 s).
        with concurrent.futures.ThreadPoolExecutor(
                max(1, min(self.parallel, len(new)))) as pool:
            for size in sorted(new, reverse=True):
                with self._tracing:  # tracing runs Keras's Python: one at a time
                    try:
                        lowered[size] = xla_plan.lower_step(self.model, self.sample,
                                                            size, batches_ahead=0)
                    except Exception as e:
                        out[size] = e
                        continue
                jobs[size] = pool.submit(self._compile, lowered[size], options)
        for size in dict.fromkeys(b for b in sizes if b in jobs):
            result, used = jobs[size].result(), aimed  # compiled with `used` options
            if isinstance(result, Exception) and is_oom_error(result) and len(jobs) > 1:
                # Autotuning side by side can exhaust the device: alone again.
                used = self.aim_options is not None and aimed
                result = self._compile(lowered[size],
                                       self.aim_options if used else None)
            if isinstance(result, Exception) and used and not is_oom_error(result):
                logger.info("estimate_max_batch_size: compiling with %s failed "
                            "(%r); compiling as fit does from now on", options, result)
                self.aim_options, used = None, False
                result = self._compile(lowered[size], None)
            out[size] = result
            self._count(size, result if isinstance(result, Exception)
                        else result + self.ahead(size), used)
            if not isinstance(result, Exception) or is_oom_error(result):
                self._compiled[size, used] = result
        for size in sizes:
            out.setdefault(size, self._compiled.get((size, aimed)))
        return {b: out[b] if isinstance(out[b], Exception) else out[b] + self.ahead(b)
                for b in sizes}

    def ahead(self, size: int) -> int:
        """Bytes of the batches a `fit` holds ahead of a step of `size`."""
        return (self.batches_ahead * xla_plan.batch_bytes(self.sample, size)
                if self.accelerator else 0)

    def plan(self, size: int) -> Any:
        """The plan of `size` as `fit` compiles it, less the state and the
        batches ahead (compiled unless a search has), or the exception."""
        if (size, False) not in self._compiled:
            self.plans([size])
        return self._compiled.get((size, False))

    def _compile(self, lowered: tuple[Any, int, int],
                 options: Optional[dict[str, Any]]) -> Any:
        try:
            return xla_plan.compiled_working_bytes(*lowered, options)
        except Exception as e:
            return e

    def _count(self, size: int, result: Any, aim: bool) -> None:
        from keras_memwatch.units import format_bytes

        with self._counting:
            self.compilations += 1
            self.aim_compilations += int(aim)
            count = self.compilations
        what = (f"failed ({type(result).__name__})" if isinstance(result, Exception)
                else format_bytes(result))
        self.progress(f"estimate_max_batch_size: compiled the step for batch {size}"
                      + (" (aiming, without autotuning)" if aim else "")
                      + f": {what} [{count} compilations, "
                      f"{time.perf_counter() - self.began:.0f} s]")


def plan_one(model: Any, batch: tuple[Any, Any], size: int, aim: bool = False) -> int:
    """The working bytes of one size (`xla_plan.working_bytes`); with `aim`,
    on a GPU, compiled with `AIM_OPTIONS` where XLA takes them."""
    if aim and _on_accelerator():
        try:
            return xla_plan.working_bytes(model, batch, size,
                                          compiler_options=AIM_OPTIONS)
        except Exception as e:
            if is_oom_error(e):
                raise
            logger.info("estimate_max_batch_size: compiling with %s failed (%r); "
                        "compiling as fit does", AIM_OPTIONS, e)
    return xla_plan.working_bytes(model, batch, size)


class Target:
    """One search over the shared plans: the largest size whose plan fits.

    Args:
        free: the bytes the plan may need.
        start: the size to try first (the line's answer).
        more_likely: whether more than `start` is expected to fit (XLA
            recomputes activations near the limit), so a first round with
            room also probes above (up to `MAX_ABOVE` times `start`).
        resolution: the bracket is done within this fraction of its top.
        factor: the step outside a one-sided bracket.
    """

    def __init__(self, free: float, start: int, more_likely: bool = False,
                 resolution: float = 0.01, factor: float = 1.25):
        self.free = free
        self.start = max(int(start), 1)
        self.more_likely = more_likely
        self.resolution = resolution
        self.factor = factor
        self.lo: Optional[int] = None
        self.hi: Optional[int] = None
        self.rounds = 0

    def update(self, need: dict[int, float]) -> None:
        """Narrows the bracket from every plan known."""
        self.need = need
        failing = [b for b, n in need.items() if n > self.free]
        self.hi = min(failing) if failing else None
        fitting = [b for b, n in need.items()
                   if n <= self.free and (self.hi is None or b < self.hi)]
        self.lo = max(fitting) if fitting else None

    need: dict[int, float] = {}

    @property
    def done(self) -> bool:
        if self.hi == 1 and self.lo is None:
            return True
        return (self.lo is not None and self.hi is not None
                and self._closes(self.lo, self.hi - self.lo))

    def step(self, size: int) -> int:
        return max(1, int(self.resolution * size))

    def interpolate(self) -> Optional[int]:
        """Where the line through the two plans nearest the limit reaches it.

        Plans grow linearly with the batch until XLA recomputes, so this
        aims a search much better than halving a bracket; it is not used
        where recomputation is expected (`more_likely`), since there the
        plans stay flat below the limit and then jump.
        """
        points = sorted((b, n) for b, n in self.need.items() if math.isfinite(n))
        below = [p for p in points if p[1] <= self.free]
        above = [p for p in points if p[1] > self.free]
        if below and above:
            (b1, n1), (b2, n2) = below[-1], above[0]
        elif len(below) >= 2:
            (b1, n1), (b2, n2) = below[-2], below[-1]
        elif len(above) >= 2:
            (b1, n1), (b2, n2) = above[0], above[1]
        else:
            return None
        if b2 <= b1 or n2 <= n1:
            return None
        slope = (n2 - n1) / (b2 - b1)
        return int(math.floor(b1 + (self.free - n1) / slope))

    def propose(self, k: int, known: set[int]) -> list[int]:
        """Up to `k` sizes to compile next (none known already)."""
        if self.done or k < 1:
            return []
        lo, hi = self.lo, self.hi
        sizes: list[int] = []
        if lo is None and hi is None:
            s = self.start
            sizes = [s, s + self.step(s)]
            up = int(math.ceil(s * self.factor))
            while len(sizes) < k and self.more_likely and up <= MAX_ABOVE * s:
                sizes.append(up)
                up = int(math.ceil(up * self.factor))
        else:
            self.rounds += 1
            # Aim by the line through the nearest plans, except where
            # recomputation is expected; inside a closed bracket with one
            # compilation a round, every other round halves it instead, so
            # a plan that stays flat cannot stall the search.
            aim = not self.more_likely and (
                lo is None or hi is None or k > 1 or self.rounds % 2 == 1)
            guess = self.interpolate() if aim else None
            if guess is not None:
                low = lo if lo is not None else 0
                high = hi if hi is not None else MAX_SIZE
                guess = min(max(guess, low + 1), high - 1)
                if guess >= 1:
                    sizes += [guess, guess + 1]
            sizes += self._bracketing(k)
        out = []
        for b in sizes:
            if (b >= 1 and b not in known and b not in out
                    and (lo is None or b > lo) and (hi is None or b < hi)):
                out.append(b)
        return out[:k]

    def _bracketing(self, k: int) -> list[int]:
        """Sizes by steps of `factor` outside a one-sided bracket, or spread
        evenly inside a closed one."""
        lo, hi = self.lo, self.hi
        if hi is None:
            assert lo is not None
            sizes, up = [], lo
            if lo == self.start:
                sizes.append(lo + self.step(lo))
            while len(sizes) < k:
                up = max(int(math.ceil(up * self.factor)), up + 1)
                if up > MAX_ABOVE * lo and sizes:
                    break
                sizes.append(up)
            return sizes
        if lo is None:
            if hi == self.start:
                sizes, down = [max(hi - self.step(hi), 1)], hi
            else:
                sizes, down = [], hi
            while len(sizes) < k and down > 1:
                down = max(min(int(down / self.factor), down - 1), 1)
                sizes.append(down)
            return sizes
        # as many sizes as close the bracket wherever it lands, and no more
        n = 1
        while n < k and not self._closes(lo, math.ceil((hi - lo) / (n + 1))):
            n += 1
        return sorted({lo + max(1, (hi - lo) * i // (n + 1)) for i in range(1, n + 1)})

    def _closes(self, lo: int, gap: int) -> bool:
        """Whether a bracket `gap` wide, from `lo` up, is done."""
        return gap <= max(1, self.resolution * (lo + gap))


def record(plans: dict[int, Any], need: dict[int, float]) -> dict[int, float]:
    """Puts compiled plans into `need`; one that failed out of memory needs
    more than any device (infinite), any other failure is raised."""
    for size, value in plans.items():
        if isinstance(value, Exception):
            if not is_oom_error(value):
                raise value
            value = math.inf
        need[size] = value
    return {size: need[size] for size in plans}


def search(targets: Sequence[Target], plans: Callable[[list[int]], dict[int, Any]],
           need: dict[int, float], max_compilations: int, width: int,
           max_rounds: Optional[int] = None) -> int:
    """Rounds of compilations until every target is done or the budget ends.

    Args:
        targets: the searches.
        plans: compiles sizes, `{size: bytes or exception}`.
        need: the plans known (updated; a failed compilation counts as
            not fitting, after `plans` retried it).
        max_compilations: the most compilations in all.
        width: compilations per round (at least 1).
        max_rounds: the most rounds; None for no limit.

    Returns:
        The number of compilations made.

    Raises:
        The exception of a compilation that failed other than by running
        out of memory.
    """
    made = 0
    for t in targets:
        t.update(need)
    first = True
    rounds = 0
    while made < max_compilations and (max_rounds is None or rounds < max_rounds):
        rounds += 1
        active = [t for t in targets if not t.done]
        if not active:
            break
        # The first round checks each start and its neighbour together.
        least = 2 * len(active) if first else len(active)
        first = False
        room = min(max(width, least), max_compilations - made)
        share = max(1, room // len(active))
        sizes: list[int] = []
        for t in active:
            for b in t.propose(share, set(need) | set(sizes)):
                if len(sizes) < room:
                    sizes.append(b)
        if not sizes:
            break
        made += len(record(plans(sizes), need))
        for t in targets:
            t.update(need)
    return made
