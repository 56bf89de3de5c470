"""The callbacks each arm of the comparison adds to `fit`.

- `memwatch`: `MemWatch()` with its defaults (async-safe).
- `sync`: a plain callback that reads the same probes as MemWatch in
  `on_train_batch_end`, without `async_safe`, so Keras runs it on the
  training thread and the JAX and PyTorch loops sync every step.
- `nvidia_smi`: the classic answer, `nvidia-smi --query-gpu=memory.used`
  run per batch (GPU machines only).
- `memory_stats`: the whole `torch.cuda.memory_stats()` dict read per batch,
  as PyTorch Lightning's `DeviceStatsMonitor` does (PyTorch on a GPU only).
- `stormlog`: Stormlog's tracker as its docs recommend: started before the
  loop, sampling on its own timer thread (`sampling_interval=0.5`), one
  `train` phase per epoch; it adds no batch hook.
- `none`, `none_b`: no callback (two names, for the A/A noise floor).

Also the instrumented MemWatch and the minimal hook of the hook-cost part.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

from benchmarks.common import import_keras, thread_ns


def backend_name() -> str:
    return import_keras().backend.backend()


def started_probes() -> list:
    """The probes `probes="auto"` picks for this backend, started; those
    unavailable here are left out, as MemWatch's sampler does."""
    from keras_memwatch.record.probes import ProbeUnavailable, resolve_probes

    probes = []
    for probe in resolve_probes("auto", backend_name()):
        try:
            probe.start()
        except ProbeUnavailable:
            continue
        probes.append(probe)
    return probes


def _close(probes: Sequence) -> None:
    for p in probes:
        try:
            p.close()
        except Exception:
            pass


# -- peers -----------------------------------------------------------------


def sync_reads_class():
    keras = import_keras()

    class SyncReads(keras.callbacks.Callback):
        """What most people write: read the statistics in a batch hook."""

        def on_train_begin(self, logs=None):
            self.probes = started_probes()
            self.rows: list = []

        def on_train_batch_end(self, batch, logs=None):
            self.rows.append([p.read() for p in self.probes])

        def on_train_end(self, logs=None):
            _close(self.probes)

    return SyncReads


def nvidia_smi_class():
    keras = import_keras()

    class NvidiaSmiPoll(keras.callbacks.Callback):
        """`nvidia-smi --query-gpu=memory.used` per batch."""

        def on_train_begin(self, logs=None):
            self.values: list = []

        def on_train_batch_end(self, batch, logs=None):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv"],
                capture_output=True, text=True)
            self.values.append(out.stdout)

    return NvidiaSmiPoll


def memory_stats_class():
    keras = import_keras()

    class TorchMemoryStats(keras.callbacks.Callback):
        """`torch.cuda.memory_stats()` per batch, as Lightning's
        `DeviceStatsMonitor` reads it."""

        def on_train_begin(self, logs=None):
            import torch

            self._stats = torch.cuda.memory_stats
            self.values: list = []

        def on_train_batch_end(self, batch, logs=None):
            self.values.append(self._stats())

    return TorchMemoryStats


def stormlog_available() -> Optional[str]:
    """None when Stormlog can be used here, else why not."""
    try:
        import stormlog  # noqa: F401
    except ImportError:
        return "not installed (pip install stormlog)"
    return None


