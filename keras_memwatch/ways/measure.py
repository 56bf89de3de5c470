"""What a variant needs, measured the way `estimate_max_batch_size` measures.

Each variant (`variant.Variant`) is measured by the capacity package's
strategies: XLA's plans of the step on JAX (compiled, never run: the
device batch and half of it, both as `fit` compiles them, side by side),
and a few real steps for the time (at a size compiled already); real
steps of `fit` on PyTorch and TensorFlow (the allocator's peak on a GPU,
the host's peak resident memory on a CPU, TensorFlow's CPU allocator's
where it keeps statistics). On JAX the plan serves on the
host too: the host's resident memory keeps what an earlier variant
freed, so variants measured one after another by it do not compare
(`docs/ways-to-fit.md`). The sizes asked about are the device batch and
half of it (the line through them reaches the sizes beyond). On a GPU,
the capacity search then brackets the largest batch near the limit, as it
brackets an estimate's answers (`capacity.search.Search`: real steps on
PyTorch and TensorFlow, quick plans that aim and plans as `fit` compiles
them that decide on JAX).

One account serves every variant, so that they compare: the memory in use
apart from the model's training state (the runtime, other buffers) is
read once, from the model as it is (`base_bytes`), and a planned
variant's record has its own training state (counted from its variables)
added to that. Real steps on a GPU ran in a room of their own: the user's
model held beside the variant (`room`), less what the cap was widened by
(PyTorch). Their record is read in that room, where its steps ran and
ran out of memory, so that no answer lies above what the variant alone
fits.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

from keras_memwatch.measure.batches import fit_steps
from keras_memwatch.measure.device import Device
from keras_memwatch.capacity import stored_record
from keras_memwatch.capacity.deadline import Deadline
from keras_memwatch.capacity.evidence import AIMED, PLAN, Evidence, Observation
from keras_memwatch.measure.host_memory import host_available_bytes
from keras_memwatch.measure.model_state import build_for_training
from keras_memwatch.oom_errors import is_oom_error
from keras_memwatch.capacity.search import Search, host_largest_batch
from keras_memwatch.variables import variable_bytes
from keras_memwatch.ways import room
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
        sample_seconds: seconds a sample of real steps, by batch size: the
            sizes up to `device_batch` that ran undisturbed (on JAX, the
            largest whose plan fits).
        how: `MEASURED` (real steps) or `PLANNED` (XLA's plans).
        on_gpu: whether the device measured is a GPU.
        held_bytes: the user's training state held beside the variant that
            a run of it alone would not hold (`room.held_bytes`).
        widened_bytes: what the allocator's cap was raised by while the
            variant was measured (`room.widened`); `limit_bytes` is the
            cap before.
        left_open: where the time ran out (`max_seconds`), what the search
            left unmeasured or unbracketed; else `""`.
        build_left: `(batch, bytes)`: the most that Keras's build for the
            first batch left in reference cycles, held through the steps
            (`capacity.steps`); `(0, 0)` where it left nothing.
    """

    observations: tuple[Observation, ...]
    state_bytes: int
    in_use_bytes: int
    limit_bytes: Optional[int]
    limit_words: str
    device_batch: int
    sample_seconds: dict[int, float]
    how: str
    on_gpu: bool = False
    held_bytes: int = 0
    widened_bytes: int = 0
    left_open: str = ""
    build_left: tuple[int, int] = (0, 0)

    @property
    def ran_steps(self) -> bool:
        """Whether real steps ran on a GPU: the record's failures are real,
        in the room the steps met."""
        return self.on_gpu and self.how == MEASURED

    def evidence(self, base_bytes: int, limit_bytes: Optional[int],
                 extra_bytes: int = 0) -> Evidence:
        """The record under `limit_bytes`, with `extra_bytes` more in use.

        Real steps on a GPU are read in the room they ran in: the memory
        in use when they ran, less what the cap was widened by (the
        user's state held beside the variant, where the cap could not
        widen, stays counted: the answers err low). Plans and the host's
        steps are read as if the variant alone trained: `base_bytes` (in
        use apart from any model's state) plus its own state.
        """
        in_use = (self.in_use_bytes - self.widened_bytes if self.ran_steps
                  else base_bytes + self.state_bytes)
        return Evidence(self.observations, limit_bytes, in_use + extra_bytes)

    def step_bytes(self, evidence: Evidence) -> tuple[Optional[int], str]:
        """A step's need at the device batch and how it is known (the
        table's `how`): measured where the size ran; else the line through
        the record, times its ratio at the nearest size that did not fail
        (`LINE`). Where sizes failed, the largest seen to fit counts as
        needing the whole room (as `Evidence` reads it), so a device batch
        that ran out of memory reads what the line, scaled to where the
        room ran out, puts there, not the room that every variant out of
        memory shares (the room only where nothing below it ran: a lower
        bound, and `how` says so)."""
        b = self.device_batch
        seen = [o for o in self.observations if o.batch_size == b and o.ran
                and o.need_bytes is not None and o.how != AIMED]
        if seen:
            return max(o.need_bytes for o in seen), self.how
        failed = evidence.smallest_failure
        out = failed is not None and failed <= b
        how = (f"{LINE} (batch {b} ran out of memory; read off the sizes that "
               "ran)" if out else f"{LINE} (batch {b} read off the sizes measured)")
        needs = evidence.needs()
        line = evidence.line
        if not needs or line is None:
            return None, how
        fitted = {o.batch_size for o in self.observations
                  if o.how != AIMED and not evidence.failed(o)}
        points = [(size, need) for size, need in needs if size in fitted] or needs
        nearest_b, nearest = min(points, key=lambda p: abs(p[0] - b))
        ratio = nearest / line(nearest_b) if line(nearest_b) > 0 else 1.0
        need = int(round(line(b) * ratio))
        if out and evidence.limit_bytes is not None and need <= evidence.room(0.0):
            return int(evidence.room(0.0)) + 1, (
                f"at least (batch {b} ran out of memory; the sizes that ran put "
                "it under the room)")
        return need, how


