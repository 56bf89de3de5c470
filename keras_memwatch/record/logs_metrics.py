"""`mem_peak_mib` and `mem_current_mib` for Keras's batch and epoch logs.

Filled on the hot path from the raw read of the main device (no rows are
built there), so the progress bar, `History` and `CSVLogger` show them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Optional

from keras_memwatch.record.sampler import Sampler
from keras_memwatch.judge.step_plan import StepPlanner
from keras_memwatch.units import MIB

#: Puts one training batch's figures into its logs: `(key, raw read, logs)`.
Figures = Callable[[Hashable, list, dict], None]


class LogsMetrics:
    """The main device's figures, per batch from a raw read.

    `add(key, raw, logs)` adds one batch's figures to its logs (reads in
    batch order). Where one probe gives both the current bytes and a peak
    per step (the usual case), it is a single closure with no calls.

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
        self.add: Figures = self._add
        if not sampler.devices:
            self.add = _nothing
            return
        current = sampler.current_columns[primary]
        self._current = value_reader(sampler, primary, current)
        if sampler.per_step_peak[primary]:
            peak = (sampler.peak_columns[primary],)
            self._peak = value_reader(sampler, primary, peak)
            places = sampler.places(primary, current), sampler.places(primary, peak)
            if len(places[0]) == len(places[1]) == 1:
                self.add = _direct(places[0][0], places[1][0], self._add)

    def _add(self, key: Hashable, raw: list, logs: dict) -> None:
        current = _bytes(self._current(raw))
        if self._peak is not None:
            peak = _bytes(self._peak(raw))
        else:  # JAX: in use before the step plus its plan's working part
            plan = self._planner.peek(key) if self._planner else None
            before = self._last_current
            peak = None if plan is None or before is None else before + plan.working_bytes
        self._last_current = current
        if peak is not None and current is not None and peak < current:
            peak = current
        add_metrics(logs, peak, current)


def _direct(current_at: tuple[int, int, int], peak_at: tuple[int, int, int],
            otherwise: Figures) -> Figures:
    """Figures read straight from the raw read; anything unusual (a probe
    not read, failed or giving garbage) goes to `otherwise`."""
    (cp, cs, cc), (pp, ps, pc) = current_at, peak_at

    def add(key: Hashable, raw: list, logs: dict) -> None:
        try:
            current, peak = raw[cp][cs][cc], raw[pp][ps][pc]
        except (TypeError, IndexError, KeyError):
            return otherwise(key, raw, logs)
        if type(current) is not int or type(peak) is not int or current < 0:
            return otherwise(key, raw, logs)
        logs["mem_peak_mib"] = (peak if peak > current else current) / MIB
        logs["mem_current_mib"] = current / MIB

    return add


def _nothing(key: Hashable, raw: list, logs: dict) -> None:
    """No device: no figures."""


def _bytes(value: Any) -> Optional[int]:
    """A byte count, or None for anything else (a probe's garbage)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def add_metrics(logs: dict, peak: Optional[int], current: Optional[int]) -> None:
    """Puts the figures into Keras's `logs`, in MiB; a missing one is left out."""
    if peak is not None:
        logs["mem_peak_mib"] = peak / MIB
    if current is not None:
        logs["mem_current_mib"] = current / MIB


def value_reader(sampler: Sampler, device_index: int,
                 columns: tuple[str, ...]) -> Callable[[list], Optional[Any]]:
    """A reader of one device's first present value among `columns` in a
    raw `Sampler.read()`."""
    places = sampler.places(device_index, columns)

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
