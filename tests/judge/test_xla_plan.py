"""xla_plan: the search for the largest size that fits, and XLA's real plan
of Keras's JAX train step on the CPU."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_memwatch.judge import xla_plan
from keras_memwatch.judge.xla_plan import largest_that_fits

BACKEND = keras.backend.backend()


def counted(limit):
    calls = []

    def fits(size):
        calls.append(size)
        return size <= limit

    return fits, calls


def test_a_start_that_is_right_takes_two_checks():
    fits, calls = counted(500)
    assert largest_that_fits(fits, 500, max_checks=10) == (500, 505)
    assert calls == [500, 505]


def test_searches_up_when_more_fits_than_the_start():
    fits, _ = counted(1261)
    lo, hi = largest_that_fits(fits, 859, max_checks=10)
    assert lo <= 1261 < hi and hi - lo <= max(1, 0.01 * hi)


def test_a_start_just_too_large_takes_two_checks():
    fits, calls = counted(495)
    assert largest_that_fits(fits, 500, max_checks=10) == (495, 500)
    assert calls == [500, 495]


def test_searches_down_when_the_start_does_not_fit():
    fits, _ = counted(300)
    lo, hi = largest_that_fits(fits, 859, max_checks=12)
    assert lo <= 300 < hi and hi - lo <= max(1, 0.01 * hi)


def test_small_sizes_are_settled_to_one():
    fits, _ = counted(3)
    assert largest_that_fits(fits, 10, max_checks=20) == (3, 4)


def test_nothing_fits():
    fits, calls = counted(0)
    assert largest_that_fits(fits, 4, max_checks=20) == (None, 1)
    assert calls[-1] == 1


def test_never_checks_more_than_allowed():
    fits, calls = counted(10**9)
    lo, hi = largest_that_fits(fits, 100, max_checks=4)
    assert len(calls) == 4 and hi is None and lo == max(calls)
    fits, calls = counted(10)
    assert largest_that_fits(fits, 100, max_checks=1) == (None, 100)
    assert calls == [100]


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's plan of Keras's JAX train step")
def test_working_bytes_is_the_plan_less_the_state():
    model = keras.Sequential([keras.Input((32, 32, 3)),
                              keras.layers.Conv2D(8, 3, padding="same"),
                              keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(10)])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.zeros((2, 32, 32, 3), "float32")
    y = np.zeros((2,), "int32")
    model.train_on_batch(x, y)
    sample = (x[:1], y[:1])
    assert xla_plan.batch_bytes(sample, 64) == 64 * (32 * 32 * 3 * 4 + 4)
    sizes = (16, 32, 64)
    working = [xla_plan.working_bytes(model, sample, b) for b in sizes]
    # the sample itself and the conv's output (8 channels of 32x32 floats) at
    # least (on a GPU, also the batches a fit holds ahead)
    per_sample = (working[2] - working[1]) / 32
    assert per_sample > (32 * 32 * 3 * 4 + 4) + 32 * 32 * 8 * 4
    assert working[1] - working[0] == pytest.approx(16 * per_sample, rel=0.01)
    # compiling for a size no device could hold runs nothing and allocates nothing
    assert xla_plan.working_bytes(model, sample, 2**20) > 2**20 * per_sample * 0.99


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's plan of Keras's JAX train step")
def test_on_an_accelerator_the_batches_a_fit_holds_ahead_count(monkeypatch):
    import jax

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((2, 6), "float32"), np.zeros((2, 2), "float32")
    model.train_on_batch(x, y)
    on_cpu = xla_plan.lower_step(model, (x, y), 10)
    assert on_cpu[2] == 0  # Keras sends no batch ahead to the CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    _, state_bytes, ahead = xla_plan.lower_step(model, (x, y), 10)
    assert state_bytes == on_cpu[1]
    assert ahead == xla_plan.BATCHES_AHEAD * 10 * (6 + 2) * 4


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's plan of Keras's JAX train step")
@pytest.mark.parametrize("targets", [True, False])
def test_a_size_planned_is_the_program_fit_runs_so_fit_compiles_no_step_again(
        caplog, targets):
    """The estimate compiles the step at its answer so that `fit` there finds
    it in JAX's cache (on a GPU a compilation takes seconds): the plan's
    step must be `fit`'s own jitted function, given the batch packed as
    Keras packs it, on a model `fit` has not run yet."""
    import logging

    import jax

    from keras_memwatch.measure.batches import repeated

    class Unsupervised(keras.Sequential):  # a loss without targets
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                         training=True):
            return keras.ops.mean(y_pred ** 2)

    model = (keras.Sequential if targets else Unsupervised)(
        [keras.Input((6,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse" if targets else None)
    model.optimizer.build(model.trainable_variables)
    x = np.ones((1, 6), "float32")
    y = np.ones((1, 2), "float32") if targets else None
    xla_plan.working_bytes(model, (x, y), 12)

    def epoch(size):
        return repeated(np.repeat(x, size, axis=0),
                        None if y is None else np.repeat(y, size, axis=0), 3)

    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level(logging.WARNING):
            model.fit(epoch(12), epochs=1, verbose=0)
            model.fit(epoch(13), epochs=1, verbose=0)  # a size not planned
    finally:
        jax.config.update("jax_log_compiles", False)
    steps = [r.getMessage() for r in caplog.records
             if "Compiling" in r.getMessage() and "train_step" in r.getMessage()]
    assert len(steps) == 1 and "[13," in steps[0]
