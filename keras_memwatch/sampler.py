"""Reads every probe once per sample, isolating their faults.

The sampler turns the probes' readings into one row per device: a dict of
source columns plus `current_bytes` and `peak_bytes`, the best value each
sample has. Where no peak since the previous sample can be known,
`peak_bytes` is missing: the memory in use at a batch's end is not a peak (on
an asynchronous backend it jitters by the step in flight), and judging it
would raise alarms that no source backs. A probe that raises, returns
garbage or is too slow gives missing values, is reported once per fit, and
is switched off after `max_failures` failures in a row; nothing it does
escapes `sample()`.
"""

from __future__ import annotations

import logging
from time import perf_counter
from collections.abc import Sequence
from typing import Callable, Optional

from keras_memwatch import columns as C
from keras_memwatch.probes.base import Probe, ProbeUnavailable

logger = logging.getLogger("keras_memwatch")

Row = dict[str, Optional[int]]

# Best source first: the framework's own count, then what NVML says this
# process holds, then the whole device.
_GPU_CURRENT = (C.ALLOCATOR_CURRENT, C.PROCESS, C.NVML_USED)
_HOST_CURRENT = (C.HOST_RSS,)
_PEAKS = (C.ALLOCATOR_PEAK, C.HOST_PEAK_RSS)


class _Failure:
    """A read that raised (or took too long): the `count`-th in a row."""

    __slots__ = ("error", "count")

    def __init__(self, error: Exception, count: int):
        self.error, self.count = error, count


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
        self._peak_column = [peak_column.get(d) for d in devices]
        self.per_step_peak = tuple(bool(p and p[1]) for p in self._peak_column)
        self.peak_columns = tuple(p[0] if p else None for p in self._peak_column)
        self._high_water = [None] * len(devices)
        self.current_columns = [
            _HOST_CURRENT if d == C.HOST_DEVICE else _GPU_CURRENT
            for d in devices
        ]
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
        failures, limit, slow = self._failures, self.max_failures, self.slow_s
        began = perf_counter()
        for i, read, interval in self._reads:
            if failures[i] >= limit:
                append(None)
                continue
            if interval:
                if began < self._next_read[i]:
                    append(None)
                    continue
                self._next_read[i] = began + interval
            try:
                readings = read()
                ended = perf_counter()
                if ended - began > slow:
                    raise TimeoutError(
                        f"one read took {ended - began:.2f} s (limit {slow:g} s)")
            except Exception as e:
                failures[i] += 1
                append(_Failure(e, failures[i]))
                ended = perf_counter()
            else:
                if failures[i]:
                    failures[i] = 0
                append(readings)
            began = ended
        return out

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
        """Turns one `read()` into one row per device, checking every value.

        Must see the reads in the order they were taken (a high-water mark
        is judged against the previous one).
        """
        rows: list[Row] = [{} for _ in self.devices]
        for (probe, slots), readings in zip(self._active, raw):
            if readings is None:
                continue
            if type(readings) is _Failure:
                self._failed(probe, readings)
                continue
            if len(readings) != len(slots):
                self._failed(probe, _Failure(ValueError(
                    f"returned {len(readings)} readings for {len(slots)} devices"),
                    0))
                continue
            for slot, reading in zip(slots, readings):
                if slot < 0:
                    continue
                row = rows[slot]
                for col, value in zip(probe.columns, reading):
                    row[col] = (value if type(value) is int and value >= 0
                                else self._checked(probe, col, value))
        for i, row in enumerate(rows):
            current = None
            for col in self.current_columns[i]:
                current = row.get(col)
                if current is not None:
                    break
            peak = self._peak(i, row)
            if peak is not None and current is not None and peak < current:
                peak = current
            row["current_bytes"] = current
            row["peak_bytes"] = peak
        return rows

    def _peak(self, i: int, row: Row) -> Optional[int]:
        """The peak since the previous sample, where it can be known.

        A resettable peak is that by definition. A high-water mark (JAX) is
        only when it rose since the previous sample: then the new mark was
        reached in between. Otherwise the peak is unknown (None).
        """
        if self._peak_column[i] is None:
            return None
        col, per_sample = self._peak_column[i]
        peak = row.get(col)
        if per_sample or peak is None:
            return peak
        last, self._high_water[i] = self._high_water[i], peak
        return peak if last is not None and peak > last else None

    def _checked(self, probe: Probe, col: str, value: object) -> Optional[int]:
        if value is None:
            return None
        if type(value) is int and value >= 0:
            return value
        try:
            as_int = int(value)  # type: ignore[call-overload]
            if as_int == value and as_int >= 0 and not isinstance(value, bool):
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
