"""XLA's plans as a strategy (JAX): quick plans and plans as `fit` compiles
them, and a deadline that abandons what is still compiling. On the CPU the quick
plans are emulated with empty options (the same compilation)."""

from __future__ import annotations

import re
import time

import keras
import numpy as np
import pytest

from capacity_helpers import BACKEND
from keras_memwatch.measure.batches import Batches
from keras_memwatch.measure.device import Device
from keras_memwatch.capacity.evidence import AIMED, PLAN

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="XLA's plans: JAX")


def _convnet():
    return keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(8, 3),
                             keras.layers.Conv2D(8, 3),
                             keras.layers.GlobalAveragePooling2D(),
                             keras.layers.Dense(1)])


def _batches(model):
    shape = tuple(model.inputs[0].shape[1:])
    return Batches(np.zeros((8, *shape), "float32"), np.zeros((8, 1), "float32"))


@pytest.fixture
def make_plans():
    """`Plans` of a compiled, built model, on the host."""
    from keras_memwatch.capacity.xla import Plans

    from keras_memwatch.measure.model_state import build_for_training

    devices = []

    def make(model, accelerator=False):
        model.compile(optimizer="adam", loss="mse")
        data = _batches(model)
        build_for_training(model, data.take(1))  # as the estimate does
        devices.append(Device("jax", "host"))
        lines = []
        strategy = Plans(model, data, devices[-1], lines.append)
        strategy.aim_options = {}  # quick plans, as on a GPU (here: no options)
        if accelerator:  # as on a GPU, where the first lowering is read
            strategy.accelerator, strategy.checks_in_turn = True, None
        strategy.lines = lines
        return strategy

    yield make
    for device in devices:
        device.close()


@pytest.fixture
def plans(make_plans):
    return make_plans(keras.Sequential([keras.Input((32,)),
                                        keras.layers.Dense(64, activation="relu"),
                                        keras.layers.Dense(1)]))


def test_compilations_not_done_by_the_deadline_are_abandoned(plans):
    plans.deadline = time.perf_counter()  # passed already
    began = time.perf_counter()
    assert plans.check([16, 32]) == []
    assert time.perf_counter() - began < 1.0
    assert "out of time" in plans.lines[-1]


def test_on_an_accelerator_the_need_counts_and_names_the_batches_held_ahead(plans):
    from keras_memwatch.judge import xla_plan
    from keras_memwatch.units import format_bytes

    assert plans.ahead(10) == 0 and "ahead" not in plans.words  # the host
    plans.accelerator = True
    per_batch = xla_plan.batch_bytes(plans.sample, 10)
    assert plans.ahead(10) == xla_plan.BATCHES_AHEAD * per_batch
    assert f"the {xla_plan.BATCHES_AHEAD} batches `fit` may hold ahead" in plans.words
    sample = format_bytes(xla_plan.batch_bytes(plans.sample, 1))
    assert plans.words.endswith(f"ahead of it, {sample} a sample each")


def test_each_compilation_says_when_it_began_after_the_tracing_before_it(plans):
    # sizes are traced one at a time; their compilations run side by side
    plans.ladder_width = 4
    assert len(plans.aim([8, 16, 32, 64])) == 4
    said = [re.search(r"batch (\d+) without autotuning: .* \((\S+) s; compiling "
                      r"began at (\S+) s\)$", line) for line in plans.lines]
    assert all(said) and sorted(int(m[1]) for m in said) == [8, 16, 32, 64]
    assert all(0.0 <= float(m[3]) <= float(m[2]) for m in said)


def test_the_search_on_plans_brackets_both_answers_as_on_a_gpu(plans):
    from keras_memwatch.capacity.brackets import bracketed
    from keras_memwatch.capacity.search import Search

    # a small device, whatever this process holds: 64 MiB of room
    plans.in_use, plans.limit = 64 * 2**20, 128 * 2**20
    plans.ladder_width = 4  # as on a GPU machine's cores
    search = Search(plans, on_gpu=True, host_largest=None)
    ev = search.run(0.1, None)
    assert bracketed(ev, 0.1) and bracketed(ev, 0.0), search.open
    kinds = [o.how for o in ev.observations]
    assert kinds[:4] == [AIMED] * 4  # the ladder: quick plans
    # the answers rest on plans as `fit` compiles them
    for h in (0.1, 0.0):
        b = ev.batch_size_for(h)
        assert any(o.how == PLAN and o.batch_size == b for o in ev.observations)


def test_a_step_of_convolutions_is_told_from_one_of_matrix_products(make_plans):
    from keras_memwatch.capacity.xla import mostly_convolutions

    def program(model):
        return make_plans(model)._lower(2)[0].as_text()

    assert mostly_convolutions(program(_convnet()))
    # a patch embedding (one convolution) before dense layers: matrix products
    patches = keras.Sequential([keras.Input((16, 16, 3)),
                                keras.layers.Conv2D(32, 4, strides=4),
                                keras.layers.Reshape((16, 32)),
                                keras.layers.Dense(64), keras.layers.Dense(64),
                                keras.layers.GlobalAveragePooling1D(),
                                keras.layers.Dense(1)])
    assert not mostly_convolutions(program(patches))


@pytest.mark.parametrize("convolutions", [False, True])
def test_on_an_accelerator_checks_compile_side_by_side_unless_convolutions_lead(
        make_plans, monkeypatch, convolutions):
    from keras_memwatch.capacity.xla import CHECKS_AT_ONCE, Plans

    model = _convnet() if convolutions else keras.Sequential(
        [keras.Input((32,)), keras.layers.Dense(64), keras.layers.Dense(1)])
    plans = make_plans(model, accelerator=True)
    plans.ladder([1, 2])  # the first lowering decides
    widths = []
    monkeypatch.setattr(Plans, "_run", lambda self, jobs, width: widths.append(width)
                        or [])
    plans.check([8, 9, 16, 17])
    assert plans.checks_in_turn is convolutions
    assert widths == [1 if convolutions else CHECKS_AT_ONCE]
    said = "the step is mostly convolutions: its checks compile one at a time"
    assert plans.lines[-1].endswith(said) is convolutions