def make_stormlog_tracker(gpu: bool, interval: float = 0.5) -> tuple[Any, Callable]:
    """The tracker Stormlog's docs use for this backend and device, and a
    function returning its samples as (unix time, bytes) pairs."""
    backend = backend_name()
    if gpu and backend == "torch":
        from stormlog import MemoryTracker

        tracker = MemoryTracker(device="cuda", sampling_interval=interval)
        kind = "stormlog.MemoryTracker(device='cuda')"
    elif gpu and backend == "jax":
        from stormlog.jax.tracker import MemoryTracker as JaxTracker

        tracker = JaxTracker(sampling_interval=interval, enable_logging=False)
        kind = "stormlog.jax.MemoryTracker"
    else:
        from stormlog import CPUMemoryTracker

        tracker = CPUMemoryTracker(sampling_interval=interval)
        kind = "stormlog.CPUMemoryTracker (RSS)"

    def samples() -> list[tuple[float, int]]:
        if hasattr(tracker, "_timestamps") and hasattr(tracker, "_memory_usage"):
            return [(float(t), int(m)) for t, m in
                    zip(list(tracker._timestamps), list(tracker._memory_usage))]
        out = []
        for e in list(getattr(tracker, "events", [])):
            if getattr(e, "event_type", None) == "sample" and (
                    e.memory_allocated is not None):
                out.append((float(e.timestamp), int(e.memory_allocated)))
        return out

    tracker.kind = kind
    return tracker, samples


def stormlog_class():
    keras = import_keras()

    class StormlogArm(keras.callbacks.Callback):
        """Stormlog's tracker around the fit, one `train` phase per epoch."""

        def __init__(self, gpu: bool, interval: float = 0.5):
            super().__init__()
            self.gpu, self.interval = gpu, interval
            self.tracker = None
            self.samples: list = []
            self.kind = ""

        def on_train_begin(self, logs=None):
            self.tracker, self._samples = make_stormlog_tracker(
                self.gpu, self.interval)
            self.kind = self.tracker.kind
            self.tracker.start_tracking()
            self._phase = None

        def on_epoch_begin(self, epoch, logs=None):
            self._phase = self.tracker.enter_phase(
                "train", metadata={"epoch": epoch})

        def on_epoch_end(self, epoch, logs=None):
            if self._phase is not None:
                self._phase.close()
                self._phase = None

        def on_train_end(self, logs=None):
            self.tracker.stop_tracking()
            self.samples = self._samples()

    return StormlogArm


# -- arms ------------------------------------------------------------------


def available_arms(gpu: bool) -> dict[str, Optional[str]]:
    """Every arm, with None when it runs here or the reason it does not."""
    backend = backend_name()
    smi = shutil.which("nvidia-smi")
    return {
        "none": None,
        "none_b": None,
        "noop": None,
        "reads": None,
        "memwatch": None,
        "memwatch_n10": None,
        **{name: None for name in ABLATIONS},
        "sync": None,
        "nvidia_smi": None if gpu and smi else (
            "GPU only" if not gpu else "nvidia-smi not found"),
        "memory_stats": None if gpu and backend == "torch" else (
            "PyTorch backend on a GPU only"),
        "stormlog": stormlog_available(),
    }


def make_arm(name: str, gpu: bool) -> list:
    """The callbacks of one arm, fresh for one fit."""
    if name in ("none", "none_b"):
        return []
    if name == "memwatch":
        from keras_memwatch import MemWatch

        return [MemWatch(verbose=0)]
    if name == "memwatch_n10":
        from keras_memwatch import MemWatch

        return [MemWatch(verbose=0, every_n_batches=10)]
    if name in ABLATIONS:
        return [ablated_memwatch_class()(name)]
    if name == "noop":
        return [noop_hook_class()()]
    if name == "reads":
        return [minimal_hook_class()()]
    if name == "sync":
        return [sync_reads_class()()]
    if name == "nvidia_smi":
        return [nvidia_smi_class()()]
    if name == "memory_stats":
        return [memory_stats_class()()]
    if name == "stormlog":
        return [stormlog_class()(gpu)]
    raise ValueError(f"unknown arm {name!r}")


#: MemWatch with one part taken away, to find where its cost goes.
ABLATIONS = {
    "memwatch_nologs": "no `mem_*_mib` in Keras's logs (add_to_logs=False)",
    "memwatch_noplan": "no XLA plans (the train function is not wrapped)",
    "memwatch_noproc": "samples read and handed over but never processed "
                       "(no rows, judging, recording or streaming)",
    "memwatch_nothread": "no pipeline thread: the training thread processes "
                         "a block once 64 samples wait",
}


