"""`mem_peak_mib` and `mem_current_mib` for Keras's batch and epoch logs.

Filled on the hot path from the raw read of the main device (no rows are
built there), so the progress bar, `History` and `CSVLogger` show them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Optional

from keras_memwatch.sampler import Sampler
from keras_memwatch.step_plan import StepPlanner
from keras_memwatch.units import MIB


class LogsMetrics:
    """The main device's figures, per batch from a raw read.

    Args:
        sampler: the fit's started sampler.
        primary: index of the main device.
        planner: XLA's plans (JAX), for a device without a per-step peak.
    """

    def __init__(self, sampler: Sampler, primary: int,
                 planner: Optional[StepPlanner]):
        self._planner = planner
        self._last_current: Optional[int] = None
        self._current = self._peak = None
        if sampler.devices:
            self._current = value_reader(sampler, primary,
                                         sampler.current_columns[primary])
            if sampler.per_step_peak[primary]:
                self._peak = value_reader(sampler, primary,
                                          (sampler.peak_columns[primary],))

    def add(self, key: Hashable, raw: list, logs: dict) -> None:
        """Adds one batch's figures to its logs (reads in batch order)."""
        if self._current is None:
            return
        current = self._current(raw)
        if self._peak is not None:
            peak = self._peak(raw)
        else:  # JAX: in use before the step plus its plan's working part
            plan = self._planner.peek(key) if self._planner else None
            before = self._last_current
            peak = None if plan is None or before is None else before + plan.working_bytes
        self._last_current = current
        if peak is not None and current is not None and peak < current:
            peak = current
        add_metrics(logs, peak, current)


def add_metrics(logs: dict, peak: Optional[int], current: Optional[int]) -> None:
    """Puts the figures into Keras's `logs`, in MiB; a missing one is left out."""
    if peak is not None:
        logs["mem_peak_mib"] = peak / MIB
    if current is not None:
        logs["mem_current_mib"] = current / MIB

def value_reader(sampler: Sampler, device_index: int,
                 columns: tuple[str, ...]) -> Callable[[list], Optional[Any]]:
    """A cheap reader of one device's first present value among `columns`
    in a raw `Sampler.read()`, for the hot path (Keras's batch logs)."""
    places = sampler.places(device_index, columns)
    if len(places) == 1:  # the usual case, as cheap as can be
        (probe, slot, column), = places

        def read_one(raw: list) -> Optional[Any]:
            readings = raw[probe]
            if type(readings) is tuple:
                try:
                    return readings[slot][column]
                except (TypeError, IndexError):  # a probe that broke its shape
                    return None
            return read(raw)

        return read_one

    def read(raw: list) -> Optional[Any]:
        for probe, slot, column in places:
            readings = raw[probe]
            if isinstance(readings, (tuple, list)):
                try:
                    value = readings[slot][column]
                except (TypeError, IndexError):
                    continue
                if value is not None:
                    return value
        return None

    return read
