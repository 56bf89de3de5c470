"""From raw reads to blocks of rows, off the hot path.

A batch hook only reads the probes and appends the raw readings to
`pending`, holding `lock`, in the order read. Everything else happens here,
a block of samples at a time, on a thread of its own: the reads are paired
with the batches in batch order (`Sequencer`), become a `Block`, and the
block goes to each consumer in turn (the judge, the recorder, the streamed
log, Keras's logs figures: whatever the caller wired). The pipeline knows
none of them: a consumer is a callable that takes a block, and one that
fails loses no row for the others.

The thread drains every `interval_s` (0.1 s), and as soon as `block` (128)
samples wait; should it fall behind, the training thread drains itself once
`2 * block` wait (`overdue`). So a sample is consumed within 0.1 s or 256
sampled batches of its read, whichever comes first: a `kill -9` loses at
most the rows of the last 0.1 s (the row in flight, when steps are slower
than that).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Sequence
from typing import Callable, NamedTuple, Optional

import numpy as np

from keras_memwatch.record.block import MISSING, PHASE_CODES, Block
from keras_memwatch.record.sampler import Sampler
from keras_memwatch.record.sequencer import Sequencer

logger = logging.getLogger("keras_memwatch")

Key = tuple  # (phase, epoch, batch); batch None for the sample at a call's start

#: Takes each block in the order read; may fill its spike flags and
#: derived columns for the consumers after it.
Consumer = Callable[[Block], None]


class Stage(NamedTuple):
    """A consumer and what it does, in words, for the warning if it fails."""

    does: str
    take: Consumer


class Pipeline:
    """Turns raw samples into blocks, in the order they were read, and hands
    each block to its consumers.

    Args:
        sampler: the call's started sampler.
        consumers: `(what it does, callable)` pairs, called in this order
            with each block. A consumer that raises is warned about once
            (`"MemWatch could not <what it does> (...)"`); the others still
            get the block.
        t0: `perf_counter()` at the call's start, which `Block.time_s`
            counts from. Defaults to `0.0`.
        wall_t0: UNIX seconds at `t0`, which `Block.timestamp` counts from.
            Defaults to `time.time()` now.
        interval_s: how often the background thread drains. Defaults to
            `0.1`.
        block: samples that wake the thread before `interval_s` is over.
            Defaults to `128`: numpy's cost of a block is mostly fixed, so
            larger blocks cost less a sample.
    """

    def __init__(self, sampler: Sampler,
                 consumers: Sequence[tuple[str, Consumer]], t0: float = 0.0,
                 wall_t0: Optional[float] = None, interval_s: float = 0.1,
                 block: int = 128):
        self.sampler = sampler
        self.consumers = [Stage(does, take) for does, take in consumers]
        self.interval_s, self.block = interval_s, block
        self.overdue_at = 2 * block
        #: Held by the batch hooks while they read and append to `pending`.
        self.lock = threading.Lock()
        self.t0 = t0
        self.wall_t0 = time.time() if wall_t0 is None else wall_t0
        #: `(key, perf_counter() at the read, raw read)` in the order read,
        #: appended holding `lock` (the list is never replaced).
        self.pending: list[tuple[Key, float, list]] = []
        self._sequence = Sequencer()
        #: Announces the key of the next batch, in batch order: called on
        #: the training thread, without a lock.
        self.expect = self._sequence.expect
        self._failed: set[str] = set()
        self.step = 0
        self._wake = threading.Event()
        self._drain_lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        """Starts the background drain (and a last one at interpreter exit,
        for a call that raised and was never closed)."""
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

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self.drain()

    def drain(self) -> None:
        """Hands every sample appended so far to the consumers (those whose
        turn has come: see `Sequencer`)."""
        with self._drain_lock:
            with self.lock:
                arrived = self.pending[:]
                self.pending.clear()
            if not arrived:
                return
            arrive = self._sequence.arrive
            self._process_safely(lambda: [due for key, read_at, raw in arrived
                                          for due in arrive(key, (read_at, raw))])

    def flush(self) -> None:
        """Drains, then processes the samples held back for order (their
        keys are the last of a phase: Keras has run every hook before)."""
        with self._drain_lock:
            self.drain()
            self._process_safely(self._sequence.flush)

    def read_now(self) -> list[dict]:
        """Reads every probe now, in order with the samples; not recorded."""
        with self._drain_lock:
            self.drain()
            with self.lock:
                return self.sampler.rows(self.sampler.read())

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
        read_at = np.fromiter((read[0] for _, read in due), float, n)
        phases, epochs, batches = zip(*(key for key, _ in due))
        time_s = np.round(read_at - self.t0, 6)
        block = Block(
            np.arange(self.step, self.step + n), np.array(epochs, np.int64),
            np.array([MISSING if b is None else b for b in batches], np.int64),
            np.array([PHASE_CODES[p] for p in phases], np.int8), time_s,
            self.sampler.tables([read[1] for _, read in due]),
            timestamp=np.round(self.wall_t0 + time_s, 6))
        self.step += n
        for consumer in self.consumers:
            try:
                consumer.take(block)
            except Exception as e:  # the next consumers still get the block
                if consumer.does not in self._failed:
                    self._failed.add(consumer.does)
                    logger.warning("MemWatch could not %s (%r); the rows are "
                                   "kept", consumer.does, e, exc_info=True)
