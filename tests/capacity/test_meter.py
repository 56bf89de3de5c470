"""The meter: the device, the working memory of a step, the device's limit."""

from __future__ import annotations

import functools

import pytest

from capacity_helpers import BACKEND, GIB, MIB, SimulatedGpu, simulate_gpu, tiny
from keras_memwatch import columns as C
from keras_memwatch.judge import xla_plan
from keras_memwatch.capacity import LIMIT_NVML, estimate_max_batch_size
from keras_memwatch.capacity.meter import Meter
from keras_memwatch.record.probes.base import Probe


@pytest.fixture
def simulated(monkeypatch):
    """Puts a simulated GPU under a model (see `simulate_gpu`)."""
    return functools.partial(simulate_gpu, monkeypatch)


def test_high_water_mark_hides_sizes_below_an_earlier_peak(simulated):
    model, x, y = tiny()
    # The first step (building, compiling) peaks 1 GiB above any small step.
    simulated(model, name="not-the-backend", per_step=False, first_step_extra=GIB)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 64, 128, 256),
                                       method="probes")
    assert estimate.measured_by == "allocator high-water mark"
    assert [b for b, _ in estimate.measurements] == [2, 128, 256]
    assert "hidden under an earlier high-water mark" in estimate.explanation
    assert estimate.measurements[1:] == ((128, 64 * MIB + 1280 * MIB),
                                         (256, 64 * MIB + 2560 * MIB))


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA plan is JAX's")
def test_without_the_xla_plan_jax_falls_back_to_the_high_water_mark(
        simulated, monkeypatch, memwatch_logs):
    model, x, y = tiny()
    simulated(model, name="jax", per_step=False)

    def broken(model, batch, size):
        raise AttributeError("Keras moved its train function")

    monkeypatch.setattr(xla_plan, "working_bytes", broken)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16))
    assert estimate.method == "probes"
    assert estimate.measured_by == "allocator high-water mark"
    assert [b for b, _ in estimate.measurements] == [4, 8, 16]
    assert "hidden" in estimate.explanation
    assert estimate.per_sample_bytes == pytest.approx(10 * MIB)
    assert "XLA's memory plan of the train step is not available" in memwatch_logs.text


def test_no_limit_no_prediction(simulated):
    model, x, y = tiny()
    simulated(model, name=BACKEND, limit=None)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8),
                                       method="probes")
    assert estimate.predicted_batch_size is None
    assert "no memory limit" in estimate.explanation
    assert estimate.per_sample_bytes == pytest.approx(10 * MIB)


class SimulatedNvml(Probe):
    """NVML's reading of the simulated GPU: its total memory."""

    name = "nvml"
    columns = (C.NVML_USED, C.NVML_TOTAL)

    def start(self):
        return ("GPU:0",)

    def read(self):
        return ((GIB, 80 * GIB),)


def test_without_an_allocator_limit_the_limit_is_nvml_total(monkeypatch):
    gpu = SimulatedGpu(BACKEND, limit=None)
    monkeypatch.setattr("keras_memwatch.record.probes.resolve_probes",
                        lambda spec, backend: [gpu, SimulatedNvml()])
    meter = Meter(BACKEND, None, "probes")
    try:
        assert meter.device == "GPU:0"
        meter.set_baseline()
        limit, source, detail = meter.limit()
        assert (limit, source) == (80 * GIB, LIMIT_NVML)
        assert "total memory" in detail
    finally:
        meter.close()


def test_a_device_must_be_named_and_computed_on(monkeypatch):
    gpu = SimulatedGpu(BACKEND)
    monkeypatch.setattr("keras_memwatch.record.probes.resolve_probes",
                        lambda spec, backend: [gpu])
    with pytest.raises(ValueError, match="Expected `device` to be 'GPU:<i>' or "
                                         "'host'. Received: device='tpu:0'"):
        Meter(BACKEND, "tpu:0", "probes")
    with pytest.raises(ValueError, match="computes on"):
        Meter(BACKEND, "GPU:3", "probes")
    meter = Meter(BACKEND, "cuda:0", "probes")
    meter.close()
    assert meter.device == "GPU:0"
