"""A variant's record read in the room it was measured in, on a fake GPU
under a cap whose true needs are known: the user's model stays in memory
beside each variant, as it does in `ways_to_fit`; a run of the variant
alone would not hold it."""

from __future__ import annotations

import contextlib
import dataclasses

import keras
import numpy as np
import pytest

from keras_memwatch.capacity.evidence import AIMED, PLAN, STEP, Observation
from keras_memwatch.variables import variable_bytes
from keras_memwatch.ways import measure, room, ways_to_fit
from keras_memwatch.ways.room import state_variables

KIB, MIB = 2**10, 2**20
BASE = 64 * MIB  # the runtime, in use apart from any model's state
WANTED = 256


#: What the allocator's peak reports of a step's true need (the cap bounds
#: the reserved bytes, rounded and fragmented; the peak counts allocated).
REPORTED = 0.75


def per_sample(model):
    """The fake step's true bytes a sample: half in bfloat16."""
    return 32 * KIB if model.layers[0].compute_dtype == "bfloat16" else 64 * KIB


class FakeGpu:
    """A GPU under a cap: every variable alive takes room, and so do the
    gradients PyTorch keeps from a model's last step (the user's, and a
    rebuilt model's own); a step of b needs `per_sample x b` beyond them.
    `widened` is what the cap was raised by."""

    def __init__(self, user_model, cap):
        self.user = user_model
        self.user_optimizer = user_model.optimizer
        self.cap = cap
        self.widened = 0
        #: bytes a variant's measuring process holds beyond the states
        #: (what an earlier variant left for the collector, say)
        self.left_over = 0

    def in_use(self, model):
        alive = (state_variables(self.user, self.user_optimizer)
                 + state_variables(model, model.optimizer))
        grads = room.gradient_bytes(self.user)  # 0 but on PyTorch
        extra = self.left_over if model.optimizer is not self.user_optimizer else 0
        return (BASE + variable_bytes(alive) + extra
                + grads * (1 if model is self.user else 2))

    def alone(self, model, setting_state):
        """The largest batch a run of the variant alone fits."""
        return (self.cap - BASE - setting_state) // per_sample(model)


class FakeSteps:
    how = STEP
    above_limit = True
    ladder_width = check_width = 1
    aims, deadline, checks_in_turn = False, None, False
    words = limit_words = "a fake GPU"
    build_left = (0, 0)  # Keras's build ran on the meta device

    def __init__(self, gpu, model):
        self.model = model
        self.in_use = gpu.in_use(model)
        self.limit = gpu.cap + gpu.widened
        self.need = per_sample(model)

    def _observe(self, b, ladder):
        ran = self.need * b <= self.limit - self.in_use
        return Observation(b, int(REPORTED * self.need * b) if ran else None, STEP,
                           ran=ran, ladder=ladder, seconds=0.003 * b,
                           step_seconds=0.001 * b if ran else None)

    def ladder(self, sizes):
        return [self._observe(b, True) for b in sizes]

    def check(self, sizes):
        return [self._observe(b, False) for b in sizes]


class FakeDevice:
    on_gpu = True
    name = "GPU:0"
    gpu_index = 0

    def __init__(self, backend, device):
        self.backend = backend

    def close(self):
        pass


def model_and_data():
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(256),
                              keras.layers.Dense(256), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    return model, rng.normal(size=(8, 256)).astype("float32"), \
        rng.normal(size=(8, 4)).astype("float32")


def on_fake_gpu(monkeypatch, cap_room, widens):
    """`ways_to_fit` with its strategies on a fake GPU whose cap leaves
    `cap_room` for steps of the model as it is; `widens`: whether the cap
    can be raised (PyTorch) or not (TensorFlow)."""
    model, x, y = model_and_data()
    keras.Model.fit(model, x, y, verbose=0)  # the optimizer built
    state = measure.state_bytes(model)
    gpu = FakeGpu(model, BASE + state + room.gradient_bytes(model) + cap_room)

    @contextlib.contextmanager
    def widened(backend, device, extra):
        extra = extra if widens else 0
        gpu.widened = extra
        try:
            yield extra
        finally:
            gpu.widened = 0

    monkeypatch.setattr(measure, "Device", FakeDevice)
    monkeypatch.setattr(measure, "strategy_for",
                        lambda m, data, dev, progress: FakeSteps(gpu, m))
    monkeypatch.setattr(room, "widened", widened)
    table = ways_to_fit(model, x, y, batch_size=WANTED, headroom=0.0,
                        levers=["mixed_precision", "sgd_momentum"],
                        combinations=False)
    return model, gpu, table


