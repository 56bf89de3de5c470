"""The rounds of compilations that check JAX's answer: aimed, side by side."""

from __future__ import annotations

import dataclasses
import time

import pytest

from capacity_helpers import BACKEND, GIB, MIB
from keras_memwatch.capacity import CapacityEstimate
from keras_memwatch.capacity.result import LIMIT_ALLOCATOR
from keras_memwatch.capacity.xla_check import check_compiled
from keras_memwatch.capacity.xla_compile import Target, search

CLIFF = 1900  # XLA fits every plan under the limit by recomputing, up to here


def plan(size, shift=0, scale=1.0):
    """A plan linear up to the limit, flat (recomputing) up to the cliff."""
    line = scale * (100 * MIB + 6 * MIB * size)
    return min(line, int(7.9 * GIB)) if size <= CLIFF + shift else line


class FakePlanner:
    """Plans side by side; aiming plans put the cliff 12 sizes off, and
    plans as fit compiles them are `scale` times the aimed ones."""

    def __init__(self, parallel=8, aim=True, scale=1.0, tuned=None, aimed=None):
        self.parallel = parallel
        self.aim_options = {"xla_gpu_autotune_level": 0} if aim else None
        self.scale = scale
        self.tuned = tuned or (lambda b: plan(b, scale=scale))
        self.aimed = aimed or (lambda b: plan(b, shift=12))
        self.compilations = self.aim_compilations = 0
        self.rounds = []

    def plans(self, sizes, aim=False):
        self.rounds.append((aim, list(sizes)))
        self.compilations += len(sizes)
        self.aim_compilations += len(sizes) if aim else 0
        if aim:
            return {b: self.aimed(b) for b in sizes}
        return {b: self.tuned(b) for b in sizes}