def _with_patches(patches: Sequence, call: Callable, *args: Any) -> None:
    """Calls `call(*args)` with each of `patches` in place, then takes them
    off (the call's session is built with what they replace)."""
    for p in patches:
        p.start()
    try:
        call(*args)
    finally:
        for p in patches:
            p.stop()


def ablated_memwatch_class():
    """`MemWatch(verbose=0)` without one of the parts in `ABLATIONS`
    (diagnostic arms: their records are incomplete by design). Each part is
    switched off through a public option or by replacing a public name of
    the package while the call's session is built."""
    from unittest import mock

    from keras_memwatch import MemWatch
    from keras_memwatch.record.pipeline import Pipeline

    class Unprocessed(Pipeline):
        """Takes the reads and hands them to no consumer."""

        def __init__(self, sampler, consumers, *args, **kwargs):
            super().__init__(sampler, [], *args, **kwargs)

    def no_planner(model, on_batch=None):
        return None, "ablated", ()

    class AblatedMemWatch(MemWatch):
        def __init__(self, ablation: str):
            super().__init__(verbose=0,
                             add_to_logs=ablation != "memwatch_nologs")
            self.ablation = ablation

        def on_train_begin(self, logs=None):
            patches = {
                "memwatch_noplan": [mock.patch(
                    "keras_memwatch.session.call.attach_planner", no_planner)],
                "memwatch_nothread": [mock.patch.object(Pipeline, "start")],
                "memwatch_noproc": [mock.patch(
                    "keras_memwatch.session.call.Pipeline", Unprocessed)],
            }.get(self.ablation, [])
            _with_patches(patches, super().on_train_begin, logs)

    return AblatedMemWatch


# -- hook cost -------------------------------------------------------------


class _Timed:
    """Wraps a function, charging the thread CPU time of each call to
    `times`."""

    def __init__(self, function: Callable, times: list):
        self.function = function
        self.times = times

    def __call__(self, *args):
        t = thread_ns()
        out = self.function(*args)
        self.times.append(thread_ns() - t)
        return out


def _timed_hook(hook: Callable, times: list) -> Callable:
    """A batch hook that charges its thread CPU time to `times`."""

    def timed(batch, logs=None):
        t = thread_ns()
        hook(batch, logs)
        times.append(thread_ns() - t)

    return timed


def wrap_probe_reads(probes: Sequence, sink: dict[str, list]) -> None:
    for probe in probes:
        probe.read = _Timed(probe.read, sink.setdefault(probe.name, []))


def _timed_method(method: Callable, times: list) -> Callable:
    """A method that charges the thread CPU time of each call to `times`."""

    def timed(self, *args):
        t = thread_ns()
        out = method(self, *args)
        times.append(thread_ns() - t)
        return out

    return timed


