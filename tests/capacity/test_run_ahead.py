"""Counting the batches a JAX `fit` holds ahead of its step, as measured."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from capacity_helpers import BACKEND, GIB, MIB
from keras_memwatch.judge import xla_plan
from keras_memwatch.capacity import CapacityEstimate, run_ahead
from keras_memwatch.capacity.batches import Batches
from keras_memwatch.capacity.result import LIMIT_ALLOCATOR

# Batch ends of real runs on an H200 (`benchmarks/in_flight.py --series`), one
# in 3: a ResNet at 495 (the device between steps reads about -98), and a
# block of two attention layers at 260, which mostly held none.
RESNET = ([1.0, -96.3, -98.3, 3.0, -97.3, 1.0, 1.0, 6.0, 7.0, 7.0, 7.0, 6.0, 7.0]
          + [6.0, 6.0, 7.0, 6.0, 6.0, 7.0, 6.0, 6.0, 6.0, 7.0, 6.0, 5.0, -96.3])
BLOCK = ([-75.1, -74.1, 2.0, -73.1, -73.1, 3.0, 4.0, 1.0, 1.0, -73.1, -72.1, 5.0]
         + [-69.1, 16.0, -62.1, -63.1, -62.1, 4.0, -62.1, -62.1, -64.1, -67.1])


def test_a_count_that_settles_is_counted_one_higher():
    assert run_ahead.settled_count(RESNET) == 8


def test_a_count_that_comes_in_bursts_is_not_counted():
    """A short run cannot bound a count that wanders (the block rose to 18 in
    1,000 steps): the plans keep `BATCHES_AHEAD`."""
    assert run_ahead.settled_count(BLOCK) is None


def test_too_few_batch_ends_say_nothing():
    assert run_ahead.settled_count([7.0, 7.0, 7.0]) is None


def test_batches_held_are_the_memory_beyond_the_state_and_the_plan():
    held = run_ahead.batches_held([110 * MIB, 170 * MIB, 40 * MIB], 10 * MIB,
                                  100 * MIB, 20 * MIB)
    assert held == [0.0, 3.0, -3.5]


class FakePlanner:
    def __init__(self, accelerator=True, per_sample=MIB):
        self.accelerator = accelerator
        self.batches_ahead = xla_plan.BATCHES_AHEAD
        self.per_sample = per_sample

    def ahead(self, size):
        return self.batches_ahead * self.per_sample * size if self.accelerator else 0

    def plan(self, size):
        return 10 * MIB * size


def estimate(predicted=400):
    return CapacityEstimate(
        predicted_batch_size=predicted, static_bytes=0, per_sample_bytes=11 * MIB,
        limit_bytes=6 * GIB, limit_source=LIMIT_ALLOCATOR, measurements=(),
        residual=0.0, explanation="Checked.", headroom=0.1, in_use_bytes=0,
        device="GPU:0", backend="jax", method="xla", measured_by="XLA plan")


def recheck(monkeypatch, held, planner=None, fails=None):
    """`run_ahead.recheck` with the steps' batch ends given; returns the
    estimate, the counts ahead each check saw, and the sizes measured."""
    planner = planner or FakePlanner()
    measured, checks = [], []

    runs = held if held and isinstance(held[0], list) else [held]

    def measure(model, data, size, plan, index):
        measured.append((size, plan, index))
        if fails:
            raise fails
        return runs[min(len(measured), len(runs)) - 1]

    def check(line):
        checks.append(planner.batches_ahead)
        return dataclasses.replace(line, predicted_batch_size=430,
                                   explanation="Checked again.")

    monkeypatch.setattr(run_ahead, "measure", measure)
    got = run_ahead.recheck(estimate(), estimate(), None, None, planner, check,
                            lambda line: None)
    return got, checks, measured


def test_a_settled_count_is_checked_again_with_the_plans_counting_it(monkeypatch):
    got, checks, measured = recheck(monkeypatch, RESNET)
    assert measured == [(400, 4000 * MIB, 0)]  # at the answer, its plan as fit's
    assert checks == [8]
    assert got.predicted_batch_size == 430 and got.batches_ahead == 8
    assert got.explanation == (
        "Checked again. A fit of batch 400 held at most 7 batches ahead of its "
        "step in 26 steps and stayed there, so the plans count 8 (one more), "
        "not 16.")


def test_a_count_in_bursts_twice_keeps_the_answer_and_says_why(monkeypatch):
    got, checks, measured = recheck(monkeypatch, BLOCK)
    assert len(measured) == 2 and checks == [] and got.predicted_batch_size == 400
    assert got.batches_ahead == 16
    assert got.explanation.endswith(
        "held at most 16 batches ahead of its step in 22 steps, in bursts (in 2 "
        "runs), which a short run cannot bound, so the plans count 16.")


def test_a_count_that_settles_only_in_a_second_run_is_counted(monkeypatch):
    # One ResNet run of five on an H200 did not settle in 96 steps.
    got, checks, measured = recheck(monkeypatch, [BLOCK, RESNET])
    assert len(measured) == 2 and checks == [8] and got.batches_ahead == 8
    assert "stayed there, so the plans count 8" in got.explanation


def test_no_steps_where_the_batches_ahead_are_too_small_to_matter(monkeypatch):
    """Token inputs: 16 batches ahead are a few MiB, nothing to measure."""
    got, checks, measured = recheck(monkeypatch, RESNET,
                                    planner=FakePlanner(per_sample=1024))
    assert measured == [] and checks == [] and got.batches_ahead == 16
    assert got.explanation == "Checked."


def test_no_steps_and_no_count_on_the_cpu(monkeypatch):
    got, _, measured = recheck(monkeypatch, RESNET,
                               planner=FakePlanner(accelerator=False))
    assert measured == [] and got.batches_ahead is None


def test_steps_that_fail_leave_the_answer_and_say_so(monkeypatch, caplog):
    got, checks, _ = recheck(monkeypatch, RESNET, fails=RuntimeError("driver gone"))
    assert checks == [] and got.predicted_batch_size == 400
    assert "the steps to measure them failed (RuntimeError)" in got.explanation
    assert "driver gone" in caplog.text


@pytest.mark.skipif(BACKEND != "jax", reason="the run-ahead is JAX's")
def test_the_steps_read_the_device_and_put_every_variable_back(monkeypatch):
    """`measure` trains real steps with `fit` (here on the CPU, whose JAX
    device reports no memory: a fake reads it) and restores the model."""
    import jax
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).standard_normal((8, 4)).astype("float32")
    y = np.arange(8, dtype="int32") % 3
    model.train_on_batch(x, y)
    before = [np.array(v) for v in model.variables + model.optimizer.variables]
    reads = iter(range(10 * MIB, 100 * MIB, MIB))

    class Device:
        def memory_stats(self):
            return {"bytes_in_use": next(reads)}

    monkeypatch.setattr(jax, "local_devices", lambda: [Device()])
    held = run_ahead.measure(model, Batches(x, y), 4, plan_bytes=0, steps=5)
    assert len(held) == 5 and held == sorted(held) and held[0] > 0
    after = [np.array(v) for v in model.variables + model.optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
