"""Judges each training sample per device, and turns verdicts into alerts.

What is judged is a step's *working memory*: its peak minus the memory in
use just before it (the previous sample's current bytes). A ratio on the
raw peak hides real spikes whenever weights, optimizer state and the
framework's own footprint dwarf a step's working memory (an 820 MiB
TensorFlow process whose oversized batch peaks at 1,195 MiB is only 1.46x
its usual peak, while that step's working memory grew about 6x).
`baseline_bytes` is reported in the same terms as `peak_bytes`: the memory
in use before the step plus the usual working memory.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Optional

from keras_memwatch.derived import working_memory
from keras_memwatch.detector import DriftMonitor, SpikeDetector
from keras_memwatch.events import DriftEvent, SpikeEvent
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")


class SpikeMonitor:
    """One spike detector and one drift monitor per device.

    Args:
        devices: the devices of each sample, in row order.
        window, threshold, min_delta_mb, warmup: passed to each
            `SpikeDetector`.
        alert: log spikes and drift at WARNING.
    """

    def __init__(
        self,
        devices: Sequence[str],
        window: int,
        threshold: float,
        min_delta_mb: float,
        warmup: int,
        alert: bool,
    ):
        self.devices = tuple(devices)
        self.alert = alert
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

    def judge(
        self,
        step: int,
        epoch: int,
        batch: Optional[int],
        judged: bool,
        rows: Sequence[dict],
    ) -> list[SpikeEvent]:
        """Fills `baseline_bytes` and `spike` of each row; returns new spikes.

        Args:
            judged: False for the train-begin row and non-training phases,
                whose values only become the reference for the next step.
        """
        new = []
        for i, row in enumerate(rows):
            before, current = self._before[i], row["current_bytes"]
            self._before[i] = current
            row["baseline_bytes"], row["spike"] = None, False
            peak = row["peak_bytes"]
            if not judged or before is None or peak is None:
                self._end_burst(i)
                continue
            working = working_memory(peak, before)
            detector = self._detectors[i]
            spike = detector.update(working)
            self._drift[i].update(current)
            if detector.baseline is None:
                continue
            usual = int(detector.baseline)
            row["baseline_bytes"] = before + usual
            row["spike"] = spike
            if not spike:
                self._end_burst(i)
                continue
            event = SpikeEvent(step, epoch, batch, self.devices[i], peak,
                               before + usual, working, usual)
            new.append(event)
            if self.alert and not self._burst[i]:
                logger.warning("%s", event.message)
            self._burst[i].append(event)
        self.events.extend(new)
        return new

    def _end_burst(self, i: int) -> None:
        burst = self._burst[i]
        if self.alert and len(burst) > 1:
            worst = max(burst, key=lambda e: e.peak_bytes)
            logger.warning(
                "memory spike burst on %s: %d consecutive spiking samples, "
                "steps %d-%d, worst peak %s at epoch %d batch %s",
                self.devices[i], len(burst), burst[0].step, burst[-1].step,
                format_bytes(worst.peak_bytes), worst.epoch, worst.batch,
            )
        burst.clear()

    def end_epoch(self, epoch: int) -> None:
        """Closes bursts and checks each device for drift over the epoch."""
        for i, device in enumerate(self.devices):
            self._end_burst(i)
            event = self._drift[i].end_epoch()
            if event is not None:
                self.drift_events.append((device, epoch, event))
                if self.alert:
                    logger.warning(
                        "memory drift on %s in epoch %d: %s (a leak?)",
                        device, epoch, event.message,
                    )
