"""MemWatch: the Keras callback. It only conducts: Keras hooks call the
sampler, the spike monitor judges, the recorder and the log keep."""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any, Callable, Optional

import keras
import pandas as pd

from keras_memwatch import options
from keras_memwatch.csvlog import CsvLog, PathLike
from keras_memwatch.derived import main_device, spike_table
from keras_memwatch.detector import SpikeDetector
from keras_memwatch.events import SpikeEvent
from keras_memwatch.probes import resolve_probes
from keras_memwatch.ranks import hostname, process_index_and_count
from keras_memwatch.recorder import Recorder
from keras_memwatch.report import summarize
from keras_memwatch.sampler import Row, Sampler
from keras_memwatch.sequencer import Sequencer
from keras_memwatch.spikes import SpikeMonitor
from keras_memwatch.units import MIB

logger = logging.getLogger("keras_memwatch")


def _never_raises(hook: Callable) -> Callable:
    """Keeps a fault inside MemWatch from ending the user's training."""

    @functools.wraps(hook)
    def guarded(self, *args, **kwargs):
        try:
            return hook(self, *args, **kwargs)
        except Exception as e:
            if hook.__name__ not in self._faults:
                self._faults.add(hook.__name__)
                logger.warning("MemWatch %s failed (%r); training goes on",
                               hook.__name__, e, exc_info=True)

    return guarded


