"""The ladder: the sizes it tries, and where it stops."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from capacity_helpers import BACKEND, GIB, MIB, fake_plans, simulate_gpu, tiny
from keras_memwatch.capacity import estimate_max_batch_size
from keras_memwatch.capacity.ladder import (
    MAX_TRIALS,
    MIN_POINTS,
    SAFE_GPU,
    TARGET_GPU,
    next_size,
)


@pytest.fixture
def simulated(monkeypatch):
    """Puts a simulated GPU under a model (see `simulate_gpu`)."""
    return functools.partial(simulate_gpu, monkeypatch)


def test_default_ladder_on_a_gpu_climbs_to_a_quarter_of_the_limit(simulated):
    model, x, y = tiny()
    simulated(model, name=BACKEND, per_sample=20 * MIB)
    estimate = estimate_max_batch_size(model, x, y, method="probes")
    sizes = [b for b, _ in estimate.measurements]
    assert sizes == sorted(sizes) and sizes[0] == 2 and len(sizes) >= 4
    free = 16 * GIB * 0.9 - GIB
    largest = max(w for _, w in estimate.measurements)
    assert TARGET_GPU * free <= largest <= SAFE_GPU * free
    assert estimate.predicted_batch_size == int((free - 64 * MIB) // (20 * MIB))


def test_out_of_memory_in_the_ladder_stops_it_and_the_model_is_kept(simulated):
    model, x, y = tiny()
    gpu = simulated(model, name=BACKEND)
    before = [v.numpy().copy() for v in model.variables]
    stepper = model.train_on_batch

    class ResourceExhaustedError(RuntimeError):
        pass

    def failing(x, y=None, **kw):
        if len(x) >= 32:
            raise ResourceExhaustedError("OOM when allocating tensor")
        return stepper(x, y, **kw)

    model.train_on_batch = failing
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16, 32, 64),
                                       method="probes")
    assert [b for b, _ in estimate.measurements] == [2, 4, 8, 16]
    assert "batch 32 ran out of memory" in estimate.explanation
    # The line says far more, but the device said no at 32: the real steps
    # start below it (31 ran; 32 is known to fail), and the answer scaled by
    # what that showed trains.
    assert estimate.ceiling_batch_size == 31
    assert 0 < estimate.predicted_batch_size < 31
    assert gpu.batches[-4:] == [31, 31] + [estimate.predicted_batch_size] * 2
    assert "batch 31 ran, 32 ran out of memory" in estimate.explanation
    for v, saved in zip(model.variables, before):
        np.testing.assert_array_equal(v.numpy(), saved)


def test_default_ladder_on_a_tiny_model_terminates_and_explains():
    model, x, y = tiny()
    before_build = model.optimizer.built
    estimate = estimate_max_batch_size(model, x, y)
    sizes = [b for b, _ in estimate.measurements]
    assert sizes == sorted(sizes) and len(sizes) <= 12 and max(sizes) <= 2**16
    assert model.optimizer.built or before_build
    # A tiny model's steps hardly move the host's RSS: no trustworthy line.
    if estimate.predicted_batch_size is None:
        assert estimate.explanation.startswith("No prediction on host")


def test_next_size_without_a_limit_doubles_up_to_the_minimum():
    assert next_size(2, [], None, None, 1) == 4
    assert next_size(8, [], None, None, MIN_POINTS) is None


def test_next_size_stops_after_the_most_trials():
    assert next_size(2, [], MIB, 10 * GIB, MAX_TRIALS) is None


@pytest.fixture
def on_a_gpu(monkeypatch):
    """JAX's planner believes it compiles for a GPU."""
    from keras_memwatch.capacity import xla_compile

    monkeypatch.setattr(xla_compile, "_on_accelerator", lambda: True)


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA plan is JAX's")
def test_on_a_gpu_the_xla_ladder_compiles_every_size_and_trains_none(
        simulated, monkeypatch, on_a_gpu):
    model, x, y = tiny()
    gpu = simulated(model, name="jax", per_step=False)
    planned = fake_plans(monkeypatch, lambda size: 100 * MIB + 5 * MIB * size)
    estimate = estimate_max_batch_size(model, x, y)
    assert gpu.batches == []  # nothing ran: the state as built is in use
    assert estimate.in_use_bytes == GIB
    # the least default ladder in one round; these plans are large enough
    assert planned[:4] == [2, 3, 6, 16]
    assert [b for b, _ in estimate.measurements] == [2, 3, 6, 16]
    assert estimate.predicted_batch_size == int(
        (16 * GIB * 0.9 - GIB - 100 * MIB) // (5 * MIB))


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA plan is JAX's")
def test_on_a_gpu_small_plans_take_the_xla_ladder_higher(
        simulated, monkeypatch, on_a_gpu):
    model, x, y = tiny()
    simulated(model, name="jax", per_step=False)
    fake_plans(monkeypatch, lambda size: MIB + 64 * 1024 * size)
    estimate = estimate_max_batch_size(model, x, y)
    sizes = [b for b, _ in estimate.measurements]
    assert {2, 3, 6, 16} <= set(sizes) and max(sizes) > 16


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA plan is JAX's")
def test_on_a_gpu_without_the_xla_plan_the_ladder_trains_with_the_probes(
        simulated, monkeypatch, on_a_gpu, memwatch_logs):
    model, x, y = tiny()
    gpu = simulated(model, name="jax", per_step=False)

    def broken(size):
        raise AttributeError("Keras moved its train function")

    fake_plans(monkeypatch, broken)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16))
    assert estimate.method == "probes"
    assert gpu.batches[0] == 2 and estimate.per_sample_bytes == pytest.approx(10 * MIB)
    assert "XLA's memory plan of the train step is not available" in memwatch_logs.text