def line_estimate():
    limit, in_use = 8 * GIB, 0
    per_sample, static = 6 * MIB, 100 * MIB
    line = int((limit * 0.9 - static) // per_sample)
    return CapacityEstimate(
        predicted_batch_size=line, static_bytes=static, per_sample_bytes=per_sample,
        limit_bytes=limit, limit_source=LIMIT_ALLOCATOR, measurements=((2, 112 * MIB),),
        residual=0.0, explanation="The line.", headroom=0.1, in_use_bytes=in_use,
        step_static_bytes=static, fit_batch_sizes=(2, 64, 512), device="GPU:0",
        backend="jax", method="xla", measured_by="XLA plan"), line


def test_searched_without_autotuning_then_only_the_ceiling_compiled_as_fit_does():
    estimate, line = line_estimate()
    planner = FakePlanner()
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    assert checked.predicted_batch_size == line  # the line is exact below
    # the ceiling, told to 3%: where the aimed ceiling fits as fit compiles
    # it, and no larger, one compilation confirms it, and the answer below it
    assert CLIFF * 0.97 <= checked.ceiling_batch_size <= (CLIFF + 12) * 1.0
    default_rounds = [sizes for aim, sizes in planner.rounds if not aim]
    assert default_rounds == [[checked.ceiling_batch_size]]
    assert len(planner.rounds) <= 7
    assert "without autotuning, 8 side by side" in checked.explanation
    assert "(as `fit` compiles it, to 3%)" in checked.explanation
    assert (f"Largest batch {line} on GPU:0 (jax, XLA plan), checked by compiling "
            "the step without autotuning (the larger ceiling fits as `fit` "
            "compiles it") in checked.explanation


def test_the_ceiling_is_aimed_while_the_answer_is_still_aimed():
    # On an H200 the transformer's answer took two aimed rounds (the line
    # was 6% high); the ceiling's first round went out beside the second.
    estimate, line = line_estimate()
    planner = FakePlanner(aimed=lambda b: plan(b, shift=12, scale=1.06))
    plans, spans = planner.plans, []

    def slow(sizes, aim=False):
        began = time.perf_counter()
        time.sleep(0.2)
        out = plans(sizes, aim)
        spans.append((aim, sizes, began, time.perf_counter()))
        return out

    planner.plans = slow
    check_compiled(estimate, None, None, lambda s: None, planner)
    answer = [(b, e) for aim, sizes, b, e in spans if aim and max(sizes) < 1.1 * line]
    ceiling = [(b, e) for aim, sizes, b, e in spans if aim and min(sizes) > 1.1 * line]
    assert len(answer) == 2 and ceiling
    assert answer[0][1] <= ceiling[0][0] < answer[1][1]


def test_where_autotuning_grows_the_plan_near_the_ceiling_the_ceiling_comes_down():
    # As on an H200 (the block under 6 GiB): autotuned plans 5% above the
    # aimed ones at the answer, 14% at the aimed ceiling.
    estimate, line = line_estimate()

    def ratio(b):
        return 1.05 + 0.09 * max(b - line, 0) / (CLIFF - line)

    planner = FakePlanner(tuned=lambda b: plan(b, shift=12) * ratio(b))
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    truth = max(b for b in range(1, 2 * CLIFF)
                if plan(b, shift=12) * ratio(b) <= 8 * GIB)
    # a long walk down: its six compilations end within 5%, not 3%
    assert truth * 0.95 <= checked.ceiling_batch_size <= truth
    assert dict(checked.checked)[checked.ceiling_batch_size] <= 8 * GIB
    tuned_rounds = [sizes for aim, sizes in planner.rounds if not aim]
    # pairs only in the answer's search (re-aimed below the line), the
    # ceiling's one compilation a round
    assert all(len(sizes) == 1 or max(sizes) < line for sizes in tuned_rounds)
    assert sum(map(len, tuned_rounds)) <= 10 + 6
    assert "(as `fit` compiles it)" in checked.explanation


def test_where_autotuning_only_moves_the_plan_near_the_ceiling_it_is_checked_too():
    # As on an H200 (the transformer under 6 GiB): the two plans agree at
    # the answer, but from 5% below the aimed ceiling the plan as fit
    # compiles it jumps 9% (XLA's recomputation falls short), and that
    # size ran out of memory.
    estimate, line = line_estimate()
    jump = int(0.95 * CLIFF)

    def tuned(b):
        return plan(b, shift=12) * (1.09 if b > jump else 1.0)

    planner = FakePlanner(tuned=tuned)
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    assert checked.predicted_batch_size == line
    assert jump * 0.97 <= checked.ceiling_batch_size <= jump
    tuned_rounds = [sizes for aim, sizes in planner.rounds if not aim]
    # the aimed top fails, a step below fails, a step below that fits; the
    # sizes that failed over their aimed plans say nothing of the answer,
    # which is not compiled
    assert len(tuned_rounds) == 3 and [line] not in tuned_rounds
    assert all(len(sizes) == 1 for sizes in tuned_rounds)
    assert "(as `fit` compiles it, to 3%)" in checked.explanation


def aimed_bracket(planner):
    """The largest aimed size that fits the whole limit below the least that
    does not, and that one."""
    aimed = {b for aim, sizes in planner.rounds if aim for b in sizes}
    above = min(b for b in aimed if plan(b, shift=12) > 8 * GIB)
    return max(b for b in aimed if b < above), above


def test_where_fits_plans_are_clearly_under_the_aimed_ones_the_ceiling_goes_up():
    # The plan as fit compiles it 2% under the aimed one at the answer, and
    # its cliff 6% higher: more fits than the aimed plans say.
    estimate, line = line_estimate()
    truth = CLIFF + 112
    planner = FakePlanner(tuned=lambda b: 0.98 * plan(b, shift=112))
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    assert truth * 0.97 <= checked.ceiling_batch_size <= truth
    ceiling_rounds = [sizes for aim, sizes in planner.rounds
                      if not aim and min(sizes) > 1.2 * line]
    top, above = aimed_bracket(planner)
    # the aimed top fits, then the search goes on up, a step at a time
    assert ceiling_rounds[0] == [top] and ceiling_rounds[1][0] > top
    assert all(len(sizes) == 1 for sizes in ceiling_rounds) and len(ceiling_rounds) <= 4
    assert "(as `fit` compiles it, to 3%)" in checked.explanation


def test_where_the_plans_agree_within_1_percent_one_compilation_confirms_the_ceiling():
    # The transformer on an H200 under 6 GiB: the plan as fit compiles it
    # 0.8% under the aimed one at the answer; the aimed ceilings (235, 240)
    # fitted as fit compiles them, and 241, inside the aimed bracket, was
    # the largest that trained.
    estimate, line = line_estimate()
    truth = CLIFF + 20
    planner = FakePlanner(tuned=lambda b: 0.992 * plan(b, shift=20))
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    top, above = aimed_bracket(planner)
    assert top <= truth < above and truth * 0.97 <= checked.ceiling_batch_size == top
    tuned_rounds = [sizes for aim, sizes in planner.rounds if not aim]
    assert tuned_rounds == [[top]]
    assert f"{above} would need" in checked.explanation
    assert "as planned without autotuning" in checked.explanation


def test_where_only_batch_1_fits_the_ceilings_check_compiles_no_batch_0():
    # Not even one sample fits under the headroom, one fits the whole limit:
    # the ratio at the answer is unknown, and no step below batch 1 exists.
    estimate, _ = line_estimate()
    estimate = dataclasses.replace(estimate, predicted_batch_size=1,
                                   per_sample_bytes=4 * GIB, static_bytes=3 * GIB,
                                   step_static_bytes=3 * GIB)

    def one(b):
        return 7.5 * GIB if b == 1 else 9 * GIB

    planner = FakePlanner(aimed=one, tuned=one)
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    assert checked.predicted_batch_size == 0 and checked.ceiling_batch_size == 1
    assert all(b >= 1 for _, sizes in planner.rounds for b in sizes)


def test_where_nothing_above_the_answer_fits_as_fit_compiles_it_that_is_the_ceiling():
    estimate, line = line_estimate()
    planner = FakePlanner(
        tuned=lambda b: 9 * GIB if b > line else plan(b, scale=1.03))
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    assert checked.predicted_batch_size < checked.ceiling_batch_size == line
    assert "(as `fit` compiles it)" in checked.explanation


def test_where_fits_plans_are_smaller_the_aimed_answer_stands_uncompiled():
    # The transformer on an H200 under 4 GiB: fit's plan 3.2% under the
    # aimed one at the answer. The ceiling, far above, fits as fit compiles
    # it, so the answer trains; its own compilation (13-16 s) is spared.
    estimate, line = line_estimate()
    planner = FakePlanner(scale=0.97)
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    assert checked.predicted_batch_size == line < checked.ceiling_batch_size
    answers = [sizes for aim, sizes in planner.rounds
               if not aim and max(sizes) < 1.2 * line]
    assert answers == []
    assert ("checked by compiling the step without autotuning" in checked.explanation
            and f"batch {line + line // 100} would need" in checked.explanation)


def test_where_fits_plans_are_larger_only_below_the_recomputation_it_goes_unseen():
    # What sparing the answer's compilation costs: near the ceiling XLA
    # recomputes until the plan fits, both ways, so the ceiling's plans
    # cannot show that fit's are 6% larger at the answer. The answer trains
    # (the ceiling fits as fit compiles it) but spends part of the headroom.
    estimate, line = line_estimate()
    planner = FakePlanner(scale=1.06)
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    assert checked.predicted_batch_size == line
    assert plan(line, scale=1.06) > 8 * GIB * 0.9  # over the headroom ...
    assert plan(checked.ceiling_batch_size, scale=1.06) <= 8 * GIB  # ... it trains


def test_sizes_that_fail_over_their_aimed_plans_leave_the_answer_uncompiled():
    # The transformer on an H200 under 6 GiB: fit's plan 2% under the aimed
    # one at the aimed ceiling, so the walk went up, and the size above
    # failed 3% over its aimed plan. Failing plans say nothing of the answer
    # (0.8% under there), so its compilation (13 s) is spared.
    estimate, line = line_estimate()

    def tuned(b):
        return 0.98 * plan(b, shift=20) if b <= CLIFF + 20 else 1.03 * plan(b)

    planner = FakePlanner(tuned=tuned)
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    top, _ = aimed_bracket(planner)
    default_rounds = [sizes for aim, sizes in planner.rounds if not aim]
    assert default_rounds[0] == [top] and default_rounds[1][0] > CLIFF + 20
    assert all(min(sizes) > 1.2 * line for sizes in default_rounds)
    assert checked.predicted_batch_size == line


def test_where_fits_plans_come_out_larger_the_answer_is_compiled_and_aimed_again():
    # Fit's plans 6% larger everywhere, so the aimed ceiling does not fit
    # as fit compiles it, and the size the walk finds fitting needs 6% more
    # than aimed with no recomputation to hide it: after the walk the answer
    # is compiled as fit does, re-aimed by the ratio of the two plans, then
    # searched two autotuned compilations at a time (autotuning takes every
    # core).
    estimate, line = line_estimate()
    scale = 1.06
    planner = FakePlanner(tuned=lambda b: scale * plan(b))
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    truth = max(b for b in range(2 * line) if scale * plan(b) <= 8 * GIB * 0.9)
    assert truth * 0.99 <= checked.predicted_batch_size <= truth
    assert dict(checked.checked)[checked.predicted_batch_size] <= 8 * GIB * 0.9
    default_rounds = [sizes for aim, sizes in planner.rounds if not aim]
    answers = [sizes for sizes in default_rounds if max(sizes) < 1.2 * line]
    assert answers[0] == [line] and len(answers) <= 3
    assert default_rounds.index([line]) > 0  # after the ceiling's walk
    assert all(len(sizes) <= 2 for sizes in default_rounds)
    assert "checked by compiling the step: it needs" in checked.explanation


def test_the_answer_rests_on_its_own_plans_not_the_ceilings():
    # As the block on an H200 under 6 GiB: without autotuning, the plan at
    # the line's ceiling (326) was under the room (5.27 GiB) where 297's was
    # over it (5.38 GiB); in rounds shared with the ceiling's search the
    # answer jumped there. The line is 2% low, so the answer's first two
    # sizes both fit.
    estimate, line = line_estimate()
    dip = estimate.batch_size_for(0.0)
    room = 8 * GIB * 0.9

    def aimed(b):
        return int(0.95 * room) if b == dip else 0.98 * plan(b, shift=12)

    planner = FakePlanner(aimed=aimed, tuned=aimed)
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    truth = max(b for b in range(line, dip) if aimed(b) <= room)
    assert truth * 0.99 <= checked.predicted_batch_size <= truth < dip


def test_without_aiming_the_same_answers_in_default_compilations():
    estimate, line = line_estimate()
    planner = FakePlanner(parallel=1, aim=False)
    checked = check_compiled(estimate, None, None, lambda s: None, planner)
    assert checked.predicted_batch_size == line
    assert CLIFF * 0.97 <= checked.ceiling_batch_size <= CLIFF
    assert planner.aim_compilations == 0


def test_a_linear_target_is_settled_by_interpolation():
    need = {}
    target = Target(free=1000.0, start=90)  # truth: 10 + 10 x size <= 1000: 99

    def plans(sizes):
        return {b: 10.0 + 10.0 * b for b in sizes}

    made = search([target], plans, need, 10, 1)
    assert (target.lo, target.hi) == (99, 100)
    assert made <= 4


def test_a_ceiling_admits_a_larger_size_that_another_search_found_fitting():
    # The ceiling's own search walked down to 1207 where the answer's plan
    # of 1212 fitted the whole limit: 1212 is the ceiling, below the same top.
    target = Target(free=100.0, start=1896)
    target.update({1896: 120.0, 1224: 101.0, 1207: 99.0})
    target.admit({1212: 99.5, 1153: 95.0, 1300: 99.0})
    assert (target.lo, target.hi) == (1212, 1224)
    target.admit({1100: 90.0})
    assert target.lo == 1212


def test_a_closed_bracket_of_small_sizes_closes_in_one_more_round():
    # gpt on an H200 under 4 GiB: sizes two apart left the ceiling's bracket
    # open at 60-62 (3% of 62 is under 2), and a third round cost 7 s.
    need = {37: 37.0}
    target = Target(free=61.5, start=37, more_likely=True, resolution=0.03,
                    factor=1.12)
    rounds = []

    def plans(sizes):
        rounds.append(sizes)
        return {b: float(b) for b in sizes}

    search([target], plans, need, 24, 8)
    assert (target.lo, target.hi) == (61, 62) and len(rounds) == 2


def test_each_size_compiles_as_soon_as_it_is_lowered_the_largest_first(monkeypatch):
    from keras_memwatch import xla_plan
    from keras_memwatch.capacity.xla_compile import Planner

    events = []

    def lower_step(model, sample, size, batches_ahead=16):
        time.sleep(0.05)
        events.append(("lowered", size))
        return size, 0, 0

    def compiled_working_bytes(size, state_bytes, ahead, options=None):
        events.append(("compiling", size))
        time.sleep(0.2)
        return size * MIB

    monkeypatch.setattr(xla_plan, "lower_step", lower_step)
    monkeypatch.setattr(xla_plan, "compiled_working_bytes", compiled_working_bytes)
    planner = Planner(None, None, lambda s: None, parallel=4)
    assert planner.plans([8, 32, 16]) == {8: 8 * MIB, 32: 32 * MIB, 16: 16 * MIB}
    assert events[0] == ("lowered", 32)
    assert events.index(("compiling", 32)) < events.index(("lowered", 8))


def test_a_second_search_compiles_only_new_sizes_and_counts_the_batches_ahead_anew(
        monkeypatch):
    """After the run-ahead is measured the plans are searched again with
    another count of batches ahead: the sizes compiled already are not
    compiled again, and every plan carries the new count."""
    import numpy as np

    from keras_memwatch import xla_plan
    from keras_memwatch.capacity.xla_compile import Planner

    compiled = []

    def lower_step(model, sample, size, batches_ahead=16):
        assert batches_ahead == 0  # the planner adds its own count
        return size, 0, 0

    def compiled_working_bytes(size, state_bytes, ahead, options=None):
        compiled.append(size)
        return size * MIB

    monkeypatch.setattr(xla_plan, "lower_step", lower_step)
    monkeypatch.setattr(xla_plan, "compiled_working_bytes", compiled_working_bytes)
    sample = (np.zeros((1, 1024), "float32"), np.zeros((1,), "int32"))  # 4 KiB + 4
    planner = Planner(None, sample, lambda s: None, parallel=2)
    planner.accelerator = True
    assert planner.plans([8, 16]) == {8: 8 * MIB + 16 * 8 * 4100,
                                      16: 16 * MIB + 16 * 16 * 4100}
    planner.batches_ahead = 4
    assert planner.plans([16, 32]) == {16: 16 * MIB + 4 * 16 * 4100,
                                       32: 32 * MIB + 4 * 32 * 4100}
    assert planner.plan(8) == 8 * MIB  # as fit compiles it, nothing ahead
    assert compiled == [16, 8, 32]


def test_where_xla_refuses_the_aiming_options_a_round_still_returns_every_plan(
        monkeypatch):
    """A compilation that fails with the aiming options is compiled as fit
    does, and later ones are too; the round still returns the aimed plans of
    the sizes compiled before it."""
    import numpy as np

    from keras_memwatch import xla_plan
    from keras_memwatch.capacity.xla_compile import Planner

    def lower_step(model, sample, size, batches_ahead=16):
        return size, 0, 0

    def compiled_working_bytes(size, state_bytes, ahead, options=None):
        if options and size == 16:
            raise ValueError("Unknown flag in XLA_FLAGS: --xla_gpu_autotune_level")
        return size * MIB + (0 if options else 1)

    monkeypatch.setattr(xla_plan, "lower_step", lower_step)
    monkeypatch.setattr(xla_plan, "compiled_working_bytes", compiled_working_bytes)
    planner = Planner(None, (np.zeros((1, 4), "float32"), None), lambda s: None,
                      parallel=2)
    planner.aim_options = {"xla_gpu_autotune_level": 0}
    assert planner.plans([8], aim=True) == {8: 8 * MIB}
    assert planner.plans([8, 16], aim=True) == {8: 8 * MIB, 16: 16 * MIB + 1}
    assert planner.aim_options is None
    assert planner.plans([32], aim=True) == {32: 32 * MIB + 1}
    # In one round: 64 was compiled with the options before 16 failed, so its
    # plan is an aimed one, never taken for fit's.
    planner = Planner(None, (np.zeros((1, 4), "float32"), None), lambda s: None,
                      parallel=2)
    planner.aim_options = {"xla_gpu_autotune_level": 0}
    assert planner.plans([16, 64], aim=True) == {16: 16 * MIB + 1, 64: 64 * MIB}
    assert planner.plan(64) == 64 * MIB + 1 and planner.plan(16) == 16 * MIB + 1


def test_one_plan_aims_without_autotuning_where_xla_takes_the_option(monkeypatch):
    from keras_memwatch import xla_plan
    from keras_memwatch.capacity import xla_compile

    options = []

    def working_bytes(model, batch, size, compiler_options=None):
        options.append(compiler_options)
        if compiler_options and refuse:
            raise ValueError("No such compile option: 'xla_gpu_autotune_level'")
        return 42 * MIB

    monkeypatch.setattr(xla_compile, "_on_accelerator", lambda: True)
    monkeypatch.setattr(xla_plan, "working_bytes", working_bytes)
    refuse = False
    assert xla_compile.plan_one(None, None, 8, aim=True) == 42 * MIB
    assert options == [xla_compile.AIM_OPTIONS]
    refuse = True  # then as fit compiles it
    assert xla_compile.plan_one(None, None, 8, aim=True) == 42 * MIB
    assert options[1:] == [xla_compile.AIM_OPTIONS, None]


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's plan of Keras's JAX train step")
def test_a_size_the_planner_compiled_as_fit_does_trains_without_compiling_again(caplog):
    """`fit` on arrays packs the batch as `(x, y)`, as the plans do
    (`train_on_batch` packs `(x, y, None)`: another program to JAX)."""
    import jax
    import keras
    import numpy as np

    from keras_memwatch.capacity.xla_compile import Planner

    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    x, y = np.zeros((64, 16), "float32"), np.zeros((64, 1), "float32")
    model.train_on_batch(x[:2], y[:2])
    Planner(model, (x[:1], y[:1]), lambda s: None, parallel=1).plans([37])
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level("WARNING", logger="jax"):
            model.fit(x[:37], y[:37], batch_size=37, epochs=2, verbose=0)
    finally:
        jax.config.update("jax_log_compiles", False)
    compiled = [r for r in caplog.records
                if "Compiling jit(train_step)" in r.getMessage()]
    assert not compiled
