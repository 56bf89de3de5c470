"""MemWatch: the Keras callback. It only conducts: each call of `fit`,
`evaluate` or `predict` is a `CallSession` (probes, pipeline, judge, log,
hooks); the results are read from the watch's record (`WatchRecord`).

Longer than a room should be: each public method keeps its documentation
here, where users read it (and the API reference is built from it); every
method's work is one call into `session/`, `explain/` or `ways/`.
"""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any, Callable, Optional

import keras
import pandas as pd

from keras_memwatch import options
from keras_memwatch.configure.compilation_cache import use_compilation_cache
from keras_memwatch.files import refuse_existing
from keras_memwatch.judge.events import SpikeEvent
from keras_memwatch.explain.report import summarize
from keras_memwatch.record.batch_shapes import BatchShapes
from keras_memwatch.record.csvlog import PathLike
from keras_memwatch.record.probes import resolve_probes
from keras_memwatch.record.sampler import Row, Sampler
from keras_memwatch.record.exports import write_csv, write_parquet
from keras_memwatch.session.call import CallSession
from keras_memwatch.session.record import WatchRecord
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

    Passed to `fit`, `evaluate` or `predict`, MemWatch reads every available
    memory source (the framework's allocator, NVML, the host) at the start
    of the call and at the end of every `every_n_batches`-th batch, and
    keeps one row per device (columns: README, "What the columns mean"). A
    step whose working memory jumps above a rolling baseline of its phase is
    a spike: logged at WARNING, passed to `on_spike`, listed in `spikes`.
    Steady growth over training is reported as drift.

    A `fit` starts a new record; each `evaluate` and `predict` after it adds
    its rows, numbered by `call`. `copy.deepcopy(watch)` gives a watch with
    the same options that has recorded nothing. The callback is
    `async_safe`: with JAX and PyTorch, training stays asynchronous.

    Args:
        every_n_batches: sample every n-th batch. Defaults to `1`.
        window: samples in the rolling baseline. Defaults to `50`.
        threshold: a spike needs a working memory above `threshold` times
            the baseline... Defaults to `1.5`.
        min_delta_mb: ... and more than this many MiB above it. Defaults to
            `64`.
        warmup: first samples of a fit that are recorded, never judged.
            Defaults to `5`.
        log_path: stream rows to this new CSV file as training runs, one
            file per call. A file is never overwritten: a name already
            taken gives `name.1.csv`, ...; each process of several writes
            `name.rank{N}.csv` (or `{rank}` in the path is replaced), and a
            KerasTuner trial `name.trial{ID}.csv`. Defaults to `None`.
        on_spike: callable receiving each `SpikeEvent`, on the training
            thread at the next batch's start (or the epoch's end). Returning
            `True` stops the call after the batch in flight. Its errors are
            logged, never raised. Defaults to `None`.
        add_to_logs: add `mem_peak_mib` and `mem_current_mib` (of the first
            GPU, else the host) to the batch and epoch `logs` (`History`,
            `CSVLogger`, the progress bar). A hook on a worker thread that
            runs before an earlier batch's has read logs the latest known
            figures as `mem_peak_mib_prior_batch` and
            `mem_current_mib_prior_batch`. Defaults to `True`.
        allow_growth: apply `configure_memory` now (only before the
            framework has set up its devices: prefer calling
            `keras_memwatch.configure_memory` first). Defaults to `None`
            (leave as is).
        memory_limit_mb: likewise. Defaults to `None` (leave as is).
        compilation_cache: JAX: a directory for JAX's persistent compilation
            cache, or `True` for `~/.cache/keras_memwatch/jax`, so that a
            later process (an estimate, a `fit`) finds this one's
            compilations on disk. A cache the user set
            (`jax_compilation_cache_dir`, `JAX_COMPILATION_CACHE_DIR`)
            always wins. PyTorch, TensorFlow: accepted, does nothing.
            Defaults to `None` (none set).
        probes: `"auto"` (the backend's allocator, NVML and the host), a
            probe name, or a list of names and `keras_memwatch.Probe`
            instances. Defaults to `"auto"`.
        verbose: `0` records silently; `1` logs alerts and the summary.
            Defaults to `1`.
        max_rows: keep only the newest `max_rows` samples of each call in
            memory (the streamed log stays complete). Defaults to `None`
            (all).

    Attributes:
        settings: the checked options (`WatchSettings`); each option is
            also an attribute of its own (`watch.window`, ...), and setting
            one checks it and applies from the next call.
        log_paths: the files this watch streamed to, one per call.
        memory_config: what `allow_growth` / `memory_limit_mb` applied, or
            `None`.
        compilation_cache: the directory of JAX's persistent compilation
            cache that `compilation_cache` set, or `None`.
        ways: the table of the last `ways_to_fit()`, or `None`.
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
        compilation_cache: Any = None,
        probes: Any = "auto",
        verbose: int = 1,
        max_rows: Optional[int] = None,
    ):
        super().__init__()
        self.async_safe = _asynchronous_steps()
        self.settings = WatchSettings.checked(
            every_n_batches, window, threshold, min_delta_mb, warmup, log_path,
            on_spike, add_to_logs, verbose, max_rows)
        compilation_cache = options.cache_directory("compilation_cache",
                                                    compilation_cache)
        self._probes_option = probes
        self._sampler = Sampler(resolve_probes(probes, keras.backend.backend()))
        self.memory_config = None
        if allow_growth is not None or memory_limit_mb is not None:
            from keras_memwatch.configure import configure_memory

            self.memory_config = configure_memory(
                allow_growth=allow_growth, memory_limit_mb=memory_limit_mb)
        self.compilation_cache = use_compilation_cache(compilation_cache)
        self.log_paths: list[str] = []
        self.process, self.process_count, self.hostname = 0, 1, ""
        self._record = WatchRecord()  # the last fit and the calls since
        self._session: Optional[CallSession] = None  # the call being watched
        self._faults = Faults()
        self._shapes = BatchShapes()  # the input shapes a fit called the model with
        self._by_layer: Optional[pd.DataFrame] = None  # the last `by_layer()`
        self.ways: Optional[pd.DataFrame] = None  # the last `ways_to_fit()`

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
        twin = _rebuilt(type(self), self.settings, probes, self.memory_config,
                        self.compilation_cache)
        memo[id(self)] = twin
        return twin

    def __reduce__(self) -> tuple:
        """Pickles a watch that has recorded nothing (as its options);
        refuses one that has, saying what to do instead."""
        if self._record.calls or self._session is not None:
            raise TypeError(
                "Expected a MemWatch that has recorded nothing: its record, "
                "threads and open probes cannot be pickled. Received: a watch "
                f"that recorded {len(self._record.calls)} call(s). Pickle "
                "watch.to_dataframe() (or stream it with log_path=...) to send "
                "the record, and copy.deepcopy(watch) or a new MemWatch(...) to "
                "watch in another process.")
        return (_rebuilt, (type(self), self.settings, self._probes_option,
                           self.memory_config, self.compilation_cache))

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
            self._by_layer = None
        call = 0 if phase == "train" else len(self._record.calls)
        session = CallSession(self, phase, call, self.settings,
                              self._sampler, self._shapes, self.log_paths,
                              in_order=not self.async_safe, faults=self._faults)
        self.process, self.process_count = session.process, session.process_count
        self.hostname = session.hostname
        self._record.add(session.record)
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
        if self.verbose and self._record.fit and self._record.fit.recorder.total_samples:
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
        alone), each numbered by `call`, with `step` from 0 in each.
        Columns are listed in the README; bytes are nullable `Int64`."""
        if self._session is not None:
            self._session.drain()
        return self._record.to_dataframe()

    @property
    def spikes(self) -> pd.DataFrame:
        """The spike events of the record, one row each."""
        return self._record.spikes()

    @property
    def training(self) -> bool:
        """Whether a fit is running (its probes are open)."""
        return self._recording("train")

    @property
    def sources(self) -> dict[str, str]:
        """What each source of the last call could see, or why it could not."""
        return self._record.sources(self._sampler.notes)

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
                 expand_nested: bool = True,
                 expand_blocks: bool = False) -> pd.DataFrame:
        """Splits the fit's step working memory over the model's layers: the
        table of `keras_memwatch.memory_by_layer` at the fit's first input
        shape, its last row the rest of a typical step's working memory as
        the record measured it. No training step runs. Where the fit saw
        larger inputs later, `attrs["grew"]` names the layer whose
        activations grew most; `summary()` then shows the top layers.

        Args:
            batch_size: the batch size to split. Defaults to `None`: the
                fit's first batch (needed where TensorFlow traced the step
                with an unknown batch size).
            expand_nested: rows for the layers of nested models. Defaults to
                `True`.
            expand_blocks: open composite layers that are not models (a
                transformer block, `MultiHeadAttention`): their parts get
                rows of their own. Defaults to `False`.

        Raises:
            ValueError: before a fit, or for a bad `batch_size`.
            TypeError: for arguments of the wrong type.
        """
        from keras_memwatch.explain.layers import memory_by_layer_of_fit

        if batch_size is not None:
            options.positive_int("batch_size", batch_size)
        options.boolean("expand_nested", expand_nested)
        options.boolean("expand_blocks", expand_blocks)
        self._by_layer = memory_by_layer_of_fit(
            self.model, self._shapes.seen if self._record.fit else [], self.breakdown(),
            batch_size, expand_nested, expand_blocks)
        return self._by_layer

    def ways_to_fit(self, x: Any, y: Any = None, batch_size: Optional[int] = None,
                    **kwargs: Any) -> pd.DataFrame:
        """`keras_memwatch.ways_to_fit` of the model this watch trained: what
        each change would save at `batch_size`, measured. The table is kept
        in `ways`; `summary()`, `report_html()` and an out-of-memory report
        show it. The watch's `compilation_cache` is used unless `kwargs`
        names one.

        Raises:
            ValueError: before a fit, or for a bad argument.
        """
        from keras_memwatch.ways import ways_to_fit

        if self.model is None:
            raise ValueError("Expected a watch that has been used in `fit` (its "
                             "model is measured). Received: a watch without a "
                             "model; call keras_memwatch.ways_to_fit(model, ...)")
        kwargs.setdefault("compilation_cache", self.compilation_cache)
        self.ways = ways_to_fit(self.model, x, y, batch_size, **kwargs)
        return self.ways

    def plot(self, path: Optional[PathLike] = None, ax: Any = None,
             overwrite: bool = False) -> Any:
        """Draws memory over steps per device (needs matplotlib); returns the
        `Figure`.

        Args:
            path: save the figure there (`.png`, `.svg`, ...). Defaults to
                `None`.
            ax: draw into this matplotlib `Axes`. Defaults to `None`.
            overwrite: replace an existing file at `path`. Defaults to
                `False`.

        Raises:
            FileExistsError: if `path` exists and `overwrite` is `False`,
                before anything is drawn.
        """
        from keras_memwatch.explain.plot import plot_memory

        refuse_existing(path, overwrite)
        return plot_memory(self.to_dataframe(), self.spikes, path=path, ax=ax)

    def summary(self, batch_size: Optional[int] = None) -> str:
        """A short report of the record: where the memory went (weights,
        optimizer state, a step's working memory, the layers where
        `by_layer()` ran), peak and typical memory per device, limit and
        headroom, spikes per phase, drift, and what each source could see.

        Args:
            batch_size: the training batch size, to give a step's working
                memory per sample. Defaults to `None`.
        """
        drift, rises = self._record.drift()
        return summarize(self.to_dataframe(), self.spikes, drift, self.sources,
                         breakdown=self.breakdown(batch_size), rises=rises,
                         by_layer=self._by_layer, ways=self.ways)

    def report_html(self, path: PathLike, overwrite: bool = False, *,
                    capacity: Any = None, ways: Optional[pd.DataFrame] = None) -> str:
        """Writes one self-contained HTML page of the record (needs plotly:
        `pip install 'keras-memwatch[html]'`): each device's timeline with
        the spikes marked, each spike's alert and layer, where the memory
        went, the by-layer table once `by_layer()` has run, the summary, and
        the run's versions, options and sources. It opens offline.

        Args:
            path: the new file, ending in `.html`.
            overwrite: replace an existing file. Defaults to `False`.
            capacity: a `CapacityEstimate` of the model, shown with its
                evidence. Defaults to `None`.
            ways: a `ways_to_fit(...)` table of the model. Defaults to `None`:
                the watch's own, where `ways_to_fit()` ran.

        Returns:
            `path`, as a string.

        Raises:
            ImportError: without plotly.
            FileExistsError: if `path` exists and `overwrite` is `False`.
            ValueError: for a path that does not end in `.html` or lies in a
                missing folder, before anything is written.
        """
        from keras_memwatch.explain.html import write_watch_report

        return write_watch_report(self, path, by_layer=self._by_layer,
                                  capacity=capacity,
                                  ways=self.ways if ways is None else ways,
                                  overwrite=overwrite)

    def guard(self, report_dir: Optional[PathLike] = None, last_n: int = 20) -> Any:
        """Guards a `fit` call (`with watch.guard(): model.fit(...)`): on an
        out-of-memory error it writes what was happening next to `log_path`
        (see `keras_memwatch.oom_guard`) and re-raises the error unchanged.

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

        Raises:
            FileExistsError: if `path` exists and `overwrite` is `False`.
        """
        write_csv(self.to_dataframe(), path, overwrite)

    def to_parquet(self, path: PathLike, overwrite: bool = False) -> None:
        """Writes the record as Parquet (needs pyarrow).

        Raises:
            FileExistsError: if `path` exists and `overwrite` is `False`.
            ImportError: without pyarrow.
        """
        write_parquet(self.to_dataframe(), path, overwrite)


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


def _rebuilt(cls: type, settings: WatchSettings, probes: Any, memory_config: Any,
             compilation_cache: Optional[str] = None) -> MemWatch:
    """A watch copied or unpickled: its options, nothing recorded. Its
    `log_path` is not refused for existing: the log it wrote is one."""
    watch = cls(**dict(settings.as_options(), log_path=None), probes=probes,
                compilation_cache=compilation_cache)
    watch.settings, watch.memory_config = settings, memory_config
    return watch