def timed_memwatch_class():
    """MemWatch whose batch hooks charge their thread CPU time to lists."""
    from unittest import mock

    import keras

    from keras_memwatch import MemWatch
    from keras_memwatch.record.probes import resolve_probes
    from keras_memwatch.record.sampler import Sampler
    from keras_memwatch.session.logs_figures import LogsFigures

    class TimedMemWatch(MemWatch):
        """With `per_probe`, also times each probe's `read()` (`probe_ns`),
        and, within the batch-end hook, the sampler's read of them all and
        the logs figures (`part_ns`: "logs" works them out from the read,
        "logs_add" puts them in the batch's logs). The hooks are built
        around the timers: the public methods they call are replaced while
        the call's session is built."""

        def __init__(self, per_probe: bool = False, **kwargs):
            self.probe_ns: dict[str, list] = {}
            if per_probe:
                probes = resolve_probes(kwargs.pop("probes", "auto"),
                                        keras.backend.backend())
                wrap_probe_reads(probes, self.probe_ns)
                kwargs["probes"] = probes
            super().__init__(**kwargs)
            self.begin_ns: list[int] = []
            self.end_ns: list[int] = []
            self.part_ns: dict[str, list] = {"read": [], "logs": [], "logs_add": []}
            self.epoch_marks: list[tuple[int, int, int]] = []
            self.per_probe = per_probe

        def on_train_begin(self, logs=None):
            patches = []
            if self.per_probe:
                for cls, name, part in ((Sampler, "read", "read"),
                                        (LogsFigures, "figures_of", "logs"),
                                        (LogsFigures, "fill_batch", "logs_add")):
                    patches.append(mock.patch.object(cls, name, _timed_method(
                        getattr(cls, name), self.part_ns[part])))
            _with_patches(patches, super().on_train_begin, logs)
            hooks = vars(self)
            for name, times in (("on_train_batch_begin", self.begin_ns),
                                ("on_train_batch_end", self.end_ns)):
                hooks[name] = _timed_hook(hooks[name], times)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_marks.append((epoch, len(self.begin_ns), len(self.end_ns)))
            super().on_epoch_begin(epoch, logs)

    return TimedMemWatch


def noop_hook_class():
    """An async-safe batch-end hook that does nothing: what Keras's own
    dispatch of a callback costs."""
    keras = import_keras()

    class NoopHook(keras.callbacks.Callback):
        async_safe = True

        def on_train_batch_end(self, batch, logs=None):
            pass

    return NoopHook


def minimal_hook_class():
    """The least an async-safe hook can do: read the same probes."""
    keras = import_keras()

    class MinimalHook(keras.callbacks.Callback):
        """`end_ns` times the reads inside the hook; `begin_ns` and `call_ns`
        time the two hooks as `TimedMemWatch` times MemWatch's: around a call
        into the callback's own method (a no-op for the begin hook)."""

        async_safe = True

        def __init__(self, per_probe: bool = False):
            super().__init__()
            self.per_probe = per_probe
            self.end_ns: list[int] = []
            self.begin_ns: list[int] = []
            self.call_ns: list[int] = []
            self.probe_ns: dict[str, list] = {}
            self.epoch_marks: list[tuple[int, int]] = []

        def on_train_begin(self, logs=None):
            self.probes = started_probes()
            self.names = [p.name for p in self.probes]
            if self.per_probe:
                wrap_probe_reads(self.probes, self.probe_ns)
            self._reads = [p.read for p in self.probes if not p.min_interval_s]
            # Probes MemWatch reads at most every min_interval_s (NVML) are
            # read as often here, so both hooks do the same reads.
            self._timed = [[p.read, p.min_interval_s, 0.0]
                           for p in self.probes if p.min_interval_s]

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_marks.append((epoch, len(self.end_ns)))

        def on_train_batch_begin(self, batch, logs=None):
            t = thread_ns()
            super().on_train_batch_begin(batch, logs)
            self.begin_ns.append(thread_ns() - t)

        def on_train_batch_end(self, batch, logs=None):
            t = thread_ns()
            self._read_all()
            self.call_ns.append(thread_ns() - t)

        def _read_all(self):
            t = thread_ns()
            for read in self._reads:
                read()
            if self._timed:
                now = time.perf_counter()
                for timed in self._timed:
                    if now >= timed[2]:
                        timed[2] = now + timed[1]
                        timed[0]()
            self.end_ns.append(thread_ns() - t)

        def on_train_end(self, logs=None):
            _close(self.probes)

    return MinimalHook


def batch_clock_class():
    """Records the wall time at which each training batch begins (a begin
    hook never forces a sync)."""
    keras = import_keras()

    class BatchClock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.begins: list[tuple[int, float]] = []
            self.end = None

        def on_train_batch_begin(self, batch, logs=None):
            self.begins.append((batch, time.time()))

        def on_train_end(self, logs=None):
            self.end = time.time()

    return BatchClock
