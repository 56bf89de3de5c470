"""The ladder: the small sizes measured first, from which the small-batch
line is drawn (`search.Search` asks them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from keras_memwatch.capacity.evidence import Observation

__all__ = ["HOST_BATCH", "MAX_LADDER", "SAFE", "SLOW_S", "START", "TARGET",
           "host_largest_batch", "next_sizes", "rungs"]

START = 1
TARGET = 0.25  # the ladder's largest need, of the whole room
SAFE = 0.5  # never try a size expected to need more, of the room
HOST_BATCH = 0.05  # a trial batch's arrays, of the host's available memory
SLOW_S = 2.0  # on the host, the ladder stops after a size this slow
MAX_LADDER = 12


def next_sizes(observations: Sequence[Observation], room: Optional[float],
               above_limit: bool, host_largest: Optional[int]
               ) -> tuple[list[int], str]:
    """The next size up (none where the ladder is done), and why it stops
    (`""` where it reached `TARGET` of the room or goes on)."""
    points = sorted((o.batch_size, o.need_bytes) for o in observations
                    if o.ladder and o.need_bytes is not None)
    if not points:
        return [], "no peak could be read"
    top, need = points[-1]
    per_sample = max(need / top, _slope(points), 1.0)
    if room is None:
        return ([top * 2] if len(points) < 4 else []), ""
    if need >= TARGET * room and len(points) >= 2:
        return [], ""
    aim = int(TARGET * room / per_sample)
    size = min(max(aim, top * 2), top * 8)
    while size > top * 2 and need + per_sample * (size - top) > SAFE * room:
        size //= 2
    if need + per_sample * (size - top) > SAFE * room and not above_limit:
        return [], f"batch {size} would need more than {SAFE:.0%} of the room"
    if host_largest is not None and size > host_largest:
        return [], (f"batch {size} would take more than {HOST_BATCH:.0%} of the "
                    "host's available memory for its arrays")
    return [size], ""


def rungs(observations: Sequence[Observation], room: Optional[float]) -> list[int]:
    """The sizes measured beside the ladder, its own way (on a GPU, the
    quick plans `search.BEYOND`), that it would have climbed to itself:
    from the smallest above its top, while the ladder below them needs
    less than `TARGET` of `room`; none that needs more than `SAFE` of it."""
    ladder = sorted((o.batch_size, o.need_bytes, o.how) for o in observations
                    if o.ladder and o.need_bytes is not None)
    if room is None or not ladder:
        return []
    top, need, how = ladder[-1]
    out: list[int] = []
    for o in sorted((o for o in observations
                     if not o.ladder and o.how == how and o.batch_size > top),
                    key=lambda o: o.batch_size):
        if (need >= TARGET * room or not o.ran or o.need_bytes is None
                or o.need_bytes > SAFE * room):
            break
        out.append(o.batch_size)
        need = o.need_bytes
    return out


def _slope(points: Sequence[tuple[int, float]]) -> float:
    """The slope between the two largest points, or 0."""
    if len(points) < 2:
        return 0.0
    (b1, n1), (b2, n2) = points[-2], points[-1]
    return max((n2 - n1) / (b2 - b1), 0.0)


def host_largest_batch(bytes_per_sample: int, available: Optional[int]) -> Optional[int]:
    """The largest trial batch whose own arrays fit `HOST_BATCH` of the
    host's available memory, or `None`."""
    if available is None or bytes_per_sample <= 0:
        return None
    return max(int(HOST_BATCH * available // bytes_per_sample), 2 * START)
