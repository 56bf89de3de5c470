"""Judges each sampled batch per device, a block at a time, and turns
verdicts into alerts.

What is judged is a step's *working memory*: its peak minus the memory in
use just before it (`derived.in_use_before`). Each phase (`train`, `test`,
`predict`) is judged against its own baseline, so that an evaluation or
prediction step is never measured against a training step's memory. A
ratio on the raw peak hides real spikes whenever weights, optimizer state
and the framework's own footprint dwarf a step's working memory (an
example in `docs/internals.md`, "What is judged").
`baseline_bytes` is reported in the same terms as `peak_bytes`: the memory
in use before the step plus the usual working memory.

Only a real peak is judged: a device whose sources have no peak for a step
(`peak_bytes` missing) is not judged at that step. On JAX, where no source
sees a step's peak, XLA's plan of the step stands in: on the devices the
step runs on, `plan_bytes` is the plan, and where the device has no
per-step peak of its own, `peak_bytes` is the memory in use between steps
(`derived.SettledInUse`: never a step in flight) plus the plan's working
part, so the working memory judged is the plan's.
Where a device has neither, a rise of its high-water mark is judged against
the previous mark above the memory in use: the most any earlier step can
have needed (not during warm-up, nor without an earlier mark).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Optional

import numpy as np

from keras_memwatch import columns as C
from keras_memwatch.record.block import (BASELINE, CURRENT, MISSING, PEAK, PHASE_CODES,
                                  PLAN, Block, before_each, last_present,
                                  last_present_before, optional)
from keras_memwatch.judge.derived import SettledInUse, working_memory
from keras_memwatch.judge.detector import SpikeDetector, SpikeSettings
from keras_memwatch.judge.drift import DriftMonitor
from keras_memwatch.judge.events import DriftEvent, RiseEvent, SpikeEvent
from keras_memwatch.units import MIB, format_bytes

logger = logging.getLogger("keras_memwatch")

# What becomes of a sample: it ends a burst, leaves it be, or is a spike.
_ENDS, _NEUTRAL, _SPIKE = 0, 1, 2

_TRAIN = PHASE_CODES["train"]


@dataclasses.dataclass(eq=False, slots=True)
class DeviceJudge:
    """What the monitor keeps of one device.

    Attributes:
        name: the device, such as `"GPU:0"`.
        planned: a training step runs on it: its tables carry the plan.
        peak_from_plan: planned, without a per-step peak of its own: its
            peak is the memory in use before the step plus the plan's
            working part.
        by_mark: neither a per-step peak nor a plan: only a rise of its
            high-water mark is judged, against the previous mark.
        peak_at: the table column of its peak's source, or `None`.
        detectors: one `SpikeDetector` per phase.
        drift: the drift monitor of its training steps.
        settled: the memory in use between steps, where the peak comes
            from the plan, else `None`.
        judged: samples judged so far, per phase.
        mark: the last high-water mark seen.
        before: the memory in use at the last sample.
        compiling: samples not judged because XLA compiled meanwhile.
        burst: the spikes of the burst going on.
    """

    name: str
    planned: bool
    peak_from_plan: bool
    by_mark: bool
    peak_at: Optional[int]
    detectors: list[SpikeDetector]
    drift: DriftMonitor
    settled: Optional[SettledInUse]
    judged: list[int]
    mark: Optional[int] = None
    before: Optional[int] = None
    compiling: int = 0
    burst: list[SpikeEvent] = dataclasses.field(default_factory=list)


class SpikeMonitor:
    """One spike detector per device and phase, one drift monitor per
    device (of the training steps).

    Args:
        devices: the devices of each sample, in row order.
        settings: the checked options of each `SpikeDetector`.
        alert: log spikes and drift at WARNING.
        planned: the devices a training step runs on, whose tables carry
            its plan (`judge(plans=...)`). Defaults to `()`.
        per_step_peak: per device, whether its sources have a peak per
            step; a planned device without one takes its peak from the plan.
            Defaults to `None` (all have).
        peak_at: per device, the column of its tables that holds the
            source of its peak (a high-water mark where there is no
            per-step peak), or None. Defaults to `None`.
        where: put before every alert, e.g. `"process 1 on host-a: "`.
            Defaults to `""`.
        call: which call of the watch's record the samples are (for the
            events). Defaults to `0`.
    """

    def __init__(
        self,
        devices: Sequence[str],
        settings: SpikeSettings,
        alert: bool,
        planned: Sequence[str] = (),
        per_step_peak: Optional[Sequence[bool]] = None,
        peak_at: Optional[Sequence[Optional[int]]] = None,
        where: str = "",
        call: int = 0,
    ):
        self.devices = tuple(devices)
        self.settings = settings
        self.alert = alert
        self.where = where
        self.call = call
        per_step = per_step_peak or [True] * len(self.devices)
        columns = peak_at or [None] * len(self.devices)
        self._judges = [self._judge_of(d, d in planned, p, c, settings)
                        for d, p, c in zip(self.devices, per_step, columns)]
        self.events: list[SpikeEvent] = []
        self.drift_events: list[tuple[str, int, DriftEvent]] = []
        self.rise_events: list[tuple[str, int, RiseEvent]] = []

    @staticmethod
    def _judge_of(device: str, planned: bool, per_step_peak: bool,
                  peak_at: Optional[int], settings: SpikeSettings) -> DeviceJudge:
        from_plan = planned and not per_step_peak
        return DeviceJudge(
            device, planned, from_plan,
            # Without a per-step peak or a plan, only a rise of the
            # high-water mark is seen: judged against the previous mark.
            by_mark=not per_step_peak and not planned and peak_at is not None,
            peak_at=peak_at,
            detectors=[SpikeDetector.from_settings(settings) for _ in C.PHASES],
            # Drift is judged on the memory held between steps, smoothed so
            # that an allocator's sawtooth is not mistaken for growth.
            drift=DriftMonitor(settings.min_delta_mb, smooth=settings.window),
            settled=SettledInUse() if from_plan else None,
            judged=[0] * len(C.PHASES))

    @property
    def compiling(self) -> list[int]:
        """Per device: samples not judged because XLA compiled meanwhile."""
        return [judge.compiling for judge in self._judges]

    def judge(
        self,
        block: Block,
        judged: np.ndarray,
        plans: Optional[tuple[np.ndarray, np.ndarray]] = None,
        compiled: Optional[np.ndarray] = None,
    ) -> list[SpikeEvent]:
        """Fills each table's baseline (and plan, and a planned peak) and
        each device's `spikes` in `block`; returns new spikes.

        Args:
            block: consecutive samples, their tables from the sampler.
            judged: per sample, False for the sample at the start of a
                call, whose values only become the reference for the next
                step.
            plans: per sample, XLA's plan of the step (`total_bytes`,
                `working_bytes`; `MISSING` where none), on JAX. Defaults to
                `None`.
            compiled: per sample, whether XLA compiled a new input shape
                since the previous sample (JAX). The host memory that takes
                is not a step's working memory: devices the step does not
                run on are then recorded, not judged. Defaults to `None`.
        """
        new: list[SpikeEvent] = []
        for i, judge in enumerate(self._judges):
            may_skip = compiled is not None and not judge.planned
            if (may_skip and judge.detectors[_TRAIN].warming_up
                    and (compiled & judged).any()):
                # Whether warm-up is over decides a compiled sample's fate:
                # one sample at a time, so that each sees it as it stands.
                for k in range(len(block)):
                    new += self._judge_device(i, block, judged, plans, compiled,
                                              slice(k, k + 1))
            else:
                new += self._judge_device(i, block, judged, plans, compiled,
                                          slice(None))
        new.sort(key=lambda event: event.step)  # devices in order within a step
        self.events.extend(new)
        return new

    def _judge_device(self, i: int, block: Block, judged: np.ndarray,
                      plans: Optional[tuple[np.ndarray, np.ndarray]],
                      compiled: Optional[np.ndarray], at: slice) -> list[SpikeEvent]:
        device = self._judges[i]
        table, spikes, judged = block.tables[i][at], block.spikes[i][at], judged[at]
        current = table[:, CURRENT]
        phase = block.phase[at]
        if device.settled is not None:
            before = device.settled.push_many(current)
        else:
            last = device.before
            before = before_each(current, MISSING if last is None else last)
        device.before = optional(current[-1])
        table[:, BASELINE] = MISSING
        spikes[:] = False
        planned = np.zeros(len(table), bool)
        if plans is not None and device.planned:
            total, working_plan = plans[0][at], plans[1][at]
            planned = total >= 0
            table[planned, PLAN] = total[planned]
            if device.peak_from_plan:
                from_plan = planned & (before >= 0)
                table[from_plan, PEAK] = before[from_plan] + working_plan[from_plan]
        marks = np.full(len(table), MISSING, np.int64)
        if device.peak_at is not None:
            mark = device.mark
            sources = table[:, device.peak_at]
            marks = last_present_before(sources, MISSING if mark is None else mark)
            device.mark = last_present(sources, mark)
        train = phase == _TRAIN
        device.drift.update_many(current[judged & train & (current >= 0)])

        fate = np.full(len(table), _ENDS, np.int8)
        skipped = np.zeros(len(table), bool)
        if (compiled is not None and not device.planned
                and not device.detectors[_TRAIN].warming_up):
            skipped = judged & compiled[at]
            device.compiling += int(skipped.sum())
        counted = judged & (before >= 0) & ~skipped
        count = np.zeros(len(table), np.int64)  # judged so far in its phase
        for p in np.unique(phase[counted]).tolist():
            mine = phase == p
            so_far = device.judged[p] + np.cumsum(counted & mine)
            count[mine] = so_far[mine]
            device.judged[p] = int(so_far[-1])
        peak = table[:, PEAK]
        working = working_memory(peak, before)
        reach = counted & (peak >= 0)
        usual = np.full(len(table), MISSING, np.int64)
        # Without a per-step peak or a plan, judged against the marks.
        by_mark = reach & (device.by_mark | (device.peak_from_plan & ~planned))
        if by_mark.any():
            settings = self.settings
            known = by_mark & (marks >= 0) & (count > settings.warmup)
            usual[known] = np.maximum(marks[known] - before[known], 0)
            spikes[known] = ((working[known] > usual[known] * settings.threshold)
                             & (working[known] > usual[known]
                                + settings.min_delta_mb * MIB))
            fate[by_mark & ~known] = _NEUTRAL
        fed = reach & ~by_mark
        for p in np.unique(phase[fed]).tolist():
            where = np.flatnonzero(fed & (phase == p))
            found, baselines = device.detectors[p].update_many(working[where])
            known = ~np.isnan(baselines)
            usual[where[known]] = baselines[known].astype(np.int64)
            spikes[where[known]] = found[known]
            fate[where[~known]] = _NEUTRAL
        has_usual = usual >= 0
        table[has_usual, BASELINE] = before[has_usual] + usual[has_usual]
        fate[spikes] = _SPIKE
        if not spikes.any() and not device.burst:
            return []
        return self._bursts(device, block, table, at, fate, usual, working)

    def _bursts(self, device: DeviceJudge, block: Block, table: np.ndarray,
                at: slice, fate: np.ndarray, usual: np.ndarray,
                working: np.ndarray) -> list[SpikeEvent]:
        """Turns the spikes into events, and alerts once a burst."""
        new = []
        for k in np.flatnonzero(fate != _NEUTRAL).tolist():
            if fate[k] != _SPIKE:
                self._end_burst(device)
                continue
            j = k + (at.start or 0)
            event = SpikeEvent(
                int(block.step[j]), int(block.epoch[j]), optional(block.batch[j]),
                device.name, int(table[k, PEAK]), int(table[k, BASELINE]),
                int(working[k]), int(usual[k]), C.PHASES[block.phase[j]], self.call)
            new.append(event)
            if self.alert and not device.burst:
                logger.warning("%s%s", self.where, event.message)
            device.burst.append(event)
        return new

    def _end_burst(self, device: DeviceJudge) -> None:
        burst = device.burst
        if self.alert and len(burst) > 1:
            worst = max(burst, key=lambda e: e.peak_bytes)
            logger.warning(
                "%smemory spike burst on %s: %d consecutive spiking samples, "
                "steps %d-%d, worst peak %s at epoch %d batch %s", self.where,
                device.name, len(burst), burst[0].step, burst[-1].step,
                format_bytes(worst.peak_bytes), worst.epoch, worst.batch,
            )
        burst.clear()

    def name_layer(self, event: SpikeEvent, layer: str) -> SpikeEvent:
        """Keeps `event` with the layer behind it (named on the training
        thread, after judging); returns the named event."""
        named = dataclasses.replace(event, layer=layer)
        for i in range(len(self.events) - 1, -1, -1):
            if self.events[i] is event:
                self.events[i] = named
                break
        return named

    def end_epoch(self, epoch: int) -> None:
        """Closes bursts and checks each device for drift (and one-off rises)
        over the epoch."""
        for device in self._judges:
            self._end_burst(device)
            drift = device.drift
            seen = len(drift.rises)
            event = drift.end_epoch()
            self.rise_events.extend((device.name, epoch, r)
                                    for r in drift.rises[seen:])
            if event is not None:
                self.drift_events.append((device.name, epoch, event))
                if self.alert:
                    logger.warning(
                        "%smemory drift on %s in epoch %d: %s (a leak?)",
                        self.where, device.name, epoch, event.message,
                    )
