"""XLA's plans as a strategy (JAX): quick plans and plans as `fit` compiles
them, and a deadline that abandons what is still compiling. On the CPU the quick
plans are emulated with empty options (the same compilation)."""

from __future__ import annotations

import time

import keras
import numpy as np
import pytest

from capacity_helpers import BACKEND
from keras_memwatch.measure.batches import Batches
from keras_memwatch.measure.device import Device
from keras_memwatch.capacity.evidence import AIMED, PLAN

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="XLA's plans: JAX")


@pytest.fixture
def plans():
    from keras_memwatch.capacity.xla import Plans

    from keras_memwatch.measure.model_state import build_for_training

    model = keras.Sequential([keras.Input((32,)),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    data = Batches(np.zeros((8, 32), "float32"), np.zeros((8, 1), "float32"))
    build_for_training(model, data.take(1))  # as the estimate does
    device = Device("jax", "host")
    lines = []
    strategy = Plans(model, data, device, lines.append)
    strategy.aim_options = {}  # quick plans, as on a GPU (here: no options)
    strategy.lines = lines
    yield strategy
    device.close()


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
