"""Shared by the capacity tests: a simulated GPU, and small models and data.

Not a conftest.py: tests import these helpers by name (`from capacity_helpers
import ...`), which a second conftest module would shadow.
"""

from __future__ import annotations

import gc
import weakref

import keras
import numpy as np

from keras_memwatch import columns as C
from keras_memwatch.capacity.allocator import read_settings
from keras_memwatch.record.probes.base import Probe

MIB = 2**20
GIB = 2**30
BACKEND = keras.backend.backend()


class OutOfMemoryError(RuntimeError):
    """What the simulated GPU raises (recognised by its class name)."""


class SimulatedGpu(Probe):
    """A GPU whose step peak is in_use + static + per_sample x batch.

    A step whose reserved need, `in_use + overhead x (static + per_sample x
    batch)` (the caching allocator's rounding and fragmentation), exceeds
    the limit runs out of memory; with `expandable` on, the overhead is
    `expandable_overhead`. Steps after the first since the cache was freed
    need `later_overhead` times more (the caching allocator's fragmentation).
    Each step leaves `cyclic_per_sample x batch` bytes in a reference cycle
    (as Keras's PyTorch backend does), held until Python's garbage collector
    frees it, and counted in every later step's need until then.
    """

    columns = (C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK, C.ALLOCATOR_LIMIT)

    def __init__(self, name, per_step=True, in_use=GIB, static=64 * MIB,
                 per_sample=10 * MIB, limit=16 * GIB, first_step_extra=0,
                 overhead=1.0, expandable_overhead=None, oom_at=None,
                 later_overhead=1.0, cyclic_per_sample=0):
        self.name = name
        self.peak_per_sample = per_step
        self.in_use, self.static, self.per_sample = in_use, static, per_sample
        self.limit, self.first_step_extra = limit, first_step_extra
        self.overhead = overhead
        self.expandable_overhead = expandable_overhead
        self.expandable = False
        self.later_overhead = later_overhead
        self.steps_since_free = 0
        self.cyclic_per_sample = cyclic_per_sample
        self.cyclic = 0  # bytes that reference cycles hold now
        self.oom_at = limit if oom_at is None else oom_at  # None: never
        self.pending = None  # the peak of steps since the last read
        self.high_water = in_use
        self.reserved_peak = in_use
        self.batches = []
        self.ooms = []

    def working(self, batch):
        return self.static + self.per_sample * batch

    def reserved_need(self, batch):
        overhead = (self.expandable_overhead if self.expandable
                    and self.expandable_overhead is not None else self.overhead)
        if self.steps_since_free > 1:
            overhead *= self.later_overhead
        return self.in_use + self.cyclic + overhead * self.working(batch)

    def step(self, batch):
        self.steps_since_free += 1
        reserved = self.reserved_need(batch)
        if self.oom_at is not None and reserved > self.oom_at:
            self.ooms.append(batch)
            raise OutOfMemoryError(f"CUDA out of memory (batch {batch})")
        peak = self.in_use + self.working(batch)
        if not self.batches:
            peak += self.first_step_extra
        self.batches.append(batch)
        self._leave_cycle(self.cyclic_per_sample * batch)
        self.pending = max(self.pending or 0, peak)
        self.high_water = max(self.high_water, peak)
        self.reserved_peak = max(self.reserved_peak, int(reserved))

    def _leave_cycle(self, nbytes):
        if not nbytes:
            return
        cycle = {"bytes": nbytes}
        cycle["self"] = cycle
        self.cyclic += nbytes

        def freed():
            self.cyclic -= nbytes

        weakref.finalize(_Held(cycle), freed)

    def start(self):
        return ("GPU:0",)

    def read(self):
        if self.peak_per_sample:
            peak = self.pending if self.pending is not None else self.in_use
            self.pending = None
        else:
            peak = self.high_water
        return ((self.in_use, peak, self.limit),)


class _Held:
    """A weakly referenceable part of a reference cycle."""

    def __init__(self, cycle):
        cycle["held"] = self
        self.cycle = cycle


def simulate_gpu(monkeypatch, model, **kwargs):
    """Replaces the probes with a simulated GPU driven by train_on_batch."""
    gpu = SimulatedGpu(**kwargs)
    monkeypatch.setattr("keras_memwatch.record.probes.resolve_probes",
                        lambda spec, backend: [gpu])
    original = model.train_on_batch

    def train_on_batch(x, y=None, **kw):
        gpu.step(len(x))  # raises where the simulated GPU runs out of memory
        return original(x, y, **kw)

    monkeypatch.setattr(model, "train_on_batch", train_on_batch)
    return gpu


