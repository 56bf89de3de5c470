"""Reads every probe once per sample, isolating their faults.

The sampler turns a block of the probes' readings into one table per device
(see `block`): its source columns plus `current_bytes` and `peak_bytes`,
the best value each sample has. Where no peak since the previous sample
can be known, `peak_bytes` is missing: the memory in use at a batch's end
is not a peak (on an asynchronous backend it jitters by the step in
flight), and judging it would raise alarms that no source backs. A probe
that raises, returns garbage or is too slow gives missing values, is
reported once per fit, and is switched off after `max_failures` failures
in a row; nothing it does escapes `sample()`.
"""

from __future__ import annotations

import dataclasses
import logging
from itertools import chain
from time import perf_counter
from collections.abc import Sequence
from typing import Callable, Optional

import numpy as np

from keras_memwatch import columns as C
from keras_memwatch.record.block import (CURRENT, MISSING, PEAK, last_present,
                                  last_present_before, rows_of, table_columns)
from keras_memwatch.record.probes.base import Probe, ProbeUnavailable

logger = logging.getLogger("keras_memwatch")

Row = dict[str, Optional[int]]

# Best source first: the framework's own count, then what NVML says this
# process holds, then the whole device.
_GPU_CURRENT = (C.ALLOCATOR_CURRENT, C.PROCESS, C.NVML_USED)
_HOST_CURRENT = (C.HOST_RSS,)
_PEAKS = (C.ALLOCATOR_PEAK, C.HOST_PEAK_RSS)
_chain = chain.from_iterable
_TOO_LARGE = 2**63  # a value an int64 cannot hold is not a byte count


class _Failure:
    """A read that raised (or took too long): the `count`-th in a row."""

    __slots__ = ("error", "count")

    def __init__(self, error: Exception, count: int):
        self.error, self.count = error, count


def _switched_off() -> None:
    """The read of a probe switched off: nothing (a missing sample)."""


@dataclasses.dataclass(eq=False, slots=True)
class DeviceSlot:
    """What the sampler keeps of one device.

    Attributes:
        name: the device, such as `"GPU:0"` or `"host"`.
        columns: the source columns its probes fill.
        layout: the columns of its tables (see `block`).
        current_columns: the source columns of its current bytes, best
            first.
        current_at: the table columns of those it has.
        peak_column: the source column of its peak, or `None`.
        peak_per_sample: whether that source resets its peak at every
            sample (else it is a high-water mark).
        peak_at: the table column of `peak_column`, or `None`.
        high_water: the last high-water mark read.
    """

    name: str
    columns: tuple[str, ...]
    layout: tuple[str, ...]
    current_columns: tuple[str, ...]
    current_at: list[int]
    peak_column: Optional[str]
    peak_per_sample: bool
    peak_at: Optional[int]
    high_water: Optional[int] = None


@dataclasses.dataclass(eq=False, slots=True)
class _ProbeSlot:
    """A started probe and what the sampler keeps of it.

    Attributes:
        probe: the probe.
        devices: per device it reports, the device's index (-1: read,
            never recorded).
        places: per device it reports, the device's index and the table
            columns of the probe's columns.
        read: its `read`, or `_switched_off`.
        interval: the least time between two reads, in seconds.
        next_read: when it may be read again (`perf_counter()`).
        failures: its failed reads in a row.
    """

    probe: Probe
    devices: list[int]
    places: list[tuple[int, list[int]]]
    read: Callable
    interval: float
    next_read: float = 0.0
    failures: int = 0


