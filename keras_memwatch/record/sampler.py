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
        self.devices: tuple[str, ...] = ()
        self.device_columns: dict[str, tuple[str, ...]] = {}
        #: Per device: the columns of its tables.
        self.layout: list[tuple[str, ...]] = []
        #: Per device: whether a source resets its peak at every sample.
        self.per_step_peak: tuple[bool, ...] = ()
        #: Per device: the source column of its peak, or None.
        self.peak_columns: tuple[Optional[str], ...] = ()
        self.notes: dict[str, str] = {}
        self._active: list[tuple[Probe, list[int]]] = []
        self._reads: list[tuple[int, Callable, float]] = []  # the hot path's
        self._failures: list[int] = []  # consecutive, per active probe
        self._next_read: list[float] = []
        self._warned: set[str] = set()
        self._peak_column: list[Optional[tuple[str, bool]]] = []
        self._high_water: list[Optional[int]] = []
        self._places: list[list[tuple[int, list[int]]]] = []
        self._current_at: list[list[int]] = []
        #: Per device: the table column of its peak's source, or None.
        self.peak_at: list[Optional[int]] = []
        #: Per device: the columns its current bytes come from, best first.
        self.current_columns: list[tuple[str, ...]] = []

    def start(self) -> tuple[str, ...]:
        """Starts every probe; returns the devices that will have rows.

        A probe that cannot start is left out with one INFO line saying why.
        """
        self.close()
        devices: list[str] = []
        columns: dict[str, list[str]] = {}
        peak_column: dict[str, tuple[str, bool]] = {}
        self._active, self._failures, self._warned = [], [], set()
        self._next_read, self._reads = [], []
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
        for probe, probe_devices in started:
            self.notes[probe.name] = probe.describe()
            slots = []
            for device in probe_devices:
                if probe.sees_all_gpus and used and device not in used:
                    slots.append(-1)  # read, never recorded
                    continue
                if device not in columns:
                    devices.append(device)
                    columns[device] = []
                columns[device].extend(probe.columns)
                slots.append(devices.index(device))
                for col in probe.columns:
                    if col in _PEAKS and device not in peak_column:
                        peak_column[device] = (col, probe.peak_per_sample)
            self._reads.append((len(self._active), probe.read, probe.min_interval_s))
            self._active.append((probe, slots))
            self._failures.append(0)
            self._next_read.append(0.0)
        self.devices = tuple(devices)
        self.device_columns = {d: tuple(columns[d]) for d in devices}
        self.layout = layout = [table_columns(self.device_columns[d]) for d in devices]
        # Per probe and device slot: the device's index (-1: not recorded)
        # and the table columns of the probe's columns.
        self._places = [
            [(d, [layout[d].index(c) for c in probe.columns] if d >= 0 else [])
             for d in slots]
            for probe, slots in self._active]
        self._peak_column = [peak_column.get(d) for d in devices]
        self.per_step_peak = tuple(bool(p and p[1]) for p in self._peak_column)
        self.peak_columns = tuple(p[0] if p else None for p in self._peak_column)
        self._high_water = [None] * len(devices)
        self.current_columns = [
            _HOST_CURRENT if d == C.HOST_DEVICE else _GPU_CURRENT
            for d in devices
        ]
        self._current_at = [[layout[i].index(c) for c in cols if c in layout[i]]
                            for i, cols in enumerate(self.current_columns)]
        self.peak_at = [None if p is None else layout[i].index(p[0])
                         for i, p in enumerate(self._peak_column)]
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
        failures, slow = self._failures, self.slow_s
        began = perf_counter()
        for i, read, interval in self._reads:
            if interval:
                if began < self._next_read[i]:
                    append(None)
                    continue
                self._next_read[i] = began + interval
            try:
                readings = read()
            except Exception as e:
                readings = self._failure(i, e)
                ended = perf_counter()
            else:
                ended = perf_counter()
                if ended - began > slow:
                    readings = self._failure(i, TimeoutError(
                        f"one read took {ended - began:.2f} s (limit {slow:g} s)"))
                elif failures[i]:
                    failures[i] = 0
            append(readings)
            began = ended
        return out

    def _failure(self, i: int, error: Exception) -> _Failure:
        """Counts a failed read of probe `i`; the `max_failures`-th in a row
        switches it off (it is no longer read)."""
        self._failures[i] += 1
        if self._failures[i] >= self.max_failures:
            self._reads[i] = (i, _switched_off, 0.0)
        return _Failure(error, self._failures[i])

    def places(self, device_index: int,
               columns: Sequence[str]) -> list[tuple[int, int, int]]:
        """Where a device's `columns` are in a raw `read()`, in `columns`
        order: `(probe, device slot, column)` indices."""
        out = []
        for column in columns:
            for p, (probe, slots) in enumerate(self._active):
                if column in probe.columns and device_index in slots:
                    out.append((p, slots.index(device_index),
                                probe.columns.index(column)))
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
        tables = [np.full((n, len(names)), MISSING, np.int64) for names in self.layout]
        for p, (probe, slots) in enumerate(self._active):
            readings = [raw[p] for raw in raws]
            read = [i for i, r in enumerate(readings)
                    if r is not None and type(r) is not _Failure]
            if len(read) < n:
                for r in readings:
                    if type(r) is _Failure:
                        self._failed(probe, r)
            if read:
                self._fill(p, [readings[i] for i in read], read, tables)
        for i, table in enumerate(tables):
            current = table[:, CURRENT]
            for col in self._current_at[i]:
                np.copyto(current, table[:, col], where=current < 0)
            peak = table[:, PEAK]
            if self._peak_column[i] is not None:
                peak[:] = self._peaks(i, table[:, self.peak_at[i]])
                np.copyto(peak, current, where=(peak < current) & (peak >= 0))
        return tables

    def _fill(self, p: int, readings: list, at: list[int],
              tables: list[np.ndarray]) -> None:
        """Puts probe `p`'s readings (taken at samples `at`) into the tables:
        in one step where they are all well-formed, else one by one."""
        probe, places = self._active[p][0], self._places[p]
        try:  # bools are ints to numpy, not byte counts here
            fast = set(map(type, _chain(_chain(readings)))) == {int}
            values = np.array(readings, dtype=np.int64) if fast else None
            fast = fast and (values.shape[1:] == (len(places), len(probe.columns))
                             and not (values < 0).any())
        except (ValueError, TypeError, OverflowError):
            fast = False
        if fast:
            rows = np.asarray(at)[:, None]
            for slot, (device, columns) in enumerate(places):
                if device >= 0:
                    tables[device][rows, columns] = values[:, slot]
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

    def _peaks(self, i: int, values: np.ndarray) -> np.ndarray:
        """The peak since the previous sample, where it can be known.

        A resettable peak is that by definition. A high-water mark (JAX) is
        only when it rose since the previous sample: then the new mark was
        reached in between. Otherwise the peak is unknown (missing).
        """
        if self._peak_column[i][1]:
            return values
        last = self._high_water[i]
        marks = last_present_before(values, MISSING if last is None else last)
        self._high_water[i] = last_present(values, last)
        return np.where((marks >= 0) & (values > marks), values, MISSING)

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
        for probe, _ in self._active:
            try:
                probe.close()
            except Exception as e:
                logger.debug("probe %s failed to close: %r", probe.name, e)