def test_step_times_compare_at_the_sizes_asked_for_the_wanted_batch(monkeypatch):
    """Near the cap an allocator frees its cache and retries, so a step there
    is slow by an amount of its own; each row's step time is read at the
    largest size it was asked for the wanted batch, not at its edge."""
    at_ease = FakeSteps._observe

    def observe(self, b, ladder):
        o = at_ease(self, b, ladder)
        return o if ladder or not o.ran else dataclasses.replace(
            o, step_seconds=o.step_seconds * (2 + b % 5))

    monkeypatch.setattr(FakeSteps, "_observe", observe)
    _, _, frame = on_fake_gpu(monkeypatch, 14 * MIB, widens=True)
    assert frame.set_index("lever").loc["sgd_momentum", "step_time_ratio"] == 1.0


def test_step_times_compare_at_the_largest_batch_both_rows_timed(monkeypatch):
    """A sample's time falls as the batch grows, and a row that fits more
    runs larger sizes: rows compare at the largest size both ran
    undisturbed, not each at its own largest."""
    at_ease = FakeSteps._observe

    def observe(self, b, ladder):
        o = at_ease(self, b, ladder)
        if not o.ran:
            return o
        # a sample costs less in larger batches; bfloat16 takes half the time
        half = per_sample(self.model) < 64 * KIB
        seconds = b * (0.5 if half else 1.0) * (1 + 64 / b) * 1e-3
        return dataclasses.replace(o, step_seconds=seconds)

    monkeypatch.setattr(FakeSteps, "_observe", observe)
    _, _, frame = on_fake_gpu(monkeypatch, 14 * MIB, widens=True)
    rows = frame.set_index("lever")
    assert rows.loc["as is", "largest_batch"] < WANTED
    assert rows.loc["mixed_precision", "largest_batch"] >= WANTED
    assert rows.loc["mixed_precision", "step_time_ratio"] == 0.5


def test_the_first_row_says_what_kerass_build_left_and_how_to_free_it(monkeypatch):
    """Where Keras's build for the first batch leaves arrays in reference
    cycles (PyTorch, a forward pass the meta device cannot run), the rows
    hold them, and the first row's notes name the callback that frees them."""
    _, _, plain = on_fake_gpu(monkeypatch, 14 * MIB, widens=True)
    assert plain.set_index("lever").loc["as is", "notes"] == "the model as compiled"
    monkeypatch.setattr(FakeSteps, "build_left", (16, 48 * MIB))
    _, _, frame = on_fake_gpu(monkeypatch, 14 * MIB, widens=True)
    notes = frame.set_index("lever").loc["as is", "notes"]
    assert "left 48.0 MiB at batch 16 in reference cycles" in notes
    assert "`keras_memwatch.CollectCycles()`" in notes and "(not measured)" in notes


