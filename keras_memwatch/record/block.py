"""A block of samples as arrays: what flows from the sampler to the monitor,
the recorder and the streamed log.

Each device's samples form one int64 table, a row a sample: first the
derived columns (`DERIVED_COLUMNS`: peak, current, baseline, plan), then
the device's source columns. A missing value is `MISSING` (-1; bytes are
never negative). Working a block at a time in numpy, instead of a sample at
a time in Python, is what keeps the pipeline's thread from taking the
interpreter from the training loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Optional

import numpy as np

from keras_memwatch import columns as C

MISSING = -1

#: `Block.phase` of each phase.
PHASE_CODES = {phase: i for i, phase in enumerate(C.PHASES)}

#: Columns of every device's table, before its sources.
PEAK, CURRENT, BASELINE, PLAN = (C.DERIVED_COLUMNS.index(name) for name in (
    "peak_bytes", "current_bytes", "baseline_bytes", C.PLAN))


def table_columns(sources: Sequence[str]) -> tuple[str, ...]:
    """The columns of a table of a device with these source columns."""
    return C.DERIVED_COLUMNS + tuple(sources)


@dataclasses.dataclass
class Block:
    """Consecutive samples of every device.

    Attributes:
        step, epoch: int64 per sample.
        batch: int64 per sample, `MISSING` for the sample at a call's start.
        phase: int8 per sample, an index into `PHASES`.
        time_s: float64 per sample, seconds since the call began.
        tables: per device, its int64 table (see the module's docstring).
        spikes: per device, a bool per sample. Defaults to all `False`.
        timestamp: float64 per sample, UNIX seconds. Defaults to missing
            (NaN).
    """

    step: np.ndarray
    epoch: np.ndarray
    batch: np.ndarray
    phase: np.ndarray
    time_s: np.ndarray
    tables: list[np.ndarray]
    spikes: list[np.ndarray] = dataclasses.field(default_factory=list)
    timestamp: np.ndarray = None  # type: ignore[assignment]  # NaN, filled below

    def __post_init__(self) -> None:
        n = len(self.step)
        if not self.spikes:
            self.spikes = [np.zeros(n, bool) for _ in self.tables]
        if self.timestamp is None:
            self.timestamp = np.full(n, np.nan)

    def __len__(self) -> int:
        return len(self.step)


def optional(value: int) -> Optional[int]:
    """A table value as Python: None where missing."""
    return None if value < 0 else int(value)


def rows_of(tables: Sequence[np.ndarray], columns: Sequence[Sequence[str]],
            i: int = 0) -> list[dict[str, Optional[int]]]:
    """Sample `i` of each device's table as a dict of its columns."""
    return [{name: optional(v) for name, v in zip(names, table[i].tolist())}
            for table, names in zip(tables, columns)]


def before_each(values: np.ndarray, first: int) -> np.ndarray:
    """Each position's previous value; `first` before the first."""
    out = np.empty_like(values)
    out[:1] = first
    out[1:] = values[:-1]
    return out


def last_present_before(values: np.ndarray, first: int) -> np.ndarray:
    """At each position, the last value not missing before it (`first`, or
    `MISSING`, where there is none in `values`)."""
    n = len(values)
    where = np.where(values >= 0, np.arange(n), -1)
    np.maximum.accumulate(where, out=where)
    where = before_each(where, -1)
    return np.where(where >= 0, values[where], first)


def last_present(values: np.ndarray, first: Optional[int]) -> Optional[int]:
    """The last value not missing, or `first` where there is none."""
    present = values[values >= 0]
    return int(present[-1]) if len(present) else first
