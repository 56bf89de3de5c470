"""Shared by the capacity tests: a simulated GPU, and small models and data.

Not a conftest.py: tests import these helpers by name (`from capacity_helpers
import ...`), which a second conftest module would shadow.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_memwatch import columns as C
from keras_memwatch.probes.base import Probe

MIB = 2**20
GIB = 2**30
BACKEND = keras.backend.backend()


class SimulatedGpu(Probe):
    """A GPU whose step peak is in_use + static + per_sample x batch."""

    columns = (C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK, C.ALLOCATOR_LIMIT)

    def __init__(self, name, per_step=True, in_use=GIB, static=64 * MIB,
                 per_sample=10 * MIB, limit=16 * GIB, first_step_extra=0):
        self.name = name
        self.peak_per_sample = per_step
        self.in_use, self.static, self.per_sample = in_use, static, per_sample
        self.limit, self.first_step_extra = limit, first_step_extra
        self.pending = None  # the peak of steps since the last read
        self.high_water = in_use
        self.batches = []

    def step(self, batch):
        peak = self.in_use + self.static + self.per_sample * batch
        if not self.batches:
            peak += self.first_step_extra
        self.batches.append(batch)
        self.pending = max(self.pending or 0, peak)
        self.high_water = max(self.high_water, peak)

    def start(self):
        return ("GPU:0",)

    def read(self):
        if self.peak_per_sample:
            peak = self.pending if self.pending is not None else self.in_use
            self.pending = None
        else:
            peak = self.high_water
        return ((self.in_use, peak, self.limit),)


def simulate_gpu(monkeypatch, model, **kwargs):
    """Replaces the probes with a simulated GPU driven by train_on_batch."""
    gpu = SimulatedGpu(**kwargs)
    monkeypatch.setattr("keras_memwatch.probes.resolve_probes",
                        lambda spec, backend: [gpu])
    original = model.train_on_batch

    def train_on_batch(x, y=None, **kw):
        out = original(x, y, **kw)
        gpu.step(len(x))
        return out

    monkeypatch.setattr(model, "train_on_batch", train_on_batch)
    return gpu


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
