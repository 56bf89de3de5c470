"""The ladder: training steps at growing batch sizes, each one measured.

Its constants are those of the default ladder that `keras_memwatch.capacity`
describes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Optional

from keras_memwatch.capacity.batches import Batches
from keras_memwatch.capacity.fit import fit_linear, line_through
from keras_memwatch.capacity.meter import Meter
from keras_memwatch.oom import is_oom_error
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")

TARGET = 0.05  # the ladder's largest working memory, of the free memory
SAFE = 0.20  # never try a size expected to need more, of the free memory
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
    """

    points: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    hidden: list[int] = dataclasses.field(default_factory=list)
    stopped: str = ""
    limit: tuple[Optional[int], str, str] = (None, "", "")


def climb(model: Any, data: Batches, meter: Meter,
          sizes: Optional[Sequence[int]], headroom: float) -> Ladder:
    """Trains and measures `model` at each batch size of the ladder.

    Args:
        model: a compiled, built Keras model.
        data: the sample batch.
        meter: the meter of the device.
        sizes: the batch sizes to measure, or `None` for the adaptive
            ladder.
        headroom: the fraction of the limit to keep free.

    Returns:
        A `Ladder`. An out-of-memory error stops the ladder (and says so in
        `stopped`); any other error is raised.
    """
    ladder = Ladder()
    queue = list(sizes) if sizes is not None else [START]
    tried = 0
    while queue:
        size = queue.pop(0)
        tried += 1
        batch = data.take(size)
        try:
            working = _measure_size(model, batch, size, meter, ladder)
        except Exception as e:
            if not is_oom_error(e):
                raise
            ladder.stopped = f"batch {size} ran out of memory ({type(e).__name__})"
            logger.warning("estimate_max_batch_size: %s; the ladder stops there",
                           ladder.stopped)
            break
        if working is None:
            ladder.hidden.append(size)
        else:
            ladder.points.append((size, working))
        logger.debug("estimate_max_batch_size: batch %s on %s: working memory %s",
                     size, meter.device,
                     "hidden" if working is None else format_bytes(working))
        if sizes is None:
            new = next_size(size, ladder.points, working,
                            _free(ladder, meter, headroom), tried)
            if new is not None:
                queue.append(new)
    return ladder


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
              free: Optional[float], tried: int) -> Optional[int]:
    """The adaptive ladder's next batch size.

    Args:
        size: the size just measured.
        points: `(batch_size, working_bytes)` measured so far.
        last: the working memory measured at `size`, or `None`.
        free: the memory left under the limit less the headroom, or `None`.
        tried: how many sizes were tried.

    Returns:
        The next size, or `None` to stop.
    """
    if tried >= MAX_TRIALS:
        return None
    if free is None or free <= 0:
        return size * 2 if tried < MIN_POINTS else None
    if (len(points) >= MIN_POINTS and last is not None and last >= TARGET * free
            and fit_linear(points).linear):
        return None
    floor = max(last or 0, FLOOR)
    factor = 2
    while factor < 8 and floor * factor * 2 <= TARGET * free:
        factor *= 2

    def expected(new: int) -> float:
        guess = floor * new / size
        if len(points) >= 2:
            line = line_through(points[-2:])
            guess = max(guess, line.static_bytes + line.per_sample_bytes * new)
        return guess

    while factor > 2 and expected(size * factor) > SAFE * free:
        factor //= 2
    new = size * factor
    if expected(new) > SAFE * free or new > MAX_BATCH:
        return None
    return new