class FakeCache:
    """PyTorch's caching allocator of a simulated GPU (see `TorchCache`)."""

    index = 0

    def __init__(self, gpu, can_switch=True):
        self.gpu = gpu
        self.can_switch = can_switch
        self.calls = []
        self.free_bytes = 64 * GIB  # on the device, beside this process

    def device_free(self):
        return self.free_bytes

    def free(self):
        self.calls.append("free")
        gc.collect()  # as TorchCache.free does
        self.gpu.steps_since_free = 0

    def sync(self):
        pass

    def reset_peaks(self):
        self.gpu.reserved_peak = self.gpu.in_use

    def peaks(self):
        return (self.gpu.high_water, self.gpu.reserved_peak)

    def reserved(self):
        return self.gpu.in_use

    def allocated(self):
        return self.gpu.in_use + self.gpu.cyclic

    def set_expandable(self, on):
        self.calls.append(f"expandable:{on}")
        if not self.can_switch:
            return False
        self.gpu.expandable = on
        return True


class FakeFreshSteps:
    """New processes on a simulated GPU (see `FreshProcessSteps`): their two
    steps need `cold` times what they need in the measuring process."""

    def __init__(self, gpu, cold, trials, fail_after=None):
        self.gpu, self.cold, self.trials = gpu, cold, trials
        self.fail_after = fail_after  # runs before a child crashes
        self.sizes = []
        self.closed = False

    @classmethod
    def factory(cls, gpu, cold=1.0, unavailable="", fail_after=None):
        """A stand-in for the `FreshProcessSteps` class; `made` holds the
        runners it prepared."""
        made = []

        class Factory:
            @staticmethod
            def prepare(model, data, limit_bytes, device_index, trials, progress):
                if unavailable:
                    return None, unavailable
                made.append(cls(gpu, cold, trials, fail_after))
                return made[-1], ""

        Factory.made = made
        return Factory

    def run(self, size, purpose):
        from keras_memwatch.capacity.fresh_process import FreshProcessError
        from keras_memwatch.capacity.result import Trial

        if self.fail_after is not None and len(self.sizes) >= self.fail_after:
            raise FreshProcessError(f"batch {size}: the process exited 1 (crash)")
        self.sizes.append(size)
        gpu = self.gpu
        held = gpu.cyclic_per_sample * size  # the first step's, in the second
        need = gpu.in_use + held + (gpu.overhead * gpu.later_overhead * self.cold
                                    * gpu.working(size))
        ran = gpu.oom_at is None or need <= gpu.oom_at
        self.trials.append(Trial(size, ran, purpose, fresh_process=True,
                                 reserved_peak_bytes=int(need) if ran else None,
                                 cyclic_bytes=2 * held if ran else None))
        return ran

    def close(self):
        self.closed = True


def simulate_torch_gpu(monkeypatch, model, can_switch=True, environ=None,
                       fresh_cold=1.0, fresh_unavailable="", fresh_fail_after=None,
                       **kwargs):
    """A simulated GPU with PyTorch's caching allocator in front of it; new
    processes need `fresh_cold` times more (`gpu.fresh.made`: their runners)."""
    gpu = simulate_gpu(monkeypatch, model, **kwargs)
    gpu.fresh = FakeFreshSteps.factory(gpu, fresh_cold, fresh_unavailable,
                                       fresh_fail_after)
    monkeypatch.setattr("keras_memwatch.capacity.confirm.FreshProcessSteps",
                        gpu.fresh)
    cache = FakeCache(gpu, can_switch)
    monkeypatch.setattr("keras_memwatch.capacity.meter.torch_cache",
                        lambda backend, index: cache if index is not None else None)
    settings = read_settings(environ or {})
    monkeypatch.setattr("keras_memwatch.capacity.confirm.read_settings",
                        lambda: settings)
    return gpu, cache


def fake_plans(monkeypatch, working_bytes):
    """XLA's plans from `working_bytes(size)`, for the ladder and the checks.

    Returns:
        The sizes planned, in order.
    """
    from keras_memwatch.judge import xla_plan
    from keras_memwatch.capacity import xla_compile

    planned = []

    def one(model, batch, size, **options):
        planned.append(size)
        return working_bytes(size)

    def plans(self, sizes, aim=False):
        out = {}
        for size in sizes:
            planned.append(size)
            try:
                out[size] = working_bytes(size)
            except Exception as e:
                out[size] = e
            self._count(size, out[size], False)
        return out

    monkeypatch.setattr(xla_plan, "working_bytes", one)
    monkeypatch.setattr(xla_compile.Planner, "plans", plans)
    return planned


def tiny(inputs=8):
    model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(4),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    return (model, rng.normal(size=(16, inputs)).astype("float32"),
            rng.normal(size=(16, 1)).astype("float32"))


def state_of(model):
    variables = (list(model.variables) + list(model.optimizer.variables)
                 + list(model.metrics_variables))
    return [(v.path, np.array(keras.ops.convert_to_numpy(v.value)).copy())
            for v in variables]


def assert_same_state(before, after, paths=True):
    assert len(before) == len(after)
    if paths:
        assert [p for p, _ in before] == [p for p, _ in after]
    for (path, a), (_, b) in zip(before, after):
        assert a.dtype == b.dtype, path
        assert a.tobytes() == b.tobytes(), path


def conv_model():
    model = keras.Sequential([
        keras.Input((32, 32, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def conv_data(n=32):
    rng = np.random.default_rng(0)
    return (rng.random((n, 32, 32, 1), dtype=np.float32),
            rng.integers(0, 10, size=n).astype("int32"))
