"""estimate_max_batch_size: the fit, the ladder on scripted readings, and
real estimates on the CPU (model state put back bit for bit)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_memwatch import capacity, xla_plan
from keras_memwatch import columns as C
from keras_memwatch.capacity import (
    LIMIT_ALLOCATOR,
    LIMIT_HOST,
    CapacityEstimate,
    estimate_max_batch_size,
    fit_linear,
    predict_batch_size,
)
from keras_memwatch.probes.base import Probe

MIB = 2**20
GIB = 2**30
BACKEND = keras.backend.backend()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the fit ---------------------------------------------------------------


def test_fit_recovers_static_and_per_sample_exactly():
    points = [(b, 300 * MIB + 7 * MIB * b) for b in (2, 4, 8, 16, 32)]
    fit = fit_linear(points)
    assert fit.linear and fit.reason is None
    assert fit.static_bytes == pytest.approx(300 * MIB, abs=1)
    assert fit.per_sample_bytes == pytest.approx(7 * MIB, rel=1e-12)
    assert fit.residual == pytest.approx(0, abs=1e-9)
    assert fit.r_squared == pytest.approx(1.0)
    assert fit.batch_sizes == (2, 4, 8, 16, 32)


def test_fit_refuses_quadratic_memory():
    points = [(b, MIB * b * b) for b in (2, 4, 8, 16, 32)]
    fit = fit_linear(points)
    assert not fit.linear
    assert "not linear" in fit.reason


def test_fit_drops_small_sizes_dominated_by_a_constant():
    # Gradients of the weights (20 MiB) hide the activations at small sizes.
    points = [(b, max(20 * MIB, 33_000 * b)) for b in (2, 16, 128, 1024, 2048, 4096)]
    fit = fit_linear(points)
    assert fit.linear
    assert fit.batch_sizes[0] >= 1024
    assert fit.per_sample_bytes == pytest.approx(33_000, rel=1e-6)


def test_fit_needs_three_sizes_and_growth():
    fit = fit_linear([(2, MIB), (4, 2 * MIB)])
    assert not fit.linear and "three" in fit.reason
    flat = fit_linear([(2, 50 * MIB), (4, 50 * MIB), (8, 50 * MIB)])
    assert not flat.linear and "does not grow" in flat.reason


def test_fit_averages_repeated_sizes():
    fit = fit_linear([(2, 10), (2, 14), (4, 22), (8, 42)])
    assert fit.batch_sizes == (2, 4, 8)
    assert fit.per_sample_bytes == pytest.approx(5.0)


def test_predict_batch_size_arithmetic():
    expected = (9 * GIB - GIB) // (8 * MIB)
    assert predict_batch_size(10 * GIB, 0.1, 1 * GIB, 8 * MIB) == expected
    assert predict_batch_size(GIB, 0.0, 2 * GIB, MIB) == 0
    with pytest.raises(ValueError):
        predict_batch_size(GIB, 0.0, 0, 0)


def test_result_object():
    estimate = CapacityEstimate(
        predicted_batch_size=1000, static_bytes=GIB, per_sample_bytes=8 * MIB,
        limit_bytes=10 * GIB, limit_source=LIMIT_ALLOCATOR,
        measurements=((2, 16 * MIB), (4, 32 * MIB), (8, 64 * MIB)), residual=0.0,
        explanation="one line", headroom=0.1, in_use_bytes=GIB, step_static_bytes=0,
        r_squared=1.0, fit_batch_sizes=(2, 4, 8), device="GPU:0", backend="jax",
        method="xla", measured_by="XLA memory plan")
    with pytest.raises(dataclasses.FrozenInstanceError):
        estimate.predicted_batch_size = 3
    assert estimate.batch_size_for(0.0) == (10 * GIB - GIB) // (8 * MIB)
    with pytest.raises(ValueError):
        estimate.batch_size_for(1.0)
    text = str(estimate)
    assert "Largest batch that fits: 1000" in text
    assert "GPU allocator limit" in text and "8.0 MiB" in text and "one line" in text
    as_dict = estimate.to_dict()
    assert as_dict["measurements"] == [[2, 16 * MIB], [4, 32 * MIB], [8, 64 * MIB]]
    assert json.loads(json.dumps(as_dict)) == as_dict
    frame = estimate.to_dataframe()
    assert frame["batch_size"].tolist() == [2, 4, 8]
    assert frame["fitted_bytes"].tolist() == [16 * MIB, 32 * MIB, 64 * MIB]
    assert frame["in_fit"].all()


# -- the ladder on scripted GPU readings -----------------------------------


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


@pytest.fixture
def simulated(monkeypatch):
    """Replaces the probes with a simulated GPU driven by train_on_batch."""
    made = {}

    def use(model, **kwargs):
        gpu = SimulatedGpu(**kwargs)
        made["gpu"] = gpu
        monkeypatch.setattr("keras_memwatch.probes.resolve_probes",
                            lambda spec, backend: [gpu])
        original = model.train_on_batch

        def train_on_batch(x, y=None, **kw):
            out = original(x, y, **kw)
            gpu.step(len(x))
            return out

        monkeypatch.setattr(model, "train_on_batch", train_on_batch)
        return gpu

    return use


def tiny(inputs=8):
    model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(4),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    return (model, rng.normal(size=(16, inputs)).astype("float32"),
            rng.normal(size=(16, 1)).astype("float32"))


def test_prediction_from_simulated_gpu_readings(simulated):
    model, x, y = tiny()
    gpu = simulated(model, name=BACKEND)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    assert estimate.device == "GPU:0"
    assert estimate.limit_bytes == 16 * GIB and estimate.limit_source == LIMIT_ALLOCATOR
    assert estimate.measurements == tuple(
        (b, 64 * MIB + 10 * MIB * b) for b in (2, 4, 8, 16))
    assert estimate.in_use_bytes == GIB
    assert estimate.static_bytes == GIB + 64 * MIB
    assert estimate.per_sample_bytes == pytest.approx(10 * MIB)
    expected = int((16 * GIB * 0.9 - GIB - 64 * MIB) // (10 * MIB))
    assert estimate.predicted_batch_size == expected
    assert estimate.batch_size_for(0.0) == int((15 * GIB - 64 * MIB) // (10 * MIB))
    assert "GPU allocator limit" in estimate.explanation
    assert f"Largest batch {expected}" in estimate.explanation
    # two steps per size, three for the first (the warm-up)
    assert gpu.batches == [2, 2, 4, 4, 8, 8, 16, 16]


def test_default_ladder_stays_far_below_the_limit(simulated):
    model, x, y = tiny()
    simulated(model, name=BACKEND, per_sample=20 * MIB)
    estimate = estimate_max_batch_size(model, x, y, method="probes")
    sizes = [b for b, _ in estimate.measurements]
    assert sizes == sorted(sizes) and sizes[0] == 2 and len(sizes) >= 4
    free = 16 * GIB * 0.9 - GIB
    largest = max(w for _, w in estimate.measurements)
    assert 0.05 * free <= largest <= 0.2 * free
    assert estimate.predicted_batch_size == int((free - 64 * MIB) // (20 * MIB))


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
    assert estimate.predicted_batch_size is not None
    assert gpu.batches[-1] == 16
    for v, saved in zip(model.variables, before):
        np.testing.assert_array_equal(v.numpy(), saved)


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA plan is JAX's")
def test_jax_on_a_gpu_uses_the_xla_plan_and_checks_its_answer(simulated, monkeypatch):
    model, x, y = tiny()
    simulated(model, name="jax", per_step=False)
    plans = []

    def working_bytes(model, batch, size):  # a plan that stays linear
        plans.append(size)
        return 100 * MIB + 5 * MIB * size

    monkeypatch.setattr(xla_plan, "working_bytes", working_bytes)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8))
    line = int((16 * GIB * 0.9 - GIB - 100 * MIB) // (5 * MIB))
    ceiling = int((16 * GIB - GIB - 100 * MIB) // (5 * MIB))
    assert estimate.method == "xla"
    assert estimate.measurements == ((2, 110 * MIB), (4, 120 * MIB), (8, 140 * MIB))
    assert estimate.static_bytes == GIB + 100 * MIB
    # Where the line is right, two compilations confirm each answer.
    assert estimate.predicted_batch_size == line
    assert estimate.ceiling_batch_size == ceiling == estimate.batch_size_for(0.0)
    assert plans == [2, 4, 8, line, line + line // 100, ceiling,
                     ceiling + ceiling // 100]
    assert [b for b, _ in estimate.checked] == plans[3:]
    assert "checked by compiling the step" in estimate.explanation
    assert f"Without headroom, up to batch {ceiling} fits" in estimate.explanation
    assert "recomputing" not in estimate.explanation


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA plan is JAX's")
def test_where_xla_recomputes_activations_more_fits_than_the_line_says(
        simulated, monkeypatch):
    model, x, y = tiny()
    simulated(model, name="jax", per_step=False)
    cliff = 4000  # XLA fits every plan in 14.5 GiB by recomputing, up to here

    def working_bytes(model, batch, size):
        line = 100 * MIB + 5 * MIB * size
        return min(line, int(14.5 * GIB)) if size <= cliff else line

    monkeypatch.setattr(xla_plan, "working_bytes", working_bytes)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8))
    room, full = 16 * GIB * 0.9 - GIB, 16 * GIB - GIB
    # With headroom, the line's answer stands: its plan is what the line says.
    assert estimate.predicted_batch_size == int((room - 100 * MIB) // (5 * MIB))
    ceiling = estimate.ceiling_batch_size
    assert cliff * 0.99 <= ceiling <= cliff
    need = dict(estimate.checked)
    assert need[ceiling] <= full
    assert all(need[b] > full for b in need if b > ceiling)
    assert len(estimate.checked) <= 2 * capacity._MAX_CHECKS
    assert "by recomputing activations" in estimate.explanation
    assert f"up to batch {ceiling} fits" in estimate.explanation
    assert f"ceiling:    batch {ceiling}" in str(estimate)
    assert "compiled:" in str(estimate)


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA plan is JAX's")
def test_a_failed_compilation_check_keeps_the_line_and_says_so(
        simulated, monkeypatch, memwatch_logs):
    model, x, y = tiny()
    simulated(model, name="jax", per_step=False)

    def working_bytes(model, batch, size):
        if size > 8:
            raise RuntimeError("compilation failed")
        return 100 * MIB + 5 * MIB * size

    monkeypatch.setattr(xla_plan, "working_bytes", working_bytes)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8))
    assert estimate.predicted_batch_size == estimate.batch_size_for(0.1) > 0
    assert estimate.ceiling_batch_size is None
    assert "Not checked by compiling the step (RuntimeError)" in estimate.explanation
    assert "could not be compiled" in memwatch_logs.text


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


def test_bad_arguments():
    model, x, y = tiny()
    with pytest.raises(ValueError, match="headroom"):
        estimate_max_batch_size(model, x, y, headroom=1.0)
    with pytest.raises(ValueError, match="trial_sizes"):
        estimate_max_batch_size(model, x, y, trial_sizes=(4, 4, 8))
    with pytest.raises(ValueError, match="method"):
        estimate_max_batch_size(model, x, y, method="guess")
    with pytest.raises(ValueError, match="device"):
        estimate_max_batch_size(model, x, y, device="tpu:0", trial_sizes=(2, 4, 8))
    with pytest.raises(ValueError, match="same"):
        estimate_max_batch_size(model, x, y[:3], trial_sizes=(2, 4, 8))
    uncompiled = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="compiled"):
        estimate_max_batch_size(uncompiled, x, y)


# -- real estimates on the CPU ---------------------------------------------


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


def test_real_estimate_on_the_cpu_keeps_the_model_bit_for_bit():
    model = conv_model()
    x, y = conv_data()
    model.train_on_batch(x[:8], y[:8])  # a model already trained a little
    before = state_of(model)
    grads = [getattr(v.value, "grad", None) for v in model.trainable_variables]
    iterations = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(16, 32, 64, 128))
    assert_same_state(before, state_of(model))
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == iterations
    assert estimate.device == "host" and estimate.limit_source == LIMIT_HOST
    assert [b for b, _ in estimate.measurements] == [16, 32, 64, 128]
    assert estimate.in_use_bytes > 50 * MIB
    assert "host available memory" in estimate.explanation
    assert "a CPU has no allocator limit" in estimate.explanation
    if estimate.predicted_batch_size is None:  # host RSS can be noisy
        assert "No prediction" in estimate.explanation
    else:
        # activations of two 32x32x16 conv layers: at least 100 KiB a sample
        assert estimate.per_sample_bytes > 100 * 1024
        assert estimate.predicted_batch_size > 128
    if BACKEND == "torch":  # the .grad tensors a step leaves are the user's again
        assert all(getattr(v.value, "grad", None) is g
                   for v, g in zip(model.trainable_variables, grads))


def test_training_after_an_estimate_equals_training_without():
    x, y = conv_data()
    estimated, untouched = conv_model(), conv_model()
    untouched.set_weights(estimated.get_weights())
    estimate_max_batch_size(estimated, x, y, trial_sizes=(4, 8, 16))
    for model in (estimated, untouched):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert_same_state(state_of(untouched), state_of(estimated), paths=False)


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's memory plan is JAX's")
def test_xla_memory_plan_is_exactly_linear_for_a_convnet():
    model = conv_model()
    x, y = conv_data()
    before = state_of(model) if model.optimizer.built else None
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(8, 16, 32),
                                       method="xla")
    assert estimate.method == "xla" and estimate.residual < 0.01
    # two conv activations (and their relu/grad buffers) of 32x32x16 floats
    assert estimate.per_sample_bytes > 2 * 32 * 32 * 16 * 4
    assert estimate.predicted_batch_size > 1000
    # checked against real compilations, each within the limit it was held to
    need = dict(estimate.checked)
    assert estimate.ceiling_batch_size >= estimate.predicted_batch_size
    assert need[estimate.ceiling_batch_size] <= (estimate.limit_bytes
                                                 - estimate.in_use_bytes)
    if before is not None:
        assert_same_state(before, state_of(model))


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


def test_module_imports_no_framework():
    code = ("import sys, keras_memwatch.capacity, keras_memwatch.fit_check, "
            "keras_memwatch.guard; "
            "print(sorted(m for m in ('keras', 'jax', 'torch', 'tensorflow') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


def test_package_exports_the_estimator():
    import keras_memwatch

    assert "estimate_max_batch_size" in keras_memwatch.__all__
    assert keras_memwatch.estimate_max_batch_size is estimate_max_batch_size
    assert keras_memwatch.CapacityEstimate is CapacityEstimate


def test_public_names():
    assert set(capacity.__all__) >= {"estimate_max_batch_size", "CapacityEstimate"}
