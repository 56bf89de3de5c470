"""On JAX, each training step's plan comes from XLA, once per input shape."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from conftest import FakeProbe
from keras_memwatch import MemWatch
from keras_memwatch.cli.demo import OversizedBatches
from keras_memwatch.judge.step_plan import StepPlanner

pytestmark = pytest.mark.skipif(keras.backend.backend() != "jax",
                                reason="XLA's plan is read on the JAX backend")

SMALL, LARGE, EVERY, BATCHES = 4, 64, 6, 18


def Oversized():
    """Batches of 4 images, and one of 64 every 6th."""
    return OversizedBatches(batches=BATCHES, batch_size=SMALL, oversized=LARGE,
                            every=EVERY, input_shape=(32, 32, 3), classes=10)


def convnet():
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    return model


def test_each_training_row_carries_its_steps_plan(memwatch_logs):
    model = convnet()
    original = model.train_function
    watch = MemWatch(verbose=0)
    model.fit(Oversized(), epochs=2, shuffle=False, callbacks=[watch], verbose=0)
    frame = watch.to_dataframe()
    steps = frame[(frame["phase"] == "train") & frame["batch"].notna()]
    plans = steps.set_index(["epoch", "batch"])["plan_bytes"]
    assert plans.notna().all()
    oversized = [b for b in range(BATCHES) if (b + 1) % EVERY == 0]
    large = plans[plans.index.get_level_values("batch").isin(oversized)]
    small = plans[~plans.index.get_level_values("batch").isin(oversized)]
    assert large.nunique() == 1 and small.nunique() == 1  # one plan per shape
    # Activations dominate: the plan grows about as the batch (16x).
    assert 8 < large.iloc[0] / small.iloc[0] <= 16
    assert frame.loc[frame["batch"].isna(), "plan_bytes"].isna().all()
    assert "xla plan: XLA's plan of each training step" in watch.summary()
    assert "2 input signature(s)" in watch.summary()
    assert model.train_function is original or original is None  # given back


def test_a_model_that_runs_eagerly_has_no_plan_and_says_why():
    model = convnet()
    model.compile(optimizer="adam", loss="mse", run_eagerly=True)
    watch = MemWatch(verbose=0)
    x = np.zeros((8, 32, 32, 3), "float32")
    model.fit(x, np.zeros((8, 10), "float32"), batch_size=4, callbacks=[watch],
              verbose=0)
    assert watch.to_dataframe()["plan_bytes"].isna().all()
    assert "not compiled by XLA" in watch.sources["xla plan"]


def test_a_plan_that_cannot_be_read_is_missing_with_one_warning(memwatch_logs,
                                                                 monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no analysis here")

    monkeypatch.setattr("keras_memwatch.judge.xla_plan.planned_bytes", broken)
    model = convnet()
    watch = MemWatch(verbose=0)
    model.fit(Oversized(), epochs=1, callbacks=[watch], verbose=0)
    assert watch.to_dataframe()["plan_bytes"].isna().all()
    assert len(watch.to_dataframe()) == (BATCHES + 1) * 1  # no row lost
    assert memwatch_logs.text.count("could not be read") == 1


def test_the_planner_gives_the_train_function_back():
    model = convnet()
    model.make_train_function()
    original = model.train_function
    planner = StepPlanner()
    assert planner.attach(model) is None
    assert model.train_function is not original
    assert planner.attach(model) is None  # again, as after a fit that raised
    planner.detach()
    assert model.train_function is original


def test_memory_that_xla_takes_to_compile_a_new_shape_is_not_a_spike(memwatch_logs):
    # A device the step does not run on (here a fake GPU beside JAX's CPU)
    # jumps at both oversized batches; only the first compiled a new shape.
    mib = 2**20
    oversized = [b for b in range(BATCHES) if (b + 1) % EVERY == 0]  # 5, 11, 17
    values = [(500 * mib, 500 * mib)] + [
        (500 * mib, (900 if b in oversized else 540) * mib) for b in range(BATCHES)]
    watch = MemWatch(probes=[FakeProbe(values), "host"], verbose=0)
    convnet().fit(Oversized(), epochs=1, shuffle=False, callbacks=[watch], verbose=0)
    flagged = watch.spikes.query("device == 'GPU:0'")["batch"].tolist()
    assert flagged == oversized[1:]  # batch 5 compiled the shape of 64
    assert "not judged while XLA compiled a new input shape" in watch.sources["xla plan"]


def test_an_execution_of_several_steps_carries_its_largest_plan():
    # Executions of 2 steps: (4, 4), (4, 64), (4, 4)...; the one holding an
    # oversized batch gets the oversized plan, and the last (one step) its own.
    model = convnet()
    model.compile(optimizer="adam", steps_per_execution=2,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    watch = MemWatch(verbose=0)
    model.fit(Oversized(), epochs=1, shuffle=False, callbacks=[watch], verbose=0)
    steps = watch.to_dataframe().query("phase == 'train' and batch == batch")
    plans = steps.set_index("batch")["plan_bytes"]
    assert plans.index.tolist() == list(range(1, BATCHES, 2))
    assert plans.notna().all()
    large = [b for b in plans.index if (b + 1) % EVERY == 0]
    assert plans[large].nunique() == 1 and plans.drop(large).nunique() == 1
    assert plans[large].iloc[0] > 8 * plans.drop(large).iloc[0]


def test_a_batch_whose_shapes_cannot_be_read_trains_without_a_plan(memwatch_logs,
                                                                   monkeypatch):
    def broken(data):
        raise TypeError("no leaves here")

    monkeypatch.setattr("jax.tree_util.tree_leaves", broken)
    model = convnet()
    watch = MemWatch(verbose=0)
    model.fit(Oversized(), epochs=1, callbacks=[watch], verbose=0)
    assert len(watch.to_dataframe()) == BATCHES + 1  # trained, no row lost
    assert watch.to_dataframe()["plan_bytes"].isna().all()
    assert memwatch_logs.text.count("could not be read") == 1
