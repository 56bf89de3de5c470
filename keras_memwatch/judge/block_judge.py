"""Judges each block of a call's samples as the pipeline hands it over.

JAX's training steps first get the working memory of XLA's plan of their
step (`StepPlanner`), and whether a new input shape was compiled since the
previous sample; then the call's `SpikeMonitor` judges the block, filling
its baseline and spike flags. The spikes found wait in `events` until the
training thread takes them.
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np

from keras_memwatch import columns as C
from keras_memwatch.judge.events import SpikeEvent
from keras_memwatch.judge.spikes import SpikeMonitor
from keras_memwatch.judge.step_plan import StepPlanner
from keras_memwatch.record.block import MISSING, PHASE_CODES, Block, before_each

_TRAIN = PHASE_CODES["train"]


class BlockJudge:
    """A pipeline consumer: plans, then the spike monitor, a block at a time.

    Args:
        monitor: the call's spike monitor.
        planner: XLA's plans of the fit's steps (JAX), or `None`.
        t0: `perf_counter()` at the call's start (`Block.time_s` counts
            from it), to place XLA's compilations among the samples.
            Defaults to `0.0`.
    """

    def __init__(self, monitor: SpikeMonitor, planner: Optional[StepPlanner] = None,
                 t0: float = 0.0) -> None:
        self.monitor, self.planner, self.t0 = monitor, planner, t0
        self._last_read = t0  # when the previous sample was read
        #: Spikes found and not yet taken (appended by the pipeline's
        #: thread, taken on the training thread).
        self.events: collections.deque[SpikeEvent] = collections.deque()

    def __call__(self, block: Block) -> None:
        judged = block.batch >= 0  # not the sample at the start of the call
        plans = compiled = None
        if self.planner is not None:
            plans = self._plans(block, judged)
            compiled = self._compiled_since(block.time_s + self.t0)
        self.events.extend(self.monitor.judge(block, judged, plans, compiled))

    def take_events(self) -> list[SpikeEvent]:
        """The spikes found since the last call, oldest first."""
        taken = []
        while self.events:
            taken.append(self.events.popleft())
        return taken

    def _plans(self, block: Block, judged: np.ndarray) -> np.ndarray:
        """Per sample, the total and working bytes of its step's plan."""
        plans = np.full((2, len(block)), MISSING, np.int64)
        train = (block.phase == _TRAIN) & judged
        for i in np.flatnonzero(train).tolist():
            key = (C.PHASES[block.phase[i]], int(block.epoch[i]), int(block.batch[i]))
            plan = self.planner.take(key)
            if plan is not None:
                plans[:, i] = plan.total_bytes, plan.working_bytes
        return plans

    def _compiled_since(self, read_at: np.ndarray) -> np.ndarray:
        """Per sample, whether XLA compiled a new input shape between the
        previous sample's read and this one's."""
        previous = before_each(read_at, self._last_read)
        self._last_read = read_at[-1]
        windows = np.array(self.planner.compilations, float).reshape(-1, 2)
        # the first compilation that ended after the previous read
        first = np.searchsorted(windows[:, 1], previous)
        began = np.append(windows[:, 0], np.inf)[first]
        return began <= read_at
