"""What a watch recorded: one `CallRecord` per call of `fit`, `evaluate` or
`predict` (the last fit and the calls since), and everything read from them
together."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import pandas as pd

from keras_memwatch.judge.derived import spike_table
from keras_memwatch.judge.spikes import SpikeMonitor
from keras_memwatch.judge.step_plan import PLAN_SOURCE, StepPlanner
from keras_memwatch.record.recorder import Recorder, concat_frames


@dataclasses.dataclass
class CallRecord:
    """What a watched call leaves: its rows and its judged events.

    Attributes:
        phase: `"train"` for a fit, `"test"` or `"predict"`.
        recorder: its rows.
        monitor: its spike monitor (spikes, drift and rises).
        planner: XLA's planner of a fit's steps (JAX), or `None`.
        plan_note: why a fit has no planner on JAX, else `""`.
    """

    phase: str
    recorder: Recorder
    monitor: SpikeMonitor
    planner: Optional[StepPlanner] = None
    plan_note: str = ""


class WatchRecord:
    """The calls a watch recorded, oldest first: a fit starts a new record,
    `evaluate` and `predict` add to it."""

    def __init__(self) -> None:
        self.calls: list[CallRecord] = []

    def add(self, call: CallRecord) -> None:
        """Adds a call; a fit first forgets the calls before it."""
        if call.phase == "train":
            self.calls = []
        self.calls.append(call)

    @property
    def fit(self) -> Optional[CallRecord]:
        """The record's fit, or `None`."""
        first = self.calls[0] if self.calls else None
        return first if first is not None and first.phase == "train" else None

    def to_dataframe(self) -> pd.DataFrame:
        """Every call's rows, in order."""
        return concat_frames([c.recorder.to_dataframe() for c in self.calls])

    def spikes(self) -> pd.DataFrame:
        """Every call's spike events, one row each."""
        return spike_table([e for c in self.calls for e in c.monitor.events])

    def drift(self) -> tuple[list[Any], list[Any]]:
        """The fit's drift and rise events (`([], [])` without a fit)."""
        fit = self.fit
        if fit is None:
            return [], []
        return fit.monitor.drift_events, fit.monitor.rise_events

    def sources(self, probe_notes: dict[str, str]) -> dict[str, str]:
        """What each source could see: the probes' notes, and XLA's plans
        of the fit's steps where JAX had them, or why not."""
        notes = dict(probe_notes)
        fit = self.fit
        if fit is not None and fit.planner is not None:
            quiet = {d: n for d, n in zip(fit.monitor.devices,
                                          fit.monitor.compiling) if n}
            notes[PLAN_SOURCE] = fit.planner.describe(quiet)
        elif fit is not None and fit.plan_note:
            notes[PLAN_SOURCE] = fit.plan_note
        return notes
