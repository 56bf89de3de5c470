"""What a variant needs, measured the way `estimate_max_batch_size` measures.

Each variant (`variant.Variant`) is measured by the capacity package's
strategies: XLA's plans of the step on JAX (compiled, never run: the
device batch as `fit` compiles it, half of it as the capacity ladder
does), and a few real steps for the time; real steps of
`fit` on PyTorch and TensorFlow (the allocator's peak on a GPU, the
host's peak resident memory on a CPU). On JAX the plan serves on the
host too: the host's resident memory keeps what an earlier variant
freed, so variants measured one after another by it do not compare
(`docs/ways-to-fit.md`). The sizes
asked about are the device batch and half of it (the line through them
reaches the sizes beyond). On PyTorch and TensorFlow
with a GPU, the capacity search then checks the answer near the limit,
as it checks an estimate's (`capacity.search.Search`).

One account serves every variant, so that they compare: the memory in use
apart from the model's training state (the runtime, other buffers) is
read once, from the model as it is (`base_bytes`), and each variant's
record has its own training state (weights, optimizer slots, metrics)
added to that. A variant's state is counted from its variables, not read
from the device, where the original model's state is still held.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any, Callable, Optional

from keras_memwatch.measure.batches import fit_steps
from keras_memwatch.measure.device import Device
from keras_memwatch.capacity.evidence import PLAN, Evidence, Observation
from keras_memwatch.measure.host_memory import host_available_bytes
from keras_memwatch.measure.model_state import build_for_training
from keras_memwatch.capacity.search import Search, host_largest_batch
from keras_memwatch.variables import variable_bytes
from keras_memwatch.ways.variant import Variant

#: How a need was obtained, in the table's `how` column.
MEASURED = "measured"
PLANNED = "plan"
LINE = "line"
#: Real steps timed on JAX with a GPU, where plans give no step time.
TIMED_STEPS = 3


@dataclasses.dataclass(frozen=True)
class Measured:
    """What one variant needed.

    Attributes:
        observations: each size asked about, as `capacity.evidence` records it.
        state_bytes: the variant's training state (weights, optimizer
            slots, metrics), counted from its variables.
        in_use_bytes: memory in use on the device when it was measured.
        limit_bytes: the device's limit, or `None`.
        limit_words: where the limit comes from.
        device_batch: the size that stands for the wanted batch.
        seconds_per_sample: a measured step's time over its batch, or `None`.
        how: `MEASURED` (real steps) or `PLANNED` (XLA's plans).
        on_gpu: whether the device measured is a GPU.
    """

    observations: tuple[Observation, ...]
    state_bytes: int
    in_use_bytes: int
    limit_bytes: Optional[int]
    limit_words: str
    device_batch: int
    seconds_per_sample: Optional[float]
    how: str
    on_gpu: bool = False

    def evidence(self, base_bytes: int, limit_bytes: Optional[int]) -> Evidence:
        """The record as if this variant alone trained: `base_bytes` (in use
        apart from any model's state) plus its own state in use."""
        return Evidence(self.observations, limit_bytes, base_bytes + self.state_bytes)

    def step_bytes(self, evidence: Evidence) -> tuple[Optional[int], str]:
        """A step's need at the device batch and how it is known: measured
        where the size was, else read off the record (`LINE`)."""
        b = self.device_batch
        seen = [o for o in self.observations if o.batch_size == b and o.ran
                and o.need_bytes is not None]
        if seen:
            return max(o.need_bytes for o in seen), self.how
        needs = evidence.needs()
        line = evidence.line
        if not needs or line is None:
            return None, LINE
        nearest_b, nearest = min(needs, key=lambda p: abs(p[0] - b))
        ratio = nearest / line(nearest_b) if line(nearest_b) > 0 else 1.0
        return int(round(line(b) * ratio)), LINE


def state_bytes(model: Any) -> int:
    """Bytes of a compiled, built model's training state."""
    return variable_bytes(list(model.variables) + list(model.optimizer.variables)
                          + list(model.metrics_variables))


def sizes_for(batch: int, host_largest: Optional[int], spare: bool = False
              ) -> list[int]:
    """The sizes asked about: half and all of `batch` (at least two sizes),
    none above `host_largest`; with `spare`, a quarter of it too, so that
    two sizes stand on the line where real steps near a limit run out of
    memory at the wanted batch."""
    sizes = sorted({max(1, batch // 4), max(1, batch // 2), batch} if spare
                   else {max(1, batch // 2), batch})
    if len(sizes) < 2:
        sizes = [1, 2]
    if host_largest is not None:
        sizes = [s for s in sizes if s <= host_largest] or [1, 2]
    return sizes


def measure(variant: Variant, device: Optional[str], headroom: float,
            progress: Callable[[str], None]) -> Measured:
    """Measures `variant` at its device batch and below.

    Args:
        variant: the model and batch to measure.
        device: `"GPU:<i>"`, `"host"` or `None` (as `estimate_max_batch_size`).
        headroom: the fraction of the limit kept free, for the checks.
        progress: receives a line per size.

    Returns:
        A `Measured`.
    """
    import keras

    model, data = variant.model, variant.data
    build_for_training(model, data.take(1))
    backend = keras.backend.backend()
    dev = Device(backend, device)
    planned = backend == "jax"
    strategy: Any = None
    try:
        if planned:
            from keras_memwatch.capacity.xla import Plans

            strategy = Plans(model, data, dev, progress)
        else:
            from keras_memwatch.capacity.steps import Steps

            strategy = Steps(model, data, dev, progress)
        host_largest = None if dev.on_gpu else host_largest_batch(
            data.bytes_per_sample, host_available_bytes()[0])
        sizes = sizes_for(variant.batch_size, host_largest,
                          spare=dev.on_gpu and not planned)
        if planned:
            # The device batch compiled as `fit` compiles it (the timed steps
            # find it in JAX's cache), the sizes below it as the ladder does
            # (on a GPU without autotuning: the memory plan is made before
            # code generation); all of them stand as plans on the line.
            with concurrent.futures.ThreadPoolExecutor(2) as pool:  # side by side
                below = pool.submit(strategy.ladder, sizes[:-1])
                at = pool.submit(strategy.check, sizes[-1:])
                made = below.result() + at.result()
            observations = [dataclasses.replace(o, how=PLAN, ladder=True)
                            for o in made]
            seconds = _timed(model, data, variant.batch_size, observations,
                             strategy.limit, strategy.in_use)
            how = PLANNED
        else:
            search = Search(strategy, dev.on_gpu, host_largest)
            observations = list(search.run(headroom, sizes).observations)
            ran = [o for o in observations if o.ran and o.batch_size <=
                   variant.batch_size and o.seconds > 0]
            top = max(ran, key=lambda o: o.batch_size, default=None)
            seconds = None if top is None else top.seconds / top.batch_size
            how = MEASURED
        return Measured(tuple(observations), state_bytes(model), strategy.in_use,
                        strategy.limit, strategy.limit_words, variant.batch_size,
                        seconds, how, dev.on_gpu)
    finally:
        if hasattr(strategy, "close"):
            strategy.close()
        dev.close()


def _timed(model: Any, data: Any, batch: int, plans: list[Observation],
           limit: Optional[int], in_use: int) -> Optional[float]:
    """Seconds per sample of real steps at the largest planned size up to
    `batch` whose plan fits (JAX: plans give no time), or `None`."""
    room = None if limit is None else limit - in_use
    fitting = [o.batch_size for o in plans if o.need_bytes is not None
               and (room is None or o.need_bytes <= room)]
    size = max((b for b in fitting if b <= batch), default=None)
    if size is None:
        return None
    sample = data.take(size)
    fit_steps(model, sample, 1)  # compiles
    began = time.perf_counter()
    fit_steps(model, sample, TIMED_STEPS)
    return (time.perf_counter() - began) / (TIMED_STEPS * size)
