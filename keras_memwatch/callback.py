"""MemWatch: the Keras callback. It only conducts: each call of `fit`,
`evaluate` or `predict` is a `CallSession` (probes, pipeline, judge, log,
hooks); the results are read from the calls' records."""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any, Callable, Optional

import keras
import pandas as pd

from keras_memwatch import options
from keras_memwatch.files import open_new, refuse_existing
from keras_memwatch.judge.derived import spike_table
from keras_memwatch.judge.events import SpikeEvent
from keras_memwatch.judge.step_plan import PLAN_SOURCE
from keras_memwatch.explain.report import summarize
from keras_memwatch.record.batch_shapes import BatchShapes
from keras_memwatch.record.csvlog import PathLike
from keras_memwatch.record.probes import resolve_probes
from keras_memwatch.record.recorder import concat_frames
from keras_memwatch.record.sampler import Row, Sampler
from keras_memwatch.session.call import CallRecord, CallSession
from keras_memwatch.session.faults import Faults
from keras_memwatch.session.settings import WatchSettings

logger = logging.getLogger("keras_memwatch")


def _option(name: str) -> property:
    """An option as a plain attribute, as Keras's callbacks keep theirs: a
    new value is checked as `MemWatch(name=value)` checks it, and applies
    from the next call."""

    def set_option(self: "MemWatch", value: Any) -> None:
        self.settings = self.settings.replaced(name, value)

    return property(lambda self: self.settings.option(name), set_option)


def _never_raises(hook: Callable) -> Callable:
    """Keeps a fault inside MemWatch from ending the user's training (the
    batch hooks, on the hot path, catch their own)."""

    @functools.wraps(hook)
    def guarded(self, *args, **kwargs):
        try:
            return hook(self, *args, **kwargs)
        except Exception as e:
            self._faults.report(hook.__name__, e)

    return guarded


