"""Judges each sampled batch per device, a block at a time, and turns
verdicts into alerts.

What is judged is a step's *working memory*: its peak minus the memory in
use just before it (`derived.in_use_before`). Each phase (`train`, `test`,
`predict`) is judged against its own baseline, so that an evaluation or
prediction step is never measured against a training step's memory. A
ratio on the raw peak hides real spikes whenever weights, optimizer state
and the framework's own footprint dwarf a step's working memory (an 820
MiB TensorFlow process whose oversized batch peaks at 1,195 MiB is only
1.46x its usual peak, while that step's working memory grew about 6x).
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

import logging
from collections.abc import Sequence
from typing import Optional

import numpy as np

from keras_memwatch import columns as C
from keras_memwatch.record.block import (BASELINE, CURRENT, MISSING, PEAK, PHASE_CODES,
                                  PLAN, Block, before_each, last_present,
                                  last_present_before, optional)
from keras_memwatch.judge.derived import SettledInUse, working_memory
from keras_memwatch.judge.detector import DriftMonitor, SpikeDetector
from keras_memwatch.judge.events import DriftEvent, RiseEvent, SpikeEvent
from keras_memwatch.units import MIB, format_bytes

logger = logging.getLogger("keras_memwatch")

# What becomes of a sample: it ends a burst, leaves it be, or is a spike.
_ENDS, _NEUTRAL, _SPIKE = 0, 1, 2

_TRAIN = PHASE_CODES["train"]


class SpikeMonitor:
    """One spike detector per device and phase, one drift monitor per
    device (of the training steps).

    Args:
        devices: the devices of each sample, in row order.
        window, threshold, min_delta_mb, warmup: passed to each
            `SpikeDetector`.
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
        window: int,
        threshold: float,
        min_delta_mb: float,
        warmup: int,
        alert: bool,
        planned: Sequence[str] = (),
        per_step_peak: Optional[Sequence[bool]] = None,
        peak_at: Optional[Sequence[Optional[int]]] = None,
        where: str = "",
        call: int = 0,
    ):
        self.devices = tuple(devices)
        self.alert = alert
        self.where = where
        self.call = call
        per_step = per_step_peak or [True] * len(self.devices)
        self._planned = [d in planned for d in self.devices]
        self._peak_from_plan = [d in planned and not p
                                for d, p in zip(self.devices, per_step)]
        # Without a per-step peak or a plan, only a rise of the high-water
        # mark is seen: judged against the previous mark.
        self._peak_at = list(peak_at or [None] * len(self.devices))
        self._by_mark = [not p and d not in planned and c is not None
                         for d, p, c in zip(self.devices, per_step, self._peak_at)]
        self._marks: list[Optional[int]] = [None] * len(self.devices)
        #: Per device: samples not judged because XLA compiled meanwhile.
        self.compiling = [0] * len(self.devices)
        # Per device, samples judged so far in each phase.
        self._judged = [[0] * len(C.PHASES) for _ in self.devices]
        self._detectors = [
            [SpikeDetector(window, threshold, min_delta_mb, warmup)
             for _ in self.devices]
            for _ in C.PHASES
        ]
        self._settled = [SettledInUse() if p else None for p in self._peak_from_plan]
        # Drift is judged on the memory held between steps, smoothed so that
        # an allocator's sawtooth is not mistaken for growth.
        self._drift = [DriftMonitor(min_delta_mb, smooth=window)
                       for _ in self.devices]
        self._before: list[Optional[int]] = [None] * len(self.devices)
        self._burst: list[list[SpikeEvent]] = [[] for _ in self.devices]
        self.events: list[SpikeEvent] = []
        self.drift_events: list[tuple[str, int, DriftEvent]] = []
        self.rise_events: list[tuple[str, int, RiseEvent]] = []

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
        for i, table in enumerate(block.tables):
            may_skip = compiled is not None and not self._planned[i]
            if (may_skip and self._detectors[_TRAIN][i].warming_up
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
        table, spikes, judged = block.tables[i][at], block.spikes[i][at], judged[at]
        current = table[:, CURRENT]
        phase = block.phase[at]
        if self._settled[i] is not None:
            before = self._settled[i].push_many(current)
        else:
            last = self._before[i]
            before = before_each(current, MISSING if last is None else last)
        self._before[i] = optional(current[-1])
        table[:, BASELINE] = MISSING
        spikes[:] = False
        planned = np.zeros(len(table), bool)
        if plans is not None and self._planned[i]:
            total, working_plan = plans[0][at], plans[1][at]
            planned = total >= 0
            table[planned, PLAN] = total[planned]
            if self._peak_from_plan[i]:
                from_plan = planned & (before >= 0)
                table[from_plan, PEAK] = before[from_plan] + working_plan[from_plan]
        marks = np.full(len(table), MISSING, np.int64)
        if self._peak_at[i] is not None:
            mark = self._marks[i]
            sources = table[:, self._peak_at[i]]
            marks = last_present_before(sources, MISSING if mark is None else mark)
            self._marks[i] = last_present(sources, mark)
        train = phase == _TRAIN
        self._drift[i].update_many(current[judged & train & (current >= 0)])

        fate = np.full(len(table), _ENDS, np.int8)
        skipped = np.zeros(len(table), bool)
        if (compiled is not None and not self._planned[i]
                and not self._detectors[_TRAIN][i].warming_up):
            skipped = judged & compiled[at]
            self.compiling[i] += int(skipped.sum())
        counted = judged & (before >= 0) & ~skipped
        count = np.zeros(len(table), np.int64)  # judged so far in its phase
        for p in np.unique(phase[counted]).tolist():
            mine = phase == p
            so_far = self._judged[i][p] + np.cumsum(counted & mine)
            count[mine] = so_far[mine]
            self._judged[i][p] = int(so_far[-1])
        peak = table[:, PEAK]
        working = working_memory(peak, before)
        reach = counted & (peak >= 0)
        usual = np.full(len(table), MISSING, np.int64)
        # Without a per-step peak or a plan, judged against the marks.
        by_mark = reach & (self._by_mark[i] | (self._peak_from_plan[i] & ~planned))
        if by_mark.any():
            detector = self._detectors[_TRAIN][i]  # its options: all share them
            known = by_mark & (marks >= 0) & (count > detector.warmup)
            usual[known] = np.maximum(marks[known] - before[known], 0)
            spikes[known] = ((working[known] > usual[known] * detector.threshold)
                             & (working[known] > usual[known]
                                + detector.min_delta_mb * MIB))
            fate[by_mark & ~known] = _NEUTRAL
        fed = reach & ~by_mark
        for p in np.unique(phase[fed]).tolist():
            where = np.flatnonzero(fed & (phase == p))
            found, baselines = self._detectors[p][i].update_many(working[where])
            known = ~np.isnan(baselines)
            usual[where[known]] = baselines[known].astype(np.int64)
            spikes[where[known]] = found[known]
            fate[where[~known]] = _NEUTRAL
        has_usual = usual >= 0
        table[has_usual, BASELINE] = before[has_usual] + usual[has_usual]
        fate[spikes] = _SPIKE
        if not spikes.any() and not self._burst[i]:
            return []
        return self._bursts(i, block, at, fate, usual, working)

    def _bursts(self, i: int, block: Block, at: slice, fate: np.ndarray,
                usual: np.ndarray, working: np.ndarray) -> list[SpikeEvent]:
        """Turns the spikes into events, and alerts once a burst."""
        new = []
        table = block.tables[i][at]
        for k in np.flatnonzero(fate != _NEUTRAL).tolist():
            if fate[k] != _SPIKE:
                self._end_burst(i)
                continue
            j = k + (at.start or 0)
            event = SpikeEvent(
                int(block.step[j]), int(block.epoch[j]), optional(block.batch[j]),
                self.devices[i], int(table[k, PEAK]), int(table[k, BASELINE]),
                int(working[k]), int(usual[k]), C.PHASES[block.phase[j]], self.call)
            new.append(event)
            if self.alert and not self._burst[i]:
                logger.warning("%s%s", self.where, event.message)
            self._burst[i].append(event)
        return new

    def _end_burst(self, i: int) -> None:
        burst = self._burst[i]
        if self.alert and len(burst) > 1:
            worst = max(burst, key=lambda e: e.peak_bytes)
            logger.warning(
                "%smemory spike burst on %s: %d consecutive spiking samples, "
                "steps %d-%d, worst peak %s at epoch %d batch %s", self.where,
                self.devices[i], len(burst), burst[0].step, burst[-1].step,
                format_bytes(worst.peak_bytes), worst.epoch, worst.batch,
            )
        burst.clear()

    def end_epoch(self, epoch: int) -> None:
        """Closes bursts and checks each device for drift (and one-off rises)
        over the epoch."""
        for i, device in enumerate(self.devices):
            self._end_burst(i)
            drift = self._drift[i]
            seen = len(drift.rises)
            event = drift.end_epoch()
            self.rise_events.extend((device, epoch, r) for r in drift.rises[seen:])
            if event is not None:
                self.drift_events.append((device, epoch, event))
                if self.alert:
                    logger.warning(
                        "%smemory drift on %s in epoch %d: %s (a leak?)",
                        self.where, device, epoch, event.message,
                    )
