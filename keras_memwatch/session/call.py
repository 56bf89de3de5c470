"""One call of `fit`, `evaluate` or `predict` being watched.

A `CallSession` is opened at the call's begin hook and closed at its end.
It owns everything that lives for one call: the pipeline (its lock, pending
reads and drain thread) and its consumers (the judge, the recorder, the
streamed log, Keras's logs figures), the batch hooks on the callback, the
spike delivery, and XLA's planner of a fit's steps. What outlives the call
is its `CallRecord` (`session.record`): the rows and the judged events.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import keras

from keras_memwatch.configure.ranks import hostname, process_index_and_count
from keras_memwatch.explain.layers.growth import SpikeLayers
from keras_memwatch.judge.block_judge import BlockJudge
from keras_memwatch.judge.derived import main_device
from keras_memwatch.judge.spikes import SpikeMonitor
from keras_memwatch.judge.step_plan import StepPlanner, attach_planner
from keras_memwatch.measure.batches import wait_for_steps
from keras_memwatch.oom_errors import first_line, is_oom_error
from keras_memwatch.record.batch_shapes import BatchInputs, BatchShapes
from keras_memwatch.record.csvlog import open_log
from keras_memwatch.record.log_stream import LogStream
from keras_memwatch.record.pipeline import Pipeline
from keras_memwatch.record.recorder import Recorder
from keras_memwatch.record.sampler import Row, Sampler
from keras_memwatch.record.tuner_trial import tuner_trial_id
from keras_memwatch.session import batch_hooks
from keras_memwatch.session.faults import Faults
from keras_memwatch.session.logs_figures import LogsFigures
from keras_memwatch.session.record import CallRecord
from keras_memwatch.session.settings import WatchSettings
from keras_memwatch.session.spike_delivery import SpikeDelivery

logger = logging.getLogger("keras_memwatch")


class CallSession:
    """Watches one call from its begin hook to its end hook.

    Opening it starts the sampler, takes the sample at the call's start,
    starts the pipeline's thread and installs the batch hooks on `watch`.

    Args:
        watch: the callback (the hooks are installed on it; its `model` is
            the model watched).
        phase: `"train"`, `"test"` or `"predict"`.
        call: the call's number in the watch's record.
        settings: the watch's checked options.
        sampler: the watch's sampler (started here, closed by `close`).
        shapes: the input shapes the watch's fits called the model with.
        earlier_logs: the log paths of the watch's earlier calls (a new
            call never reuses one); the new path is appended.
        in_order: whether Keras runs the batch-end hooks in order on the
            training thread (the callback is not `async_safe`).
        faults: reports a fault once.
    """

    def __init__(self, watch: keras.callbacks.Callback, phase: str, call: int,
                 settings: WatchSettings, sampler: Sampler, shapes: BatchShapes,
                 earlier_logs: list[str], in_order: bool, faults: Faults) -> None:
        self.watch, self.phase, self.settings = watch, phase, settings
        self.sampler, self.shapes, self.faults = sampler, shapes, faults
        #: Read by the batch hooks: whether the call is recording, its epoch.
        self.recording, self.epoch = False, 0
        devices = sampler.start()
        self.process, self.process_count = process_index_and_count()
        self.hostname = hostname()
        alert = settings.verbose > 0
        recorder = Recorder(settings.max_rows)
        recorder.reset(sampler.device_columns, self.process, self.hostname, call)
        planner: Optional[StepPlanner] = None
        planned: tuple[str, ...] = ()
        plan_note, layers = "", None
        model = watch.model
        if phase == "train":
            planner, plan_note, planned = attach_planner(model, shapes.note)
            shapes.attach(model, _batch_inputs(model, planner))
            layers = SpikeLayers(lambda: self.watch.model, shapes, alert=alert)
        where = (f"process {self.process} on {self.hostname}: "
                 if self.process_count > 1 else "")
        monitor = SpikeMonitor(devices, settings.spikes, alert=alert, planned=planned,
                               per_step_peak=sampler.per_step_peak,
                               peak_at=sampler.peak_at, where=where, call=call)
        self.record = CallRecord(phase, recorder, monitor, planner, plan_note)
        self.log = self._open_log(call, earlier_logs)
        primary = devices.index(main_device(devices)) if devices else 0
        self.figures = LogsFigures(sampler, primary, planner, in_order=in_order)
        t0 = time.perf_counter()
        self.judge = BlockJudge(monitor, planner, t0)
        consumers: list[tuple[str, Callable]] = [
            ("judge samples", self.judge), ("record samples", recorder.extend)]
        if self.log is not None:
            consumers.append(("stream samples", self.log))
        consumers.append(("follow the epoch's figures", self.figures.track))
        self.pipeline = Pipeline(sampler, consumers, t0)
        self.delivery = SpikeDelivery(settings.on_spike, layers, monitor.name_layer,
                                      lambda: self.watch.model, phase, alert,
                                      faults.report)
        self._open(in_order, planner)

    def _open_log(self, call: int, earlier: list[str]) -> Optional[LogStream]:
        """The call's streamed log: one file per call and process; a name
        already taken (another process or job, an earlier call) gives the
        next free one."""
        if self.settings.log_path is None:
            return None
        trial = tuner_trial_id()
        log = open_log(self.settings.log_path, self.process, self.process_count,
                       self.hostname, earlier=earlier, call=call, trial=trial)
        if log is None:
            return None
        earlier.append(log.path)
        if trial is not None:
            logger.info("KerasTuner trial %s: memory log %s", trial, log.path)
        return LogStream(log, self.sampler)

    def _open(self, in_order: bool, planner: Optional[StepPlanner]) -> None:
        """Takes the first sample, starts the pipeline, installs the hooks."""
        pipe = self.pipeline
        self.recording = True
        with pipe.lock:
            first = self.sampler.read()
            self.figures.first_read(first)
            pipe.pending.append(((self.phase, 0, None), pipe.t0, first))
        pipe.drain()
        pipe.start()
        model = self.watch.model
        spe = max(int(getattr(model, "steps_per_execution", 1) or 1), 1)
        shapes = self.shapes
        batch_hooks.install(self.watch, batch_hooks.batch_hooks(
            pipe, self, self.sampler.read,
            self.figures if self.settings.add_to_logs else None,
            planner.expect if planner is not None else None,
            shapes.batch_begins if shapes.per_batch else None,
            self.settings.every_n_batches, spe, in_order=in_order,
            behind=self.behind, catch_up=self.catch_up, fault=self.faults.report))

    # -- during the call --------------------------------------------------

    def behind(self) -> bool:
        """Whether the training thread has work: the pipeline's thread fell
        behind, or spikes wait for delivery."""
        return self.pipeline.overdue or bool(self.judge.events)

    def catch_up(self) -> None:
        """On the training thread: drains if the pipeline's thread fell
        behind, and delivers the spikes found."""
        if self.pipeline.overdue:
            self.pipeline.drain()
        if self.judge.events:
            self.delivery.deliver(self.judge.take_events())

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.figures.new_epoch()

    def end_epoch(self, epoch: int, logs: Optional[dict]) -> None:
        """Records every sample of the epoch, closes it for the monitor
        (drift, bursts), fills its logs and delivers its spikes."""
        self.pipeline.flush()
        self.record.monitor.end_epoch(epoch)
        if self.settings.add_to_logs and logs is not None:
            self.figures.fill_epoch(logs)
        self.delivery.deliver(self.judge.take_events())

    def read_now(self) -> dict[str, Row]:
        """Reads every probe now, in order with the samples; not recorded."""
        return dict(zip(self.sampler.devices, self.pipeline.read_now()))

    def drain(self) -> None:
        """Records every sample handed in so far."""
        self.pipeline.drain()

    # -- the end ----------------------------------------------------------

    def finish(self) -> None:
        """Ends the call: every sample recorded, spikes delivered, all
        closed."""
        self.recording = False
        self.pipeline.stop()
        if self.phase != "train":  # a fit closed its bursts at epoch end
            self.record.monitor.end_epoch(0)
        self.delivery.deliver(self.judge.take_events())
        self.close()
        if self.phase == "train":
            _report_failed_step(self.watch.model)

    def close(self) -> None:
        """Takes the hooks off and closes the pipeline, the log, the
        planner and the probes; safe to call more than once."""
        self.recording = False
        batch_hooks.remove(self.watch)
        self.shapes.detach()
        self.pipeline.stop()
        if self.log is not None:
            self.log.close()
        if self.record.planner is not None:
            self.record.planner.detach()
        self.sampler.close()


def _report_failed_step(model: Any) -> None:
    """Logs an error where a step ran out of memory and `fit` returned
    without raising it: JAX reports a step's failure only when its results
    are awaited, and Keras drops the logs it cannot read."""
    if model is None:
        return
    try:
        wait_for_steps(model)  # a no-op off JAX
    except Exception as e:
        if is_oom_error(e):
            logger.error(
                "keras_memwatch: a training step ran out of memory, and `fit` "
                "returned without raising it (JAX reports a step's failure only "
                "when its results are awaited). The model's weights are lost "
                "with it. Inside `watch.guard()` it is raised, with a report. %s",
                first_line(e))


def _batch_inputs(model: Any, planner: Optional[StepPlanner]) -> BatchInputs:
    """How `BatchShapes` sees each training batch's inputs: from XLA's
    planner (JAX), at each model call (PyTorch's eager steps), or not at all
    (a compiled step calls the model only while it is traced)."""
    if planner is not None:
        return BatchInputs.PLANNER
    if keras.backend.backend() == "torch" and not getattr(model, "jit_compile", False):
        return BatchInputs.MODEL_CALL
    return BatchInputs.UNSEEN