class MemWatch(keras.callbacks.Callback):
    """Records memory at every batch and flags the batches that jump.

    Passed to `fit`, `evaluate` or `predict`, at the start of the call and
    at the end of every `every_n_batches`-th batch (training, validation,
    evaluation or prediction), MemWatch reads every available memory source
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
    rolling baseline of its phase (`train`, `test`, `predict`) is a spike:
    logged at WARNING, passed to `on_spike`, and listed in `spikes`.
    Sustained growth over an epoch of training is reported as drift.

    A `fit` starts a new record; each `evaluate` and `predict` call after it
    adds its rows, numbered by `call` (0 for the fit), `step` counting from
    0 in each. `copy.deepcopy(watch)` gives a watch with the same options
    that has recorded nothing (KerasTuner copies callbacks for each trial).
    The callback is `async_safe`: with the JAX and PyTorch backends its
    batch hook runs on Keras's worker threads and training stays
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
        log_path: stream rows to this new CSV file as training runs, one
            file per call (an existing file is never overwritten; a name
            already taken, by another process or job or an earlier call of
            the same instance, gives `name.1.csv`, `name.2.csv`, ...). When
            several processes train, each writes its own file:
            `name.rank{N}.csv`, or the path with `{rank}` replaced where it
            has one. Inside a KerasTuner trial, the trial's id goes in the
            name: `name.trial{ID}.csv`. Defaults to `None`.
        on_spike: callable receiving each `SpikeEvent`. It is called on the
            training thread at the start of the next batch (or at epoch
            end). Returning `True` stops the call after the batch in
            flight (as setting `model.stop_training`, `stop_evaluating` or
            `stop_predicting` does); any other return value is ignored. Its
            errors are logged, never raised. Defaults to `None`.
        add_to_logs: add `mem_peak_mib` and `mem_current_mib` (of the first
            GPU, or of the host without one) to the batch and epoch `logs`,
            so `History`, `CSVLogger` and the progress bar show them: the
            figures of the batch's row. Where batch hooks run on Keras's
            worker threads and a hook runs before an earlier batch's has
            read, it logs the latest known batch's figures instead, as
            `mem_peak_mib_prior_batch` and `mem_current_mib_prior_batch`.
            Defaults to `True`.
        allow_growth: apply `configure_memory` now. It only
            works before the framework has set up its devices, which is
            usually before the model is built: prefer calling
            `keras_memwatch.configure_memory` first thing in the script.
            Defaults to `None` (leave as is).
        memory_limit_mb: likewise. Defaults to `None` (leave as is).
        probes: `"auto"` (the active backend's allocator, NVML and the
            host), a probe name, or a list of names and `Probe` instances.
            Defaults to `"auto"`.
        verbose: `0` records silently; `1` logs alerts and the summary.
            Defaults to `1`.
        max_rows: keep only the newest `max_rows` samples of each call in
            memory (the streamed log stays complete), or all when `None`.
            Defaults to `None`.

    Attributes:
        settings: the checked options (`WatchSettings`); each option is
            also an attribute of its own (`watch.window`, ...), and setting
            one checks it and applies from the next call.
        log_paths: the files this watch streamed to, one per call.
        memory_config: what `allow_growth` / `memory_limit_mb` applied, or
            `None`.
        process, process_count, hostname: which process of how many wrote
            the record, and where.

    Raises:
        ValueError, TypeError: for a bad option, before training starts.
        FileExistsError: if `log_path` exists, for a single process and a
            path without `{rank}`.

    Example:

    ```python
    watch = MemWatch()
    model.fit(x, y, epochs=3, callbacks=[watch])
    model.predict(x_new, callbacks=[watch])
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
        self.async_safe = _asynchronous_steps()
        self.settings = WatchSettings.checked(
            every_n_batches, window, threshold, min_delta_mb, warmup, log_path,
            on_spike, add_to_logs, verbose, max_rows)
        self._probes_option = probes
        self._sampler = Sampler(resolve_probes(probes, keras.backend.backend()))
        self.memory_config = None
        if allow_growth is not None or memory_limit_mb is not None:
            from keras_memwatch.configure import configure_memory

            self.memory_config = configure_memory(
                allow_growth=allow_growth, memory_limit_mb=memory_limit_mb)
        self.log_paths: list[str] = []
        self.process, self.process_count, self.hostname = 0, 1, ""
        self._calls: list[CallRecord] = []  # the last fit and the calls since
        self._session: Optional[CallSession] = None  # the call being watched
        self._faults = Faults()
        self._shapes = BatchShapes()  # the input shapes a fit called the model with
        self._by_layer: Optional[pd.DataFrame] = None  # the last `by_layer()`

    every_n_batches = _option("every_n_batches")
    window = _option("window")
    threshold = _option("threshold")
    min_delta_mb = _option("min_delta_mb")
    warmup = _option("warmup")
    log_path = _option("log_path")
    on_spike = _option("on_spike")
    add_to_logs = _option("add_to_logs")
    verbose = _option("verbose")
    max_rows = _option("max_rows")

    # -- copies ------------------------------------------------------------

    def __deepcopy__(self, memo: dict) -> "MemWatch":
        """A new watch with the same options that has recorded nothing.

        Trial runners such as KerasTuner copy the callbacks for every trial.
        `on_spike` is shared (the same callable), probe instances given in
        `probes` are copied, and the memory settings of `allow_growth` and
        `memory_limit_mb` are not applied again. The copy streams to a file
        of its own: named after its KerasTuner trial, or the next free name.
        """
        probes = self._probes_option
        if not isinstance(probes, str):
            probes = [p if isinstance(p, str) else copy.deepcopy(p, memo)
                      for p in probes]
        twin = _rebuilt(type(self), self.settings, probes, self.memory_config)
        memo[id(self)] = twin
        return twin

    def __reduce__(self) -> tuple:
        """Pickles a watch that has recorded nothing (as its options);
        refuses one that has, saying what to do instead."""
        if self._calls or self._session is not None:
            raise TypeError(
                "Expected a MemWatch that has recorded nothing: its record, "
                "threads and open probes cannot be pickled. Received: a watch "
                f"that recorded {len(self._calls)} call(s). Pickle "
                "watch.to_dataframe() (or stream it with log_path=...) to send "
                "the record, and copy.deepcopy(watch) or a new MemWatch(...) to "
                "watch in another process.")
        return (_rebuilt, (type(self), self.settings, self._probes_option,
                           self.memory_config))

    # -- Keras hooks -------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._begin("train")

    def on_test_begin(self, logs=None):
        # Keras's validation inside a fit is the fit's.
        if not self._recording():
            self._begin("test")

    def on_predict_begin(self, logs=None):
        if not self._recording():
            self._begin("predict")

    def _begin(self, phase: str) -> None:
        """Starts watching a call: a fit starts a new record, `evaluate`
        and `predict` add to it."""
        self._close()
        self._faults.clear()
        if phase == "train":
            self._calls, self._by_layer = [], None
        session = CallSession(self, phase, len(self._calls), self.settings,
                              self._sampler, self._shapes, self.log_paths,
                              in_order=not self.async_safe, faults=self._faults)
        self.process, self.process_count = session.process, session.process_count
        self.hostname = session.hostname
        self._calls.append(session.record)
        self._session = session

    def on_epoch_begin(self, epoch, logs=None):
        if self._session is not None:
            self._session.begin_epoch(epoch)

    # The batch hooks of a call are built and installed by its session, in
    # front of these methods, which answer outside a call. They must exist:
    # Keras keeps a callback that is not `async_safe` on the training thread
    # only when it defines a batch-end hook.

    def on_train_batch_begin(self, batch, logs=None):
        """Nothing to do outside a fit."""

    def on_train_batch_end(self, batch, logs=None):
        """Nothing to do outside a fit."""

    def on_test_batch_begin(self, batch, logs=None):
        """Nothing to do outside a call."""

    def on_test_batch_end(self, batch, logs=None):
        """Nothing to do outside a call."""

    def on_predict_batch_begin(self, batch, logs=None):
        """Nothing to do outside a call."""

    def on_predict_batch_end(self, batch, logs=None):
        """Nothing to do outside a call."""

    @_never_raises
    def on_epoch_end(self, epoch, logs=None):
        if self._recording("train"):
            self._session.end_epoch(epoch, logs)

    @_never_raises
    def on_train_end(self, logs=None):
        if not self._recording("train"):
            return
        self._finish()
        if self.verbose and self._calls and self._calls[0].recorder.total_samples:
            logger.info("%s", self.summary())

    @_never_raises
    def on_test_end(self, logs=None):
        if self._recording("test"):
            self._finish()

    @_never_raises
    def on_predict_end(self, logs=None):
        if self._recording("predict"):
            self._finish()

    def _recording(self, phase: Optional[str] = None) -> bool:
        """Whether a call (of `phase`, where given) is being watched."""
        session = self._session
        return (session is not None and session.recording
                and (phase is None or session.phase == phase))

    def _finish(self) -> None:
        session, self._session = self._session, None
        session.finish()

    def _close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()

    # -- results -----------------------------------------------------------

    def to_dataframe(self) -> pd.DataFrame:
        """The record: one row per sample per device, of the last fit and
        of the `evaluate` and `predict` calls since (or of those calls
        alone, without a fit).

        Each call's rows carry its `call` number (0, 1, ...) and count
        `step` from 0; `phase` says `train`, `test` (validation inside a
        fit, or `evaluate`) or `predict`. Columns and dtypes are listed in
        the README; bytes are nullable integers (`Int64`), missing where a
        source cannot give a value.
        """
        if self._session is not None:
            self._session.drain()
        return concat_frames([c.recorder.to_dataframe() for c in self._calls])

    @property
    def spikes(self) -> pd.DataFrame:
        """The spike events of the record, one row each (with their
        `phase` and `call`)."""
        return spike_table([e for c in self._calls for e in c.monitor.events])

    @property
    def training(self) -> bool:
        """Whether a fit is running (its probes are open)."""
        return self._recording("train")

    @property
    def sources(self) -> dict[str, str]:
        """What each probe of the last call could see, or why it could not."""
        notes = dict(self._sampler.notes)
        fit = self._fit()
        if fit is not None and fit.planner is not None:
            quiet = {d: n for d, n in zip(fit.monitor.devices,
                                          fit.monitor.compiling) if n}
            notes[PLAN_SOURCE] = fit.planner.describe(quiet)
        elif fit is not None and fit.plan_note:
            notes[PLAN_SOURCE] = fit.plan_note
        return notes

    def _fit(self) -> Optional[CallRecord]:
        """The record's fit, or None."""
        first = self._calls[0] if self._calls else None
        return first if first is not None and first.phase == "train" else None

    def sample_now(self) -> dict[str, Row]:
        """Reads every probe now, during a call, without recording the sample.

        The peaks since the last recorded sample are read (and reset), so
        use it where the call is over anyway: `guard()` calls it on an
        out-of-memory error. Returns `{}` when no call is running.
        """
        if not self._recording():
            return {}
        return self._session.read_now()

    def breakdown(self, batch_size: Optional[int] = None) -> dict:
        """Where the memory went: weights, optimizer state and the
        transient part of a step, in bytes.

        Args:
            batch_size: the training batch size, to express the transient
                part per sample. Defaults to `None` (not expressed).
        """
        from keras_memwatch.explain.breakdown import memory_breakdown

        return memory_breakdown(self.model, self.to_dataframe(), batch_size)

    def by_layer(self, batch_size: Optional[int] = None,
                 expand_nested: bool = True) -> pd.DataFrame:
        """Splits the fit's step working memory over the model's layers.

        The table of `keras_memwatch.memory_by_layer`, for the first input
        shape the fit called the model with, its last row the rest of the
        working memory of a typical step that the record measured. No
        training step runs: PyTorch measures one forward pass at that shape,
        the other backends call the model symbolically. Where the fit saw
        larger inputs later, `attrs["grew"]` names the layer whose
        activations grew most. `summary()` shows the table's top layers
        once it is computed.

        Args:
            batch_size: the batch size to split. Defaults to `None`: the
                fit's first batch (needed where TensorFlow traced the step
                with an unknown batch size).
            expand_nested: rows for the layers of nested models. Defaults to
                `True`.

        Raises:
            ValueError: before a fit, or for a bad `batch_size`.
            TypeError: for arguments of the wrong type.
        """
        from keras_memwatch.explain.layers import memory_by_layer_of_fit

        if batch_size is not None:
            options.positive_int("batch_size", batch_size)
        options.boolean("expand_nested", expand_nested)
        self._by_layer = memory_by_layer_of_fit(
            self.model, self._shapes.seen if self._fit() else [], self.breakdown(),
            batch_size, expand_nested)
        return self._by_layer

    def plot(self, path: Optional[PathLike] = None, ax: Any = None,
             overwrite: bool = False) -> Any:
        """Draws memory over steps per device (needs matplotlib).

        Args:
            path: save the figure there (`.png`, `.svg`, ...). Defaults to
                `None`.
            ax: draw into this matplotlib `Axes`. Defaults to `None` (a new
                figure).
            overwrite: replace an existing file at `path`. Defaults to
                `False`.

        Returns:
            The matplotlib `Figure`.

        Raises:
            TypeError: for a `path` that is not a path, or an `overwrite`
                that is not a bool.
            FileExistsError: if `path` exists and `overwrite` is `False`,
                before anything is drawn.
        """
        from keras_memwatch.explain.plot import plot_memory

        refuse_existing(path, overwrite)
        return plot_memory(self.to_dataframe(), self.spikes, path=path, ax=ax)

    def summary(self, batch_size: Optional[int] = None) -> str:
        """A short report of the record: where the memory went (weights,
        optimizer state, a step's working memory, and where `by_layer()`
        has run, the layers that hold it), peak and typical memory
        per device, limit and headroom, spikes, for the training steps and
        apart for the test and predict batches; drift, and what each source
        could and could not see.

        Args:
            batch_size: the training batch size, to give a step's working
                memory per sample. Defaults to `None`.
        """
        fit = self._fit()
        drift = fit.monitor.drift_events if fit is not None else []
        rises = fit.monitor.rise_events if fit is not None else []
        return summarize(self.to_dataframe(), self.spikes, drift, self.sources,
                         breakdown=self.breakdown(batch_size), rises=rises,
                         by_layer=self._by_layer)

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
                (beside this process's log, else a new temporary folder,
                logged).
            last_n: samples shown in the report. Defaults to `20`.
        """
        from keras_memwatch.explain.guard import oom_guard

        return oom_guard(self, report_dir, last_n=last_n)

    def close(self) -> None:
        """Ends a fit that raised: commits waiting samples, closes the
        probes and the streamed log. Keras skips `on_train_end` when `fit`
        raises; `guard()` calls this for you."""
        if self._recording():
            self._finish()
        self._close()

    def to_csv(self, path: PathLike, overwrite: bool = False) -> None:
        """Writes the record as CSV, readable by `keras_memwatch.load_log`.

        Args:
            path: the file to write.
            overwrite: replace an existing file. Defaults to `False`.

        Raises:
            FileExistsError: if `path` exists and `overwrite` is `False`.
        """
        frame = self.to_dataframe()
        with open_new(path, overwrite) as f:
            frame.to_csv(f, index=False)

    def to_parquet(self, path: PathLike, overwrite: bool = False) -> None:
        """Writes the record as Parquet (needs `pip install pyarrow`).

        Args:
            path: the file to write.
            overwrite: replace an existing file. Defaults to `False`.

        Raises:
            FileExistsError: if `path` exists and `overwrite` is `False`.
            ImportError: without pyarrow.
        """
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ImportError(
                "MemWatch.to_parquet needs pyarrow: pip install pyarrow "
                "(or pip install 'keras-memwatch[parquet]')") from None
        frame = self.to_dataframe()
        with open_new(path, overwrite, binary=True) as f:
            frame.to_parquet(f, index=False)


def _asynchronous_steps() -> bool:
    """Whether batch hooks should leave the training thread (Keras's
    `async_safe`): yes where steps run asynchronously (a GPU, or JAX), no
    for PyTorch on the CPU, whose steps are synchronous anyway: there, hooks
    on worker threads would read memory while the next step runs, so a
    sample's peak would straddle two steps."""
    if keras.backend.backend() != "torch":
        return True
    import torch

    return bool(torch.cuda.is_available())


def _rebuilt(cls: type, settings: WatchSettings, probes: Any,
             memory_config: Any) -> MemWatch:
    """A watch copied or unpickled: its options, nothing recorded. Its
    `log_path` is not refused for existing: the log it wrote is one."""
    watch = cls(**dict(settings.as_options(), log_path=None), probes=probes)
    watch.settings, watch.memory_config = settings, memory_config
    return watch
