"""From raw reads to judged, recorded and streamed rows, off the hot path.

A batch hook only reads the probes and appends the raw readings to
`pending`, in the order read. Everything else happens here, a block of
samples at a time, on a thread of its own: the reads are paired with the
batches in batch order (`Sequencer`), become rows, JAX steps get their
plan, the monitor judges, the recorder keeps and the log streams (one write
a block).
That thread can run while the training thread is inside the framework
(which releases the interpreter), and the batch hook does little beyond
its reads.

The thread drains every `interval_s` (0.1 s), and as soon as `block` (128)
samples wait; should it fall behind, the training thread drains itself once
`2 * block` wait (`overdue`). So a sample is judged, recorded, streamed and
alerted on within 0.1 s or 256 sampled batches of its read, whichever comes
first, and `on_spike` is called at the next batch begin after that (batch
end, where the hooks run in order on the training thread): a
`kill -9` loses at most the rows of the last 0.1 s (the row in flight, when
steps are slower than that).
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Callable, Optional

import numpy as np

from keras_memwatch.record.block import (CURRENT, MISSING, PEAK, PHASE_CODES, Block,
                                  before_each, optional)
from keras_memwatch.record.csvlog import CsvLog
from keras_memwatch.judge.events import SpikeEvent
from keras_memwatch.record.recorder import Recorder
from keras_memwatch.record.sampler import Sampler
from keras_memwatch.record.sequencer import Sequencer
from keras_memwatch.judge.spikes import SpikeMonitor
from keras_memwatch.judge.step_plan import StepPlanner

logger = logging.getLogger("keras_memwatch")

Key = tuple  # (phase, epoch, batch); batch None for the sample at a call's start

_TRAIN = PHASE_CODES["train"]


class Pipeline:
    """Turns raw samples into the record, in the order they were read.

    Args:
        sampler, monitor, recorder: the fit's started sampler, its spike
            monitor and its (reset) recorder.
        log: the streamed log, or `None`.
        planner: XLA's plans of the steps (JAX), or `None`.
        primary: index of the device whose figures go into Keras's logs.
        lock: the lock the batch hooks hold while they read and append to
            `pending` (kept as `lock`).
        t0: `perf_counter()` at train begin, which sample times count from.
            Defaults to `0.0`.
        interval_s: how often the background thread drains. Defaults to
            `0.1`.
        block: samples that wake the thread before `interval_s` is over.
            Defaults to `128`: numpy's cost of a block is mostly fixed, so
            larger blocks cost less a sample.
    """

    def __init__(self, sampler: Sampler, monitor: SpikeMonitor, recorder: Recorder,
                 log: Optional[CsvLog], planner: Optional[StepPlanner],
                 primary: int, lock: threading.Lock, t0: float = 0.0,
                 interval_s: float = 0.1, block: int = 128):
        self.sampler, self.monitor, self.recorder = sampler, monitor, recorder
        self.log, self.planner, self.primary = log, planner, primary
        self.interval_s, self.block = interval_s, block
        self.overdue_at = 2 * block
        self.lock = lock
        self._wake = threading.Event()
        self._t0 = t0
        self._last_read = t0  # when the previous sample was read
        #: `(key, perf_counter() at the read, raw read)` in the order read,
        #: appended holding `lock` (the list is never replaced).
        self.pending: list[tuple[Key, float, list]] = []
        self._sequence = Sequencer()
        #: Announces the key of the next batch, in batch order: called on
        #: the training thread, without a lock.
        self.expect = self._sequence.expect
        self.events: list[SpikeEvent] = []  # new spikes, for on_spike
        self._judge_failed = False
        self.step = 0
        self.epoch_peak: Optional[int] = None
        self.last_current: Optional[int] = None
        self._drain_lock = threading.RLock()  # drain() inside end_epoch()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Starts the background drain (and a last one at interpreter exit,
        for a fit that raised and was never closed)."""
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="keras_memwatch")
        self._thread.start()
        atexit.register(self.flush)

    def stop(self) -> None:
        """Stops the background drain and processes what is left."""
        self._stop.set()
        self._wake.set()
        atexit.unregister(self.flush)
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self.flush()

    def wake(self) -> None:
        """Asks the thread to drain now (a block is waiting)."""
        if not self._wake.is_set():
            self._wake.set()

    @property
    def overdue(self) -> bool:
        """Whether the thread fell behind: the caller should drain."""
        return len(self.pending) >= self.overdue_at

    def chores_due(self) -> bool:
        """Whether the training thread has work: the pipeline is `overdue`,
        or spikes wait for `on_spike`."""
        return self.overdue or bool(self.events)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self.drain()

    def drain(self) -> None:
        """Judges, records and streams every sample handed in so far."""
        with self._drain_lock:
            with self.lock:
                arrived = self.pending[:]
                self.pending.clear()
            if not arrived:
                return
            arrive = self._sequence.arrive
            self._process_safely(lambda: [due for key, read_at, raw in arrived
                                          for due in arrive(key, (read_at, raw))])

    def _process_safely(self, due: Callable[[], list]) -> None:
        """Processes the pairs `due()` returns; a fault never reaches
        training."""
        try:
            self._process(due())
        except Exception as e:
            logger.warning("MemWatch could not process samples (%r)", e,
                           exc_info=True)

    def _process(self, due: list) -> None:
        n = len(due)
        if not n:
            return
        keys = [key for key, _ in due]
        read_at = np.fromiter((read[0] for _, read in due), float, n)
        phases, epochs, batches = zip(*keys)
        batch = np.array([MISSING if b is None else b for b in batches], np.int64)
        phase = np.array([PHASE_CODES[p] for p in phases], np.int8)
        tables = self.sampler.tables([read[1] for _, read in due])
        block = Block(np.arange(self.step, self.step + n), np.array(epochs, np.int64),
                      batch, phase, np.round(read_at - self._t0, 6), tables,
                      [np.zeros(n, bool) for _ in tables])
        self.step += n
        train = phase == _TRAIN
        judged = batch >= 0  # not the sample at the start of the call
        plans = compiled = None
        if self.planner is not None:
            plans = np.full((2, n), MISSING, np.int64)
            for i in np.flatnonzero(train & judged).tolist():
                plan = self.planner.take(keys[i])
                if plan is not None:
                    plans[:, i] = plan.total_bytes, plan.working_bytes
            compiled = self._compiled_since(read_at)
        try:
            self.events.extend(self.monitor.judge(block, judged, plans, compiled))
        except Exception as e:  # a fault in judging loses no row
            if not self._judge_failed:
                self._judge_failed = True
                logger.warning("MemWatch could not judge samples (%r); they are "
                               "recorded unjudged", e, exc_info=True)
        self.recorder.extend(block)
        if self.log is not None:
            self._stream(self.log.format(block, self.sampler.devices,
                                         self.sampler.layout))
        if tables and train.any():
            self._track(tables[self.primary][train])

    def _compiled_since(self, read_at: np.ndarray) -> np.ndarray:
        """Per sample, whether XLA compiled a new input shape between the
        previous sample's read and this one's (JAX)."""
        previous = before_each(read_at, self._last_read)
        self._last_read = read_at[-1]
        windows = np.array(self.planner.compilations, float).reshape(-1, 2)
        # the first compilation that ended after the previous read
        first = np.searchsorted(windows[:, 1], previous)
        began = np.append(windows[:, 0], np.inf)[first]
        return began <= read_at

    def _track(self, table: np.ndarray) -> None:
        """Follows the main device's training rows (for Keras's logs)."""
        self.last_current = optional(table[-1, CURRENT])
        peaks = table[:, PEAK]
        peak = int(peaks.max())
        if peak >= 0 and (self.epoch_peak is None or peak > self.epoch_peak):
            self.epoch_peak = peak

    def _stream(self, text: str) -> None:
        log = self.log
        if log is None:
            return
        try:
            log.write_text(text)
        except OSError as e:
            logger.warning("cannot write %s (%s); streaming stops, the record "
                           "in memory goes on", log.path, e)
            log.close()
            self.log = None

    def flush(self) -> None:
        """Drains, then processes the samples held back for order (their
        keys are the last of a phase: Keras has run every hook before)."""
        with self._drain_lock:
            self.drain()
            self._process_safely(self._sequence.flush)

    def end_epoch(self, epoch: int) -> None:
        """Flushes, then closes the epoch for the monitor (drift, bursts)."""
        with self._drain_lock:
            self.flush()
            self.monitor.end_epoch(epoch)

    def read_now(self) -> list[dict]:
        """Reads every probe now, in order with the samples; not recorded."""
        with self._drain_lock:
            self.drain()
            with self.lock:
                return self.sampler.rows(self.sampler.read())

    def take_events(self) -> list[SpikeEvent]:
        """The spikes found since the last call (for `on_spike`)."""
        if not self.events:
            return []
        with self._drain_lock:
            events, self.events = self.events, []
        return events