def state_bytes(model: Any) -> int:
    """Bytes of a compiled, built model's training state."""
    return variable_bytes(room.state_variables(model, model.optimizer))


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
            progress: Callable[[str], None], deadline: Optional[Deadline] = None,
            cache_directory: Optional[str] = None,
            base_bytes: Optional[int] = None,
            checks: Optional[Callable[[Any, int], Any]] = None) -> Measured:
    """Measures `variant` at its device batch and below.

    Args:
        variant: the model and batch to measure.
        device: `"GPU:<i>"`, `"host"` or `None` (as `estimate_max_batch_size`).
        headroom: the fraction of the limit kept free, for the checks.
        progress: receives a line per size.
        deadline: when the search stops asking (`max_seconds`); the sizes
            that stand for the wanted batch are measured whatever the
            time. Defaults to `None`: no limit.
        cache_directory: JAX's compilation cache directory in use, where
            a planned variant's record is kept and read back
            (`capacity.stored_record`). Defaults to `None`: none.
        base_bytes: in use apart from any model's state, read from the
            model as it is (`table.Account.base`): a planned variant is
            searched in the room it is read in, this plus its own state.
            Defaults to `None` (the model as it is): what is in use, less
            the user's state held beside the variant.
        checks: given the strategy and the bytes the cap was widened by,
            the strategy whose checks decide (`fresh_job.FreshJobs.around`).
            Defaults to `None`: the strategy's own.

    Returns:
        A `Measured`.
    """
    import keras

    model, data = variant.model, variant.data
    build_for_training(model, data.take(1))
    backend = keras.backend.backend()
    deadline = deadline if deadline is not None else Deadline(None)
    with room.widened(backend, device, variant.held_bytes) as widened:
        dev = Device(backend, device)
        strategy: Any = None
        try:
            strategy = strategy_for(model, data, dev, progress)
            if checks is not None:
                strategy = checks(strategy, widened)
            host_largest = None if dev.on_gpu else host_largest_batch(
                data.bytes_per_sample, host_available_bytes()[0])
            planned = strategy.how == PLAN
            sizes = sizes_for(variant.batch_size, host_largest,
                              spare=dev.on_gpu and not planned)
            state = state_bytes(model)
            if planned:
                alone = (strategy.in_use - variant.held_bytes if base_bytes is None
                         else base_bytes + state)
                observations, seconds, search = _by_plans(
                    strategy, variant, sizes, headroom, deadline, cache_directory,
                    dev.on_gpu, alone)
                how = PLANNED
                build_left = (0, 0)
            else:
                observations, seconds, search = _by_steps(
                    strategy, variant, sizes, headroom, deadline, dev.on_gpu,
                    host_largest)
                how = MEASURED
                build_left = strategy.build_left
            limit = None if strategy.limit is None else strategy.limit - widened
            left = ((search.checks_left or search.stopped or "out of time "
                     "(max_seconds)") if search.out_of_time else "")
            return Measured(tuple(observations), state, strategy.in_use,
                            limit, strategy.limit_words, variant.batch_size,
                            seconds, how, dev.on_gpu, variant.held_bytes, widened,
                            left, build_left)
        finally:
            if hasattr(strategy, "close"):
                strategy.close()
            dev.close()