class MemWatch(keras.callbacks.Callback):
    """Records memory at every training batch and flags the batches that jump.

    At train begin and at the end of every `every_n_batches`-th training
    (and validation) batch, MemWatch reads every available memory source
    and keeps one row per device:

    - the framework allocator (`allocator_current_bytes`,
      `allocator_peak_bytes`, `allocator_limit_bytes`): TensorFlow and
      PyTorch give the peak since the previous sample; JAX only a
      high-water mark for the life of the process;
    - NVML (`nvml_used_bytes`, `nvml_total_bytes` for the whole device,
      `process_bytes` for this process);
    - the host (`host_rss_bytes`, `host_peak_rss_bytes`, the peak since the
      previous sample on Linux).

    `peak_bytes` and `current_bytes` are the best of these for each device,
    in bytes; a value a source cannot give is missing, never 0. A step whose
    working memory (peak minus the memory in use before it) jumps above a
    rolling baseline is a spike: logged at WARNING, passed to `on_spike`,
    and listed in `spikes`. Sustained growth over an epoch is reported as
    drift. The callback is `async_safe`: with the JAX and PyTorch backends
    its batch hook runs on Keras's worker threads and training stays
    asynchronous.

    Args:
        every_n_batches: sample every n-th training batch. Defaults to `1`.
        window: samples in the rolling baseline. Defaults to `50`.
        threshold: a spike needs a working memory above `threshold` times
            the baseline... Defaults to `1.5`.
        min_delta_mb: ... and more than this many MiB above it. Defaults to
            `64`.
        warmup: first samples of a fit that are recorded, never judged.
            Defaults to `5`.
        log_path: stream rows to this new CSV file as training runs (an
            existing file is never overwritten; later fits of the same
            instance write `name.1.csv`, `name.2.csv`, ...). Defaults to
            `None`.
        on_spike: callable receiving each `SpikeEvent`. It is called on the
            training thread at the start of the next batch (or at epoch
            end), where it may set `model.stop_training`. Its errors are
            logged, never raised. Defaults to `None`.
        add_to_logs: add `mem_peak_mib` and `mem_current_mib` (of the first
            GPU, or of the host without one) to the batch and epoch `logs`,
            so `History`, `CSVLogger` and the progress bar show them.
            Defaults to `True`.
        allow_growth, memory_limit_mb: apply `configure_memory` now. It only
            works before the framework has set up its devices, which is
            usually before the model is built: prefer calling
            `keras_memwatch.configure_memory` first thing in the script.
            Defaults to `None` (leave as is).
        probes: `"auto"` (the active backend's allocator, NVML and the
            host), a probe name, or a list of names and `Probe` instances.
            Defaults to `"auto"`.
        verbose: `0` records silently; `1` logs alerts and the summary.
            Defaults to `1`.
        max_rows: keep only the newest `max_rows` samples in memory (the
            streamed log stays complete), or all when `None`. Defaults to
            `None`.

    Raises:
        ValueError, TypeError: for a bad option, before training starts.
        FileExistsError: if `log_path` exists.

    Example:

    ```python
    watch = MemWatch()
    model.fit(x, y, epochs=3, callbacks=[watch])
    watch.to_dataframe()   # one row per sampled batch per device
    watch.spikes           # the batches that jumped
    print(watch.summary())
    ```
    """

    async_safe = True

    def __init__(
        self,
        every_n_batches: int = 1,
        window: int = 50,
        threshold: float = 1.5,
        min_delta_mb: float = 64,
        warmup: int = 5,
        log_path: Optional[PathLike] = None,
        on_spike: Optional[Callable[[SpikeEvent], Any]] = None,
        add_to_logs: bool = True,
        allow_growth: Optional[bool] = None,
        memory_limit_mb: Optional[float] = None,
        probes: Any = "auto",
        verbose: int = 1,
        max_rows: Optional[int] = None,
    ):
        super().__init__()
        self.every_n_batches = options.positive_int("every_n_batches", every_n_batches)
        detector = SpikeDetector(window, threshold, min_delta_mb, warmup)  # checks them
        self.window, self.threshold = detector.window, detector.threshold
        self.min_delta_mb, self.warmup = detector.min_delta_mb, detector.warmup
        self.log_path = options.log_path("log_path", log_path)
        self.on_spike = options.optional_callable("on_spike", on_spike)
        self.add_to_logs = options.boolean("add_to_logs", add_to_logs)
        self.verbose = options.choice("verbose", verbose, (0, 1))
        self.max_rows = None if max_rows is None else options.positive_int(
            "max_rows", max_rows)
        self._probes = resolve_probes(probes, keras.backend.backend())
        self.memory_config = None
        if allow_growth is not None or memory_limit_mb is not None:
            from keras_memwatch.config import configure_memory

            self.memory_config = configure_memory(
                allow_growth=allow_growth, memory_limit_mb=memory_limit_mb)
        self.log_paths: list[str] = []
        self.process, self.process_count, self.hostname = 0, 1, ""
        self._sampler = Sampler(self._probes)
        self._recorder = Recorder(self.max_rows)
        self._lock = threading.Lock()
        self._monitor: Optional[SpikeMonitor] = None
        self._log: Optional[CsvLog] = None
        self._training = False
        self._faults: set[str] = set()

    # -- Keras hooks -------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._close()
        self._faults = set()
        devices = self._sampler.start()
        self.process, self.process_count = process_index_and_count()
        self.hostname = hostname()
        self._recorder.reset(self._sampler.device_columns, self.process,
                             self.hostname)
        self._monitor = SpikeMonitor(
            devices, self.window, self.threshold, self.min_delta_mb,
            self.warmup, alert=self.verbose > 0)
        if self.log_path is not None:
            self._log = CsvLog(_free_path(self.log_path, len(self.log_paths)),
                               self.process, self.hostname)
            self.log_paths.append(self._log.path)
        self._spe = max(int(getattr(self.model, "steps_per_execution", 1) or 1), 1)
        self._sequence = Sequencer(self._lock)
        self._epoch = 0
        self._step = 0
        self._t0 = time.perf_counter()
        self._primary = devices.index(main_device(devices)) if devices else 0
        self._epoch_peak: Optional[int] = None
        self._last_current: Optional[int] = None
        self._undelivered: list[SpikeEvent] = []
        self._training = True
        with self._lock:
            self._commit(("train", 0, None), (0.0, self._sampler.sample()))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._epoch_peak = None

    def on_train_batch_begin(self, batch, logs=None):
        self._expect("train", batch)

    def on_train_batch_end(self, batch, logs=None):
        self._sample("train", batch, logs)

    def on_test_batch_begin(self, batch, logs=None):
        self._expect("test", batch)

    def on_test_batch_end(self, batch, logs=None):
        self._sample("test", batch, logs)

    @_never_raises
    def on_epoch_end(self, epoch, logs=None):
        if not self._training:
            return
        with self._lock:
            self._flush()
            self._monitor.end_epoch(epoch)
            if self.add_to_logs and logs is not None:
                _add_metrics(logs, self._epoch_peak, self._last_current)
        self._deliver()

    @_never_raises
    def on_train_end(self, logs=None):
        if not self._training:
            return
        with self._lock:
            self._flush()
            self._training = False
        self._deliver()
        self._close()
        if self.verbose and self._recorder.total_samples:
            logger.info("%s", self.summary())

    # -- sampling ----------------------------------------------------------

    def _due(self, batch: int) -> bool:
        """Whether the execution that ends at `batch` covers an n-th batch."""
        n = self.every_n_batches
        return (batch + 1) // n > (batch + 1 - self._spe) // n

    @_never_raises
    def _expect(self, phase: str, begin: int) -> None:
        if not self._training:
            return
        self._deliver()
        end = begin + self._spe - 1
        if self._due(end):
            # On the training thread, so as cheap as can be: no lock (a deque
            # append is atomic, and readers hold the lock).
            self._sequence.expect((phase, self._epoch, end))

    @_never_raises
    def _sample(self, phase: str, batch: int, logs) -> None:
        if not self._training or not self._due(batch):
            return
        with self._lock:
            key = (phase, self._epoch, batch)
            # Let earlier batches sample first, so each peak is its batch's.
            self._sequence.wait_turn(key)
            rows = self._sampler.sample()
            sample = (round(time.perf_counter() - self._t0, 6), rows)
            for due in self._sequence.arrive(key, sample):
                self._commit(*due)
        if self.add_to_logs and logs is not None and phase == "train" and rows:
            row = rows[self._primary]
            _add_metrics(logs, row["peak_bytes"], row["current_bytes"])

    def _flush(self) -> None:
        for due in self._sequence.flush():
            self._commit(*due)

    def _commit(self, key: tuple, sample: tuple) -> None:
        """Judges, records and streams one sample (holding the lock)."""
        phase, epoch, batch = key
        time_s, rows = sample
        step = self._step
        self._step += 1
        judged = phase == "train" and batch is not None
        events = self._monitor.judge(step, epoch, batch, judged, rows)
        self._recorder.append(epoch, batch, phase, time_s, rows)
        if self._log is not None:
            try:
                self._log.write(step, epoch, batch, phase, time_s,
                                self._sampler.devices, rows)
            except OSError as e:
                logger.warning("cannot write %s (%s); streaming stops, the "
                               "record in memory goes on", self._log.path, e)
                self._log.close()
                self._log = None
        if rows and phase == "train":
            row = rows[self._primary]
            self._last_current = row["current_bytes"]
            peak = row["peak_bytes"]
            if peak is not None and (self._epoch_peak is None or peak > self._epoch_peak):
                self._epoch_peak = peak
        if self.on_spike is not None:
            self._undelivered.extend(events)

    def _deliver(self) -> None:
        """Calls `on_spike` on the training thread, where Keras expects
        `stop_training` to be set (never from an async worker)."""
        if not self._undelivered:
            return
        with self._lock:
            events, self._undelivered = self._undelivered, []
        for event in events:
            try:
                self.on_spike(event)
            except Exception as e:
                logger.warning("on_spike raised %r; training goes on", e)

    def _close(self) -> None:
        self._sampler.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- results -----------------------------------------------------------

    def to_dataframe(self) -> pd.DataFrame:
        """The record of the last fit: one row per sample per device.

        Columns and dtypes are listed in the README; bytes are nullable
        integers (`Int64`), missing where a source cannot give a value.
        """
        return self._recorder.to_dataframe()

    @property
    def spikes(self) -> pd.DataFrame:
        """The spike events of the last fit, one row each."""
        return spike_table(self._monitor.events if self._monitor else [])

    @property
    def training(self) -> bool:
        """Whether a fit is running (its probes are open)."""
        return self._training

    @property
    def sources(self) -> dict[str, str]:
        """What each probe of the last fit could see, or why it could not."""
        return dict(self._sampler.notes)

    def sample_now(self) -> dict[str, Row]:
        """Reads every probe now, during a fit, without recording the sample.

        The peaks since the last recorded sample are read (and reset), so
        use it where the fit is over anyway: `guard()` calls it on an
        out-of-memory error. Returns `{}` when no fit is running.
        """
        if not self._training:
            return {}
        with self._lock:
            return dict(zip(self._sampler.devices, self._sampler.sample()))

    def breakdown(self, batch_size: Optional[int] = None) -> dict:
        """Where the memory went: weights, optimizer state and the
        transient part of a step, in bytes.

        Args:
            batch_size: the training batch size, to express the transient
                part per sample. Defaults to `None` (not expressed).
        """
        from keras_memwatch.breakdown import memory_breakdown

        return memory_breakdown(self.model, self.to_dataframe(), batch_size)

    def plot(self, path: Optional[PathLike] = None, ax: Any = None) -> Any:
        """Draws memory over steps per device (needs matplotlib).

        Args:
            path: save the figure there (`.png`, `.svg`, ...). Defaults to
                `None`.
            ax: draw into this matplotlib `Axes`. Defaults to `None` (a new
                figure).

        Returns:
            The matplotlib `Figure`.
        """
        from keras_memwatch.plot import plot_memory

        return plot_memory(self.to_dataframe(), self.spikes, path=path, ax=ax)

    def summary(self, batch_size: Optional[int] = None) -> str:
        """A short report of the last fit: where the memory went (weights,
        optimizer state, a step's working memory), peak and typical memory
        per device, limit and headroom, spikes, drift, and what each source
        could and could not see.

        Args:
            batch_size: the training batch size, to give a step's working
                memory per sample. Defaults to `None`.
        """
        drift = self._monitor.drift_events if self._monitor else []
        return summarize(self.to_dataframe(), self.spikes, drift, self.sources,
                         breakdown=self.breakdown(batch_size))

    def guard(self, report_dir: Optional[PathLike] = None, last_n: int = 20) -> Any:
        """Guards a `fit` call: on out-of-memory, writes what was happening.

        A callback cannot catch the error that ends `fit`, so wrap the call:

        ```python
        with watch.guard():
            model.fit(x, y, callbacks=[watch])
        ```

        On an out-of-memory error (TensorFlow `ResourceExhaustedError`, JAX
        `RESOURCE_EXHAUSTED`, PyTorch `OutOfMemoryError`) it writes a text
        report (the last samples, the breakdown, the spikes, what the step
        tried to allocate) and the record as CSV next to `log_path` (or in
        `report_dir`), then re-raises the original exception unchanged.

        Args:
            report_dir: where to write the report. Defaults to `None`
                (beside `log_path`, else the working directory).
            last_n: samples shown in the report. Defaults to `20`.
        """
        from keras_memwatch.guard import oom_guard

        return oom_guard(self, report_dir, last_n=last_n)

    def close(self) -> None:
        """Ends a fit that raised: commits waiting samples, closes the
        probes and the streamed log. Keras skips `on_train_end` when `fit`
        raises; `guard()` calls this for you."""
        if self._training:
            with self._lock:
                self._flush()
                self._training = False
        self._close()

    def to_csv(self, path: PathLike) -> None:
        """Writes the record as CSV, readable by `keras_memwatch.load_log`."""
        self.to_dataframe().to_csv(path, index=False)

    def to_parquet(self, path: PathLike) -> None:
        """Writes the record as Parquet (needs `pip install pyarrow`)."""
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ImportError(
                "MemWatch.to_parquet needs pyarrow: pip install pyarrow "
                "(or pip install 'keras-memwatch[parquet]')") from None
        self.to_dataframe().to_parquet(path, index=False)


def _free_path(path: str, n: int) -> str:
    """`path` for the first fit; `stem.N.csv` with the next free N after."""
    stem, ext = os.path.splitext(path)
    while n and os.path.lexists(f"{stem}.{n}{ext}"):
        n += 1
    return f"{stem}.{n}{ext}" if n else path


def _add_metrics(logs: dict, peak: Optional[int], current: Optional[int]) -> None:
    if peak is not None:
        logs["mem_peak_mib"] = peak / MIB
    if current is not None:
        logs["mem_current_mib"] = current / MIB