class Sampler:
    """Samples a set of probes as rows, one per device.

    Args:
        probes: the probes to read.
        max_failures: consecutive failures after which a probe is switched
            off for the rest of the fit. Defaults to `10`.
        slow_s: a read slower than this counts as a failure, its values
            as missing. Defaults to `0.5`.
    """

    def __init__(self, probes: Sequence[Probe], max_failures: int = 10,
                 slow_s: float = 0.5):
        self.probes = list(probes)
        self.max_failures = max_failures
        self.slow_s = slow_s
        #: One per device that has rows, in row order.
        self.slots: tuple[DeviceSlot, ...] = ()
        self.notes: dict[str, str] = {}
        self._active: list[_ProbeSlot] = []
        self._warned: set[str] = set()

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices that have rows, in row order."""
        return tuple(slot.name for slot in self.slots)

    @property
    def device_columns(self) -> dict[str, tuple[str, ...]]:
        """Per device: the source columns its probes fill."""
        return {slot.name: slot.columns for slot in self.slots}

    @property
    def layout(self) -> list[tuple[str, ...]]:
        """Per device: the columns of its tables."""
        return [slot.layout for slot in self.slots]

    @property
    def per_step_peak(self) -> tuple[bool, ...]:
        """Per device: whether a source resets its peak at every sample."""
        return tuple(slot.peak_per_sample for slot in self.slots)

    @property
    def peak_at(self) -> list[Optional[int]]:
        """Per device: the table column of its peak's source, or None."""
        return [slot.peak_at for slot in self.slots]

    def start(self) -> tuple[str, ...]:
        """Starts every probe; returns the devices that will have rows.

        A probe that cannot start is left out with one INFO line saying why.
        """
        self.close()
        devices: list[str] = []
        columns: dict[str, list[str]] = {}
        peak_column: dict[str, tuple[str, bool]] = {}
        self._active, self._warned = [], set()
        started = []
        for probe in self.probes:
            try:
                started.append((probe, probe.start()))
            except ProbeUnavailable as e:
                self.notes[probe.name] = f"unavailable: {e}"
                logger.info("probe %s unavailable: %s", probe.name, e)
            except Exception as e:  # a broken probe must not stop training
                self.notes[probe.name] = f"failed to start: {e!r}"
                logger.warning("probe %s failed to start: %r", probe.name, e)
        # A probe that sees every GPU of the machine (NVML) keeps only those
        # the framework uses, where a framework probe names any.
        used = {d for probe, found in started if not probe.sees_all_gpus
                for d in found if d != C.HOST_DEVICE}
        reported = []
        for probe, probe_devices in started:
            self.notes[probe.name] = probe.describe()
            indices = []
            for device in probe_devices:
                if probe.sees_all_gpus and used and device not in used:
                    indices.append(-1)  # read, never recorded
                    continue
                if device not in columns:
                    devices.append(device)
                    columns[device] = []
                columns[device].extend(probe.columns)
                indices.append(devices.index(device))
                for col in probe.columns:
                    if col in _PEAKS and device not in peak_column:
                        peak_column[device] = (col, probe.peak_per_sample)
            reported.append((probe, indices))
        self.slots = tuple(_device_slot(d, tuple(columns[d]), peak_column.get(d))
                           for d in devices)
        self._active = [
            _ProbeSlot(probe, indices,
                       [(d, [self.slots[d].layout.index(c) for c in probe.columns]
                         if d >= 0 else []) for d in indices],
                       probe.read, probe.min_interval_s)
            for probe, indices in reported]
        return self.devices

    def sample(self) -> list[Row]:
        """Reads every active probe; returns one row per device."""
        return self.rows(self.read())

    def read(self) -> list:
        """Reads every active probe, and nothing more: the hot path.

        Returns:
            One entry per active probe: its readings as `read()` gave them,
            `None` when it was not read (switched off, or its interval not
            yet over), or a `_Failure`. Turn them into rows with `rows`, in
            the order they were read.
        """
        out: list = []
        append = out.append
        slow = self.slow_s
        began = perf_counter()
        for slot in self._active:
            if slot.interval:
                if began < slot.next_read:
                    append(None)
                    continue
                slot.next_read = began + slot.interval
            try:
                readings = slot.read()
            except Exception as e:
                readings = self._failure(slot, e)
                ended = perf_counter()
            else:
                ended = perf_counter()
                if ended - began > slow:
                    readings = self._failure(slot, TimeoutError(
                        f"one read took {ended - began:.2f} s (limit {slow:g} s)"))
                elif slot.failures:
                    slot.failures = 0
            append(readings)
            began = ended
        return out

    def _failure(self, slot: _ProbeSlot, error: Exception) -> _Failure:
        """Counts a failed read of a probe; the `max_failures`-th in a row
        switches it off (it is no longer read)."""
        slot.failures += 1
        if slot.failures >= self.max_failures:
            slot.read, slot.interval = _switched_off, 0.0
        return _Failure(error, slot.failures)

    def places(self, device_index: int,
               columns: Sequence[str]) -> list[tuple[int, int, int]]:
        """Where a device's `columns` are in a raw `read()`, in `columns`
        order: `(probe, device slot, column)` indices."""
        out = []
        for column in columns:
            for p, slot in enumerate(self._active):
                if column in slot.probe.columns and device_index in slot.devices:
                    out.append((p, slot.devices.index(device_index),
                                slot.probe.columns.index(column)))
        return out

    def rows(self, raw: list) -> list[Row]:
        """One `read()` as one row per device (a dict of its columns)."""
        return rows_of(self.tables([raw]), self.layout)

    def tables(self, raws: Sequence[list]) -> list[np.ndarray]:
        """Turns `read()`s into one table per device (see `block`), checking
        every value; fills their current and peak bytes.

        Must see the reads in the order they were taken (a high-water mark
        is judged against the previous one).
        """
        n = len(raws)
        tables = [np.full((n, len(slot.layout)), MISSING, np.int64)
                  for slot in self.slots]
        for p, slot in enumerate(self._active):
            readings = [raw[p] for raw in raws]
            read = [i for i, r in enumerate(readings)
                    if r is not None and type(r) is not _Failure]
            if len(read) < n:
                for r in readings:
                    if type(r) is _Failure:
                        self._failed(slot.probe, r)
            if read:
                self._fill(slot, [readings[i] for i in read], read, tables)
        for device, table in zip(self.slots, tables):
            current = table[:, CURRENT]
            for col in device.current_at:
                np.copyto(current, table[:, col], where=current < 0)
            peak = table[:, PEAK]
            if device.peak_at is not None:
                peak[:] = _peaks(device, table[:, device.peak_at])
                np.copyto(peak, current, where=(peak < current) & (peak >= 0))
        return tables

    def _fill(self, slot: _ProbeSlot, readings: list, at: list[int],
              tables: list[np.ndarray]) -> None:
        """Puts a probe's readings (taken at samples `at`) into the tables:
        in one step where they are all well-formed, else one by one."""
        probe, places = slot.probe, slot.places
        try:  # bools are ints to numpy, not byte counts here
            fast = set(map(type, _chain(_chain(readings)))) == {int}
            values = np.array(readings if fast else [], dtype=np.int64)
            fast = fast and (values.shape[1:] == (len(places), len(probe.columns))
                             and not bool((values < 0).any()))
        except (ValueError, TypeError, OverflowError):
            fast = False
        if fast:
            rows = np.asarray(at)[:, None]
            for i, (device, columns) in enumerate(places):
                if device >= 0:
                    tables[device][rows, columns] = values[:, i]
            return
        for i, readings_i in zip(at, readings):
            count = len(readings_i) if isinstance(readings_i, (tuple, list)) else None
            if count != len(places):
                self._failed(probe, _Failure(ValueError(
                    f"returned {readings_i!r} for {len(places)} devices"), 0))
                continue
            for (device, columns), reading in zip(places, readings_i):
                if device < 0:
                    continue
                row = tables[device][i]
                for col, name, value in zip(columns, probe.columns, reading):
                    value = self._checked(probe, name, value)
                    if value is not None:
                        row[col] = value

    def _checked(self, probe: Probe, col: str, value: object) -> Optional[int]:
        if value is None:
            return None
        if type(value) is int and 0 <= value < _TOO_LARGE:
            return value
        try:
            as_int = int(value)  # type: ignore[call-overload]
            if (as_int == value and 0 <= as_int < _TOO_LARGE
                    and not isinstance(value, bool)):
                return as_int
        except (TypeError, ValueError, OverflowError):
            pass
        self._warn_once(
            probe.name + col,
            "probe %s gave an invalid %s (%r); recorded as missing",
            probe.name,
            col,
            value,
        )
        return None

    def _failed(self, probe: Probe, failure: _Failure) -> None:
        self._warn_once(
            probe.name,
            "probe %s failed (%r); its values are missing for this sample",
            probe.name,
            failure.error,
        )
        if failure.count == self.max_failures:
            self.notes[probe.name] = (
                f"switched off after {failure.count} failures in a row: "
                f"{failure.error!r}"
            )
            logger.warning(
                "probe %s failed %d times in a row; switched off for the "
                "rest of this fit",
                probe.name,
                failure.count,
            )

    def _warn_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg, *args)

    def close(self) -> None:
        """Closes every probe; errors are logged, never raised."""
        for slot in self._active:
            try:
                slot.probe.close()
            except Exception as e:
                logger.debug("probe %s failed to close: %r", slot.probe.name, e)


def _device_slot(name: str, columns: tuple[str, ...],
                 peak: Optional[tuple[str, bool]]) -> DeviceSlot:
    """A device's slot: its columns, and where its current and peak bytes
    come from (`peak`: the source column and whether it resets per sample)."""
    layout = table_columns(columns)
    current = _HOST_CURRENT if name == C.HOST_DEVICE else _GPU_CURRENT
    return DeviceSlot(
        name, columns, layout, current,
        current_at=[layout.index(c) for c in current if c in layout],
        peak_column=peak[0] if peak else None,
        peak_per_sample=bool(peak and peak[1]),
        peak_at=layout.index(peak[0]) if peak else None)


def _peaks(device: DeviceSlot, values: np.ndarray) -> np.ndarray:
    """The peak since the previous sample, where it can be known.

    A resettable peak is that by definition. A high-water mark (JAX) is
    only when it rose since the previous sample: then the new mark was
    reached in between. Otherwise the peak is unknown (missing).
    """
    if device.peak_per_sample:
        return values
    last = device.high_water
    marks = last_present_before(values, MISSING if last is None else last)
    device.high_water = last_present(values, last)
    return np.where((marks >= 0) & (values > marks), values, MISSING)