@pytest.mark.parametrize("widens", [True, False], ids=["cap widened", "cap fixed"])
def test_each_row_reads_its_own_need_and_none_lies_above_the_variant_alone(
        monkeypatch, widens):
    # The model as it is fits 224 of the 256 wanted, and the line through
    # the peaks that ran puts 256 under the room: the steps' true need is
    # more than their peaks. bfloat16 steps need half.
    model, gpu, frame = on_fake_gpu(monkeypatch, 14 * MIB, widens)
    table = frame.set_index("lever")
    slot = variable_bytes(model.trainable_variables)
    state = measure.state_bytes(model)
    sgd_state = state - slot  # one slot less (and its counters)
    as_is, mixed, sgd = (table.loc[lever] for lever in
                         ("as is", "mixed_precision", "sgd_momentum"))
    # Each need is the variant's own: read where the room ran out, not the
    # room itself (which every row that ran out of memory shares).
    assert len({as_is["need_bytes"], mixed["need_bytes"], sgd["need_bytes"]}) == 3
    true = 64 * KIB * WANTED
    # (read where the record brackets the room's end, to 2%: at most that high)
    assert state + true <= as_is["need_bytes"] <= state + 1.03 * true
    assert not as_is["fits"] and "ran out of memory" in as_is["how"]
    assert bool(mixed["fits"]) and mixed["how"] == "measured"
    assert mixed["need_bytes"] == state + int(REPORTED * 32 * KIB * WANTED)
    assert true - 64 <= sgd["need_bytes"] - sgd_state <= 1.03 * true + 64
    # The largest batch: never above what the variant alone fits; with the
    # cap widened by the user's state held beside it, within 3% of it.
    # (the gradients the user's last step left are off the device while
    # `ways_to_fit` measures: `ModelState` holds them on the host)
    space = gpu.cap - BASE
    truths = {"as is": (space - state) // (64 * KIB),
              "mixed_precision": (space - state) // (32 * KIB),
              "sgd_momentum": (space - sgd_state) // (64 * KIB)}
    for lever, truth in truths.items():
        largest = table.loc[lever, "largest_batch"]
        assert largest <= truth, (lever, largest, truth)
        if widens or lever == "as is":
            assert largest >= 0.97 * truth, (lever, largest, truth)
    held = state  # beside the rebuilt model
    assert frame.attrs["held_bytes"]["mixed_precision"] == (
        held, held if widens else 0)
    assert frame.attrs["held_bytes"]["as is"] == (0, 0)
    if not widens:  # read in the room its steps met: the user's state beside
        assert table.loc["mixed_precision", "largest_batch"] <= (
            space - state - held) // (32 * KIB)


class FakePlans:
    """XLA's plans on a fake GPU (JAX): a plan grows with the batch up to
    `KNEE`, where XLA starts recomputing activations, and a quarter as fast
    beyond; the quick plans (`aim`) read 10% high. Compiling a size that
    does not fit is harmless."""

    how = PLAN
    above_limit = True
    aims, deadline, checks_in_turn = True, None, False
    ladder_width, check_width = 8, 4
    words = limit_words = "a fake GPU"
    KNEE = 128

    def __init__(self, gpu, model):
        self.in_use = gpu.in_use(model)
        self.limit = gpu.cap
        self.need = per_sample(model)
        self.step = f"{type(model.optimizer).__name__} on {self.need} bytes a sample"
        self.checked: list[int] = []

    def plan(self, b):
        return self.need * (min(b, self.KNEE) + max(b - self.KNEE, 0) // 4)

    def ladder(self, sizes):
        return [Observation(b, int(1.1 * self.plan(b)), AIMED, ladder=True)
                for b in sizes]

    def aim(self, sizes):
        return [Observation(b, int(1.1 * self.plan(b)), AIMED) for b in sizes]

    def check(self, sizes):
        self.checked += sizes
        return [Observation(b, self.plan(b), PLAN) for b in sizes]

    def fingerprint(self, **more):
        from keras_memwatch.capacity import stored_record

        return stored_record.fingerprint(self.step, self.limit, **more)


def on_fake_jax_gpu(monkeypatch, space_samples=153):
    """A model, its data, a fake GPU whose cap leaves room for
    `space_samples` samples of the model as it is (XLA recomputing
    beyond `FakePlans.KNEE`), and the list of `FakePlans` each row gets;
    `ways_to_fit`'s strategies on it."""
    model, x, y = model_and_data()
    keras.Model.fit(model, x, y, verbose=0)
    gpu = FakeGpu(model, BASE + measure.state_bytes(model)
                  + space_samples * 64 * KIB)
    strategies = []

    def plans(m, data, dev, progress):
        strategies.append(FakePlans(gpu, m))
        return strategies[-1]

    monkeypatch.setattr(measure, "Device", FakeDevice)
    monkeypatch.setattr(measure, "strategy_for", plans)
    monkeypatch.setattr(room, "widened", lambda *a: contextlib.nullcontext(0))
    return model, x, y, gpu, strategies


def test_on_jax_with_a_gpu_each_row_brackets_its_largest_batch(monkeypatch):
    # Where XLA recomputes, the plans at the wanted batch and half of it do
    # not say where the room ends: the estimate's aims and checks bracket
    # it, in the room of the variant alone.
    model, x, y, gpu, strategies = on_fake_jax_gpu(monkeypatch)
    state = measure.state_bytes(model)
    table = ways_to_fit(model, x, y, batch_size=WANTED, headroom=0.0,
                        levers=["mixed_precision", "sgd_momentum"],
                        combinations=False).set_index("lever")
    space = gpu.cap - BASE
    slot = variable_bytes(model.trainable_variables)
    for lever, state_, need in (("as is", state, 64 * KIB),
                                ("mixed_precision", state, 32 * KIB),
                                ("sgd_momentum", state - slot, 64 * KIB)):
        fake = FakePlans(gpu, model)
        fake.need = need
        truth = max(b for b in range(1, 4 * WANTED)
                    if fake.plan(b) <= space - state_)
        largest = table.loc[lever, "largest_batch"]
        assert 0.97 * truth <= largest <= truth, (lever, largest, truth)
    # the wanted batch's plan and half of it alone would say 128 as it is
    assert table.loc["as is", "largest_batch"] > FakePlans.KNEE
    assert all(len(s.checked) > 2 for s in strategies)


def test_a_planned_row_is_searched_in_the_room_its_table_reads(monkeypatch):
    # Plans run nothing: a row is read as if its variant trained alone
    # (what the process held apart from any model's state when the model
    # as it is was measured, plus the variant's own state). Its checks
    # bracket its answer in that room, not in what the process holds
    # while the variant is measured (GPT-2 base's SGD row on an H100 was
    # checked below where the model as it is fit).
    model, x, y, gpu, strategies = on_fake_jax_gpu(monkeypatch)
    gpu.left_over = 20 * 64 * KIB  # 13% of the room
    table = ways_to_fit(model, x, y, batch_size=WANTED, headroom=0.0,
                        levers=["sgd_momentum"],
                        combinations=False).set_index("lever")
    fake = FakePlans(gpu, model)
    space = gpu.cap - BASE - (measure.state_bytes(model)
                              - variable_bytes(model.trainable_variables))
    truth = max(b for b in range(1, 4 * WANTED) if fake.plan(b) <= space)
    largest = table.loc["sgd_momentum", "largest_batch"]
    assert 0.97 * truth <= largest <= truth
    checked = strategies[-1].checked
    assert largest in checked
    assert any(largest < b <= largest * 1.02 + 1 for b in checked), checked


def test_rows_kept_beside_the_compilation_cache_are_read_back_not_compiled(
        monkeypatch, tmp_path):
    from keras_memwatch.capacity import stored_record
    from keras_memwatch.ways import run

    model, x, y, gpu, strategies = on_fake_jax_gpu(monkeypatch)
    # the directory JAX's cache would use (JAX itself is not needed here)
    monkeypatch.setattr(run, "use_compilation_cache", lambda value: value)

    def ways():
        return ways_to_fit(model, x, y, batch_size=WANTED, headroom=0.0,
                           levers=["mixed_precision", "sgd_momentum"],
                           combinations=False, compilation_cache=str(tmp_path))

    first = ways()
    assert all(s.checked for s in strategies)
    # one record a row: each variant is another step
    assert len(list((tmp_path / stored_record.FOLDER).glob("*.json"))) == 3
    strategies.clear()
    second = ways()
    assert len(strategies) == 3 and not any(s.checked for s in strategies)
    columns = ["lever", "need_bytes", "largest_batch", "fits"]
    assert second[columns].equals(first[columns])
    assert second.attrs["compilation_cache"] == str(tmp_path)


def test_a_row_whose_search_runs_out_of_time_says_what_is_left_open(monkeypatch):
    model, x, y, gpu, strategies = on_fake_jax_gpu(monkeypatch)
    table = ways_to_fit(model, x, y, batch_size=WANTED, headroom=0.0,
                        levers=["sgd_momentum"], combinations=False,
                        max_seconds=1e-6).set_index("lever")
    # the plans at the wanted batch and half of it are made whatever the
    # time; the search that would bracket the largest batch asks nothing
    assert sorted(strategies[0].checked) == [WANTED // 2, WANTED]
    how = table.loc["as is", "how"]
    assert how.startswith("plan; out of time (max_seconds) after "), how
    assert "the answer under 0% headroom is not bracketed" in how
    assert table.loc["sgd_momentum", "how"].startswith(
        "not measured: out of time (max_seconds=1e-06)")
    assert len(strategies) == 1


def test_a_quick_plan_at_the_wanted_batch_never_gives_its_need():
    # Quick plans only aim: the need at the wanted batch is the plan as
    # `fit` compiles it, even where a quick plan of that size reads more.
    m = measure.Measured((Observation(128, 10 * MIB, PLAN, ladder=True),
                          Observation(256, 20 * MIB, PLAN, ladder=True),
                          Observation(256, 30 * MIB, AIMED)),
                         state_bytes=0, in_use_bytes=BASE, limit_bytes=None,
                         limit_words="", device_batch=256,
                         sample_seconds={}, how=measure.PLANNED)
    assert m.step_bytes(m.evidence(BASE, None)) == (20 * MIB, measure.PLANNED)


def test_a_planned_size_whose_steps_run_out_of_memory_gives_no_time(monkeypatch):
    """A plan that fits the room is no promise that its steps do: where
    they run out of memory, the row has no step time, and no error."""
    from conftest import framework_oom, tiny_data, tiny_model
    from keras_memwatch.measure.batches import Batches

    model = tiny_model()
    model.compile(optimizer="adam", loss="mse")
    x, y = tiny_data()

    def fit_steps(*args):
        raise framework_oom()

    monkeypatch.setattr(measure, "fit_steps", fit_steps)
    plans = [Observation(8, 1 * MIB, PLAN, ladder=True)]
    data = Batches(x, y)
    assert measure._timed(model, data, 8, plans, 64 * MIB, 0) == {}
