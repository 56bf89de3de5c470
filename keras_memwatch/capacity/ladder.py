"""The ladder: training steps at growing batch sizes, each one measured.

Its constants are those of the default ladder that `keras_memwatch.capacity`
describes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch.capacity import xla_compile
from keras_memwatch.capacity.batches import Batches
from keras_memwatch.capacity.fit import fit_linear, line_through
from keras_memwatch.capacity.meter import Meter
from keras_memwatch.explain.oom import is_oom_error
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")

TARGET = 0.05  # the ladder's largest working memory, of the free memory
SAFE = 0.20  # never try a size expected to need more, of the free memory
#: On a GPU measured by the allocator (PyTorch, TensorFlow), the ladder
#: climbs further: the line is checked against real steps near the limit
#: afterwards, and a line fitted over a quarter of the limit misses less.
TARGET_GPU = 0.25
SAFE_GPU = 0.50
#: A trial batch's own arrays (inputs and targets, built on the host by
#: repeating the sample) may take at most this fraction of the host's
#: available memory.
HOST_BATCH = 0.05
START = 2
MAX_TRIALS = 12
MIN_POINTS = 4
MAX_BATCH = 2**16
FLOOR = 2**20  # working memory assumed at least, when growing the ladder


@dataclasses.dataclass
class Ladder:
    """What the ladder measured.

    Attributes:
        points: `(batch_size, working_bytes)` of each size measured, in the
            order tried.
        hidden: the sizes whose peak an earlier high-water mark hid.
        stopped: why the ladder stopped early (out of memory), or `""`.
        limit: `(bytes, source, detail)` of the device's limit, read after
            the first step (see `Meter.limit`).
        reserved: `(batch_size, reserved_bytes)`: PyTorch's reserved peak
            of each step measured, above the reserved bytes before.
        bounded: why the ladder went no higher, where a bound stopped it
            (the host's room for the batch's arrays), or `""`.
        failed: the size that ran out of memory, where one did.
    """

    points: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    hidden: list[int] = dataclasses.field(default_factory=list)
    stopped: str = ""
    limit: tuple[Optional[int], str, str] = (None, "", "")
    reserved: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    bounded: str = ""
    failed: Optional[int] = None


def _quiet(message: str) -> None:
    logger.info("%s", message)


def climb(model: Any, data: Batches, meter: Meter,
          sizes: Optional[Sequence[int]], headroom: float,
          progress: Callable[[str], None] = _quiet) -> Ladder:
    """Trains and measures `model` at each batch size of the ladder.

    Args:
        model: a compiled, built Keras model.
        data: the sample batch.
        meter: the meter of the device.
        sizes: the batch sizes to measure, or `None` for the adaptive
            ladder.
        headroom: the fraction of the limit to keep free.
        progress: receives a line per size.

    Returns:
        A `Ladder`. An out-of-memory error stops the ladder (and says so in
        `stopped`); any other error is raised.
    """
    ladder = Ladder()
    if meter.method == "xla":
        return _climb_xla(model, data, meter, sizes, headroom, progress, ladder)
    queue = list(sizes) if sizes is not None else [START]
    return _climb(model, data, meter, sizes, headroom, progress, ladder, queue, 0)


def _climb(model: Any, data: Batches, meter: Meter, sizes: Optional[Sequence[int]],
           headroom: float, progress: Callable[[str], None], ladder: Ladder,
           queue: list[int], tried: int) -> Ladder:
    """The ladder of real steps, from `queue` on."""
    on_gpu_allocator = meter.on_gpu and meter.method in ("probes", "reserved")
    target, safe = (TARGET_GPU, SAFE_GPU) if on_gpu_allocator else (TARGET, SAFE)
    while queue:
        size = queue.pop(0)
        tried += 1
        batch = data.take(size)
        ran, working = _measured(model, batch, size, meter, ladder)
        if not ran:
            break
        if working is None:
            ladder.hidden.append(size)
        else:
            ladder.points.append((size, working))
            if meter.last_reserved is not None:
                ladder.reserved.append((size, meter.last_reserved))
        progress(f"estimate_max_batch_size: batch {size} on {meter.device}: "
                 "working memory "
                 + ("hidden" if working is None else format_bytes(working))
                 + ("" if meter.last_reserved is None or working is None else
                    f", reserved {format_bytes(meter.last_reserved)}"))
        if sizes is None:
            largest = host_bound(data, meter)
            new = next_size(size, ladder.points, working,
                            _free(ladder, meter, headroom), tried,
                            target=target, safe=safe)
            if new is not None and largest is not None and new > largest:
                ladder.bounded = (
                    f"no size above {size} tried: batch {new} alone would "
                    f"take {format_bytes(data.bytes_per_sample * new)} of host "
                    f"memory for its arrays, more than {HOST_BATCH:.0%} of "
                    "the host's available memory")
                new = None
            if new is not None:
                queue.append(new)
    return ladder


def host_bound(data: Batches, meter: Meter) -> Optional[int]:
    """The largest trial batch whose own arrays the host has room for."""
    from keras_memwatch.capacity.host_memory import host_available_bytes

    available, _ = host_available_bytes()
    if available is None or data.bytes_per_sample <= 0:
        return None
    return max(int(HOST_BATCH * available // data.bytes_per_sample), START)


def _climb_xla(model: Any, data: Batches, meter: Meter,
               sizes: Optional[Sequence[int]], headroom: float,
               progress: Callable[[str], None], ladder: Ladder) -> Ladder:
    """The ladder of XLA plans, compiled several at once.

    On a GPU every size is only compiled (`_plans_only`). On the CPU the
    first size is trained first (it warms up, and gives the host memory in
    use) and every other size only compiled, since XLA's plan of a step is
    what the method reads. Where the plan cannot be read at the first
    size, the ladder goes on with real steps and the probes.
    """
    planner = xla_compile.Planner(model, data.take(1), progress)
    if planner.aim_options is not None:
        return _plans_only(model, data, meter, sizes, headroom, progress, ladder,
                           planner)
    queue = list(sizes) if sizes is not None else [START]
    first = queue.pop(0)
    batch = data.take(first)
    ran, working = _measured(model, batch, first, meter, ladder)
    if not ran:
        return ladder
    if working is None or meter.method != "xla":  # fell back to the probes
        ladder.hidden.append(first)
        if sizes is None:
            queue = [first * 2]
        return _climb(model, data, meter, sizes, headroom, progress, ladder, queue, 1)
    ladder.points.append((first, working))
    progress(f"estimate_max_batch_size: batch {first} on {meter.device}: XLA plans "
             f"{format_bytes(working)} of working memory")
    if sizes is None:
        queue = xla_sizes(first, working, _free(ladder, meter, headroom),
                          host_bound(data, meter))
    if not queue:
        return ladder
    _plan(planner, queue, ladder)
    return _higher_if_bent(planner, data, meter, sizes, headroom, ladder)


def _plans_only(model: Any, data: Batches, meter: Meter,
                sizes: Optional[Sequence[int]], headroom: float,
                progress: Callable[[str], None], ladder: Ladder,
                planner: xla_compile.Planner) -> Ladder:
    """The ladder of XLA plans on a GPU: every size compiled, none run.

    The memory in use is the training state, built; a first real step
    would add a compilation with autotuning that nothing here needs (an
    H200, a transformer's ladder: 17 s with it, 8.5 s without). The
    default ladder plans its smallest sizes (`START` and `xla_sizes` at
    their least) in one round, then larger ones where those plans are
    small. Where no plan can be compiled, the ladder goes on with real
    steps and the probes.
    """
    meter.set_baseline()
    ladder.limit = meter.limit()
    make = getattr(model, "make_train_function", None)
    if callable(make):
        make()  # the step `fit` runs: the plans go through it
    queue = (list(sizes) if sizes is not None
             else [START] + xla_sizes(START, None, None, None))
    try:
        _plan(planner, queue, ladder)
    except Exception as e:
        meter.fall_back(e)
        meter.baseline = None  # read after the first real step, as there
        ladder.points.clear()
        queue = list(sizes) if sizes is not None else [START]
        return _climb(model, data, meter, sizes, headroom, progress, ladder, queue, 0)
    if sizes is None and ladder.points:
        first, working = ladder.points[0]
        known = {b for b, _ in ladder.points}
        _plan(planner, [b for b in xla_sizes(first, working,
                                             _free(ladder, meter, headroom),
                                             host_bound(data, meter))
                        if b not in known], ladder)
    return _higher_if_bent(planner, data, meter, sizes, headroom, ladder)


def _higher_if_bent(planner: xla_compile.Planner, data: Batches, meter: Meter,
                    sizes: Optional[Sequence[int]], headroom: float,
                    ladder: Ladder) -> Ladder:
    """Plans larger sizes where the default ladder's plans are not one line:
    small batches' plans can hold a workspace that does not grow with the
    batch (convolutions), so the line is looked for higher up."""
    if sizes is None and ladder.points and not fit_linear(ladder.points).linear:
        _plan(planner, larger_sizes(ladder.points, _free(ladder, meter, headroom),
                                    host_bound(data, meter)), ladder)
    return ladder


def _plan(planner: xla_compile.Planner, sizes: list[int], ladder: Ladder) -> None:
    """Adds the plans of `sizes` to the ladder's points."""
    if not sizes:
        return
    # The line only aims the searches: on a GPU, without autotuning.
    for size, working in planner.plans(sizes, aim=True).items():
        if isinstance(working, Exception):
            if not is_oom_error(working):
                raise working
            ladder.stopped = (f"batch {size} could not be compiled: out of memory "
                              f"({type(working).__name__})")
            continue
        ladder.points.append((size, working))
    ladder.points.sort()


def larger_sizes(points: list[tuple[int, int]], free: Optional[float],
                 largest: Optional[int]) -> list[int]:
    """Two sizes above the ladder's, 2 and 4 times its top, those whose
    plan (scaled from the top's) stays under `TARGET_GPU` of the free
    memory and whose arrays the host has room for."""
    top, working = points[-1]
    out = []
    for size in (2 * top, 4 * top):
        if size > MAX_BATCH or (largest is not None and size > largest):
            break
        if free is not None and working * size / top > TARGET_GPU * free:
            break
        out.append(size)
    return out


def xla_sizes(first: int, working: Optional[int], free: Optional[float],
              largest: Optional[int]) -> list[int]:
    """The sizes whose plans make the line, after the first.

    Three more sizes, by factors of 4 from the first, up to where the
    first plan's working memory per sample (an overestimate, as it holds
    the constant part) reaches `TARGET` of the free memory; without that
    plan (`working` None), the least: up to 8 times the first.
    """
    top = first * 64 if working is not None else first * 8
    if working is not None and free is not None and free > 0:
        per_sample = max(working / first, 1.0)
        while top > first * 8 and per_sample * top > TARGET * free:
            top //= 2
        while top * 2 <= MAX_BATCH and per_sample * top * 2 <= TARGET * free:
            top *= 2
    if largest is not None:
        top = max(min(top, largest), first * 8)
    top = min(top, MAX_BATCH)
    mid = max(first * 2, int(round((first * top) ** 0.5)))
    low = max(first + 1, int(round((first * mid) ** 0.5)))
    return sorted({low, mid, top} - {first})


def _measured(model: Any, batch: Any, size: int, meter: Any,
              ladder: Any) -> tuple[bool, Optional[int]]:
    """`(True, working memory)` of one size, or `(False, None)` when it ran
    out of memory (said in `ladder`, which stops there)."""
    try:
        return True, _measure_size(model, batch, size, meter, ladder)
    except Exception as e:
        if not is_oom_error(e):
            raise
        ladder.stopped = f"batch {size} ran out of memory ({type(e).__name__})"
        ladder.failed = size
        logger.warning("estimate_max_batch_size: %s; the ladder stops there",
                       ladder.stopped)
        return False, None


def _measure_size(model: Any, batch: tuple[Any, Any], size: int, meter: Meter,
                  ladder: Ladder) -> Optional[int]:
    """Trains on `batch` and measures a step (see `Meter.measure`).

    The first step at a size compiles for its shape (and, at the first
    size, builds and warms up); the baseline and the limit are read after
    the very first step.
    """

    def step() -> None:
        model.train_on_batch(batch[0], batch[1])

    meter.begin_size()
    step()
    if meter.baseline is None:
        meter.set_baseline()
        ladder.limit = meter.limit()
    return meter.measure(step, model, batch, size)


def _free(ladder: Ladder, meter: Meter, headroom: float) -> Optional[float]:
    """The memory left under the limit less the headroom, or `None`."""
    limit = ladder.limit[0]
    if limit is None or meter.baseline is None:
        return None
    return limit * (1 - headroom) - meter.baseline


def next_size(size: int, points: list[tuple[int, int]], last: Optional[int],
              free: Optional[float], tried: int, target: float = TARGET,
              safe: float = SAFE) -> Optional[int]:
    """The adaptive ladder's next batch size.

    Args:
        size: the size just measured.
        points: `(batch_size, working_bytes)` measured so far.
        last: the working memory measured at `size`, or `None`.
        free: the memory left under the limit less the headroom, or `None`.
        tried: how many sizes were tried.
        target: the ladder stops once a size's working memory reaches this
            fraction of `free` (and the line fits). Defaults to `TARGET`.
        safe: no size expected to need more than this fraction of `free`
            is tried. Defaults to `SAFE`.

    Returns:
        The next size, or `None` to stop.
    """
    if tried >= MAX_TRIALS:
        return None
    if free is None or free <= 0:
        return size * 2 if tried < MIN_POINTS else None
    if (len(points) >= MIN_POINTS and last is not None and last >= target * free
            and fit_linear(points).linear):
        return None
    floor = max(last or 0, FLOOR)
    factor = 2
    while factor < 8 and floor * factor * 2 <= target * free:
        factor *= 2

    def expected(new: int) -> float:
        guess = floor * new / size
        if len(points) >= 2:
            line = line_through(points[-2:])
            guess = max(guess, line.static_bytes + line.per_sample_bytes * new)
        return guess

    while factor > 2 and expected(size * factor) > safe * free:
        factor //= 2
    new = size * factor
    if expected(new) > safe * free or new > MAX_BATCH:
        return None
    return new
