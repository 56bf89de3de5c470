"""Judges each training sample per device, and turns verdicts into alerts.

What is judged is a step's *working memory*: its peak minus the memory in
use just before it (the previous sample's current bytes). A ratio on the
raw peak hides real spikes whenever weights, optimizer state and the
framework's own footprint dwarf a step's working memory (an 820 MiB
TensorFlow process whose oversized batch peaks at 1,195 MiB is only 1.46x
its usual peak, while that step's working memory grew about 6x).
`baseline_bytes` is reported in the same terms as `peak_bytes`: the memory
in use before the step plus the usual working memory.

Only a real peak is judged: a device whose sources have no peak for a step
(`peak_bytes` missing) is not judged at that step. On JAX, where no source
sees a step's peak, XLA's plan of the step stands in: on the devices the
step runs on, `plan_bytes` is the plan, and where the device has no
per-step peak of its own, `peak_bytes` is the memory in use before the step
plus the plan's working part, so the working memory judged is the plan's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Optional

from keras_memwatch import columns as C
from keras_memwatch.derived import working_memory
from keras_memwatch.detector import DriftMonitor, SpikeDetector
from keras_memwatch.events import DriftEvent, RiseEvent, SpikeEvent
from keras_memwatch.step_plan import StepPlan
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")


class SpikeMonitor:
    """One spike detector and one drift monitor per device.

    Args:
        devices: the devices of each sample, in row order.
        window, threshold, min_delta_mb, warmup: passed to each
            `SpikeDetector`.
        alert: log spikes and drift at WARNING.
        planned: the devices a training step runs on, whose rows carry its
            plan (`judge(plan=...)`). Defaults to `()`.
        per_step_peak: per device, whether its sources have a peak per
            step; a planned device without one takes its peak from the plan.
            Defaults to `None` (all have).
        peak_columns: per device, the source column of its peak (a
            high-water mark where there is no per-step peak). Defaults to
            `None`.
        where: put before every alert, e.g. `"process 1 on host-a: "`.
            Defaults to `""`.
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
        peak_columns: Optional[Sequence[Optional[str]]] = None,
        where: str = "",
    ):
        self.devices = tuple(devices)
        self.alert = alert
        self.where = where
        per_step = per_step_peak or [True] * len(self.devices)
        self._planned = [d in planned for d in self.devices]
        self._peak_from_plan = [d in planned and not p
                                for d, p in zip(self.devices, per_step)]
        # Without a per-step peak or a plan, only a rise of the high-water
        # mark is seen: judged against the previous mark.
        self._peak_columns = list(peak_columns or [None] * len(self.devices))
        self._by_mark = [not p and d not in planned and c is not None
                         for d, p, c in zip(self.devices, per_step,
                                            self._peak_columns)]
        self._marks: list[Optional[int]] = [None] * len(self.devices)
        #: Per device: samples not judged because XLA compiled meanwhile.
        self.compiling = [0] * len(self.devices)
        self._judged = [0] * len(self.devices)
        self._detectors = [
            SpikeDetector(window, threshold, min_delta_mb, warmup)
            for _ in self.devices
        ]
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
        step: int,
        epoch: int,
        batch: Optional[int],
        judged: bool,
        rows: Sequence[dict],
        plan: Optional[StepPlan] = None,
        compiled: bool = False,
    ) -> list[SpikeEvent]:
        """Fills `baseline_bytes` and `spike` of each row (and `plan_bytes`,
        and a planned peak); returns new spikes.

        Args:
            judged: False for the train-begin row and non-training phases,
                whose values only become the reference for the next step.
            plan: XLA's plan of the step, on JAX. Defaults to `None`.
            compiled: XLA compiled a new input shape since the previous
                sample (JAX). The host memory that takes is not a step's
                working memory: devices the step does not run on are then
                recorded, not judged. Defaults to `False`.
        """
        new = []
        for i, row in enumerate(rows):
            before, current = self._before[i], row["current_bytes"]
            self._before[i] = current
            row["baseline_bytes"], row["spike"] = None, False
            planned = plan is not None and self._planned[i]
            if planned:
                row[C.PLAN] = plan.total_bytes
                if self._peak_from_plan[i] and before is not None:
                    row["peak_bytes"] = before + plan.working_bytes
            mark = self._marks[i]
            if self._peak_columns[i] is not None:
                if row.get(self._peak_columns[i]) is not None:  # a read kept it
                    self._marks[i] = row[self._peak_columns[i]]
            if judged and current is not None:
                self._drift[i].update(current)
            peak = row["peak_bytes"]
            if (judged and compiled and not self._planned[i]
                    and not self._detectors[i].warming_up):
                self.compiling[i] += 1
                self._end_burst(i)
                continue
            if not judged or before is None:
                self._end_burst(i)
                continue
            self._judged[i] += 1
            if peak is None:
                self._end_burst(i)
                continue
            working = working_memory(peak, before)
            if self._peak_from_plan[i] and not planned or self._by_mark[i]:
                usual = self._against_mark(i, mark, before)
                spike = usual is not None and self._detectors[i].exceeds(working, usual)
            else:
                detector = self._detectors[i]
                spike = detector.update(working)
                usual = None if detector.baseline is None else int(detector.baseline)
            if usual is None:
                continue
            row["baseline_bytes"] = before + usual
            row["spike"] = spike
            if not spike:
                self._end_burst(i)
                continue
            event = SpikeEvent(step, epoch, batch, self.devices[i], peak,
                               before + usual, working, usual)
            new.append(event)
            if self.alert and not self._burst[i]:
                logger.warning("%s%s", self.where, event.message)
            self._burst[i].append(event)
        self.events.extend(new)
        return new

    def _against_mark(self, i: int, mark: Optional[int],
                      before: int) -> Optional[int]:
        """The usual working memory where only a high-water mark exists: the
        most any earlier step can have needed, the previous mark above the
        memory in use. None during warm-up or with no earlier mark."""
        if mark is None or self._judged[i] <= self._detectors[i].warmup:
            return None
        return max(int(mark) - before, 0)

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