def _by_plans(strategy: Any, variant: Variant, sizes: list[int], headroom: float,
              deadline: Deadline, cache_directory: Optional[str], on_gpu: bool,
              in_use: int) -> tuple[list[Observation], dict[int, float], Search]:
    """XLA's plans at `sizes` (read from the row's stored record where it
    holds them), then on a GPU the search's brackets with `in_use` bytes
    in use (the variant alone's); the record, a sample's seconds, and the
    search."""
    # a row's record of its own: its sizes are not an estimate's
    key = strategy.fingerprint(record="ways_to_fit") if cache_directory else None
    stored = (stored_record.load(cache_directory, key) if key is not None
              else stored_record.Stored([]))
    observations, seconds = _planned(strategy, variant.model, variant.data, sizes,
                                     variant.batch_size, stored.observations)
    search = Search(strategy, on_gpu, None, deadline=deadline, known=observations,
                    in_use=in_use)
    if on_gpu and strategy.limit is not None:
        # aims and checks until the record brackets the largest batch under
        # `headroom` and under the whole limit
        observations = list(search.run(headroom, None).observations)
    if key is not None and len(observations) > len(stored.observations):
        stored_record.save(cache_directory, key, observations, stored.stopped)
    return observations, seconds, search


def _by_steps(strategy: Any, variant: Variant, sizes: list[int], headroom: float,
              deadline: Deadline, on_gpu: bool, host_largest: Optional[int]
              ) -> tuple[list[Observation], dict[int, float], Search]:
    """Real steps at `sizes`, and on a GPU the search's checks near the
    limit; the record, a sample's seconds by size, and the search. The
    seconds are read at `sizes` (or the sizes below them that drew the
    line) where the steps ran undisturbed: every row asks the same ones,
    and a check near the limit is slowed by the allocator freeing its
    cache and retrying."""
    search = Search(strategy, on_gpu, host_largest, deadline=deadline)
    observations = list(search.run(headroom, sizes).observations)
    seconds = {o.batch_size: o.step_seconds / o.batch_size for o in observations
               if o.ladder and o.ran and o.batch_size <= variant.batch_size
               and o.step_seconds}
    return observations, seconds, search


def strategy_for(model: Any, data: Any, device: Device,
                 progress: Callable[[str], None]) -> Any:
    """The capacity strategy that measures a variant: XLA's plans on JAX
    (on the host too), real steps elsewhere."""
    if device.backend == "jax":
        from keras_memwatch.capacity.xla import Plans

        return Plans(model, data, device, progress)
    from keras_memwatch.capacity.steps import Steps

    return Steps(model, data, device, progress)


def _planned(strategy: Any, model: Any, data: Any, sizes: list[int],
             batch: int, stored: list[Observation]
             ) -> tuple[list[Observation], dict[int, float]]:
    """Every size compiled as `fit` compiles it, side by side (exact plans
    for the line; the timed steps find their size in JAX's cache), those
    in the `stored` record read from it, and the seconds a sample of real
    steps."""
    known = {o.batch_size for o in stored if o.how == PLAN}
    made = strategy.check([b for b in sizes if b not in known])
    observations = stored + [dataclasses.replace(o, how=PLAN, ladder=True)
                             for o in made]
    seconds = _timed(model, data, batch, [o for o in observations if o.how == PLAN
                                          and o.batch_size in sizes],
                     strategy.limit, strategy.in_use)
    return observations, seconds


def _timed(model: Any, data: Any, batch: int, plans: list[Observation],
           limit: Optional[int], in_use: int) -> dict[int, float]:
    """Seconds per sample of real steps at the largest planned size up to
    `batch` whose plan fits (JAX: plans give no time), by that size; empty
    where none fits or its steps ran out of memory."""
    room = None if limit is None else limit - in_use
    fitting = [o.batch_size for o in plans if o.need_bytes is not None
               and (room is None or o.need_bytes <= room)]
    size = max((b for b in fitting if b <= batch), default=None)
    if size is None:
        return {}
    sample = data.take(size)
    try:
        fit_steps(model, sample, 1)  # compiles
        began = time.perf_counter()
        fit_steps(model, sample, TIMED_STEPS)
    except Exception as e:
        if not is_oom_error(e):
            raise
        return {}  # its plan fit the room, its steps did not: no time
    return {size: (time.perf_counter() - began) / (TIMED_STEPS * size)}
