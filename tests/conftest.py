"""Shared fixtures: fake probes, tiny models, and the GPU marker."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Optional

import numpy as np
import pytest

from keras_memwatch import columns as C
from keras_memwatch.probes.base import Probe


def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class FakeProbe(Probe):
    """A probe that replays scripted readings for one GPU device.

    Args:
        values: successive `(current, peak)` pairs; after the last, the last
            repeats. A value that is an exception instance is raised.
    """

    name = "fake"
    columns = (C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK, C.ALLOCATOR_LIMIT)
    peak_per_sample = True

    def __init__(self, values: Sequence, device: str = "GPU:0",
                 limit: Optional[int] = 16 * 2**30):
        self.values = list(values)
        self.device = device
        self.limit = limit
        self.calls = 0
        self.closed = 0

    def start(self) -> tuple[str, ...]:
        self.calls = 0
        return (self.device,)

    def read(self):
        value = self.values[min(self.calls, len(self.values) - 1)]
        self.calls += 1
        if isinstance(value, BaseException):
            raise value
        current, peak = value
        return ((current, peak, self.limit),)

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def fake_probe_cls():
    return FakeProbe


@pytest.fixture
def memwatch_logs(caplog) -> Iterator[pytest.LogCaptureFixture]:
    """Captures the keras_memwatch logger at INFO and above."""
    caplog.set_level(logging.INFO, logger="keras_memwatch")
    yield caplog


def tiny_model(inputs: int = 8, outputs: int = 1):
    import keras

    model = keras.Sequential([
        keras.Input((inputs,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(outputs),
    ])
    model.compile(optimizer="adam", loss="mse")
    return model


def tiny_data(n: int = 64, inputs: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, inputs)).astype("float32"),
            rng.normal(size=(n, 1)).astype("float32"))
