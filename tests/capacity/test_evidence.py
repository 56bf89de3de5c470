"""The record and its one rule: every answer an estimate gives is read from
the observations by `Evidence.batch_size_for`."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from keras_memwatch.capacity.evidence import (
    AIMED,
    JOB,
    PLAN,
    STEP,
    Evidence,
    Observation,
    fit_line,
)

MIB = 2**20
GIB = 2**30
LIMIT, IN_USE = 10 * GIB, GIB  # the whole room: 9 GiB
HEADROOMS = [i / 20 for i in range(20)]


def ladder(per_sample=10 * MIB, static=100 * MIB, sizes=(1, 2, 4, 8), how=STEP):
    return [Observation(b, static + per_sample * b, how, ladder=True) for b in sizes]


def evidence(*observations):
    return Evidence(tuple(observations), LIMIT, IN_USE)


# -- the rule on cases a reader can check by hand ------------------------------

def test_the_line_alone_answers_where_nothing_was_checked():
    ev = evidence(*ladder())
    # room 9 GiB under no headroom: (9216 - 100) / 10 = 911.6 -> 911
    assert ev.batch_size_for(0.0) == 911 == ev.line_batch_size_for(0.0)
    # 10% headroom: 10240 x 0.9 - 1024 - 100 = 8092 MiB -> 809
    assert ev.batch_size_for(0.1) == 809 == ev.line_batch_size_for(0.1)


def test_a_size_that_ran_out_of_memory_caps_every_answer_and_scales_the_need():
    # The allocator needed 10% more than the line at the boundary: 830 failed.
    ev = evidence(*ladder(), Observation(800, 8100 * MIB, STEP),
                  Observation(830, None, STEP, ran=False))
    # between 800 (ran) and 830 (failed) the record cannot tell
    assert ev.batch_size_for(0.0) == 800
    # 800 is taken to need the whole room, so the line is 9216 / 8100 =
    # 1.14x short: under 10% headroom not the line's 809 but about
    # (8092 / 1.14 - 100) / 10 = 701
    assert ev.batch_size_for(0.1) < 809
    assert 695 <= ev.batch_size_for(0.1) <= 712
    assert ev.line_batch_size_for(0.1) == 809  # still there to read


def test_a_size_that_ran_is_held_even_where_the_line_says_it_cannot_fit():
    ev = evidence(*ladder(per_sample=12 * MIB), Observation(900, 8000 * MIB, STEP))
    assert ev.line_batch_size_for(0.0) == 759
    assert ev.batch_size_for(0.0) >= 900


def test_compiled_plans_follow_xla_recomputing_activations():
    # XLA's plans flatten where they would not fit: recomputation.
    plans = [Observation(800, 8100 * MIB, PLAN), Observation(1000, 8900 * MIB, PLAN),
             Observation(1200, 9100 * MIB, PLAN), Observation(1300, 9300 * MIB, PLAN)]
    ev = evidence(*ladder(how=AIMED), *plans)
    assert ev.smallest_failure == 1300  # planned more than the 9 GiB room
    assert 1200 <= ev.batch_size_for(0.0) < 1300
    assert ev.recomputes_from == 1000
    assert ev.line_batch_size_for(0.0) == 911


def test_plans_on_the_ladder_never_say_xla_recomputes():
    # the host's plans: batch 1 lies under the line through the ladder (its
    # constant part is shared), which says nothing of recomputation
    ev = evidence(Observation(1, 20 * MIB, PLAN, ladder=True),
                  Observation(8, 200 * MIB, PLAN, ladder=True),
                  Observation(64, 1500 * MIB, PLAN, ladder=True))
    assert ev.recomputes_from is None


def test_aimed_plans_only_draw_the_line():
    ev = evidence(*ladder(how=AIMED), Observation(2000, 20 * GIB, AIMED))
    assert ev.batch_size_for(0.0) == 911


def test_no_line_no_answer():
    assert evidence(*ladder(sizes=(4,))).batch_size_for(0.1) is None
    assert fit_line([(1, 5), (2, 5)]) is None  # the need does not grow
    assert Evidence(tuple(ladder()), None, IN_USE).batch_size_for(0.1) is None


def test_nothing_fits():
    ev = evidence(*ladder(static=9500 * MIB, how=AIMED))
    assert ev.batch_size_for(0.0) == 0


# -- the rule's guarantees on any record ---------------------------------------

@st.composite
def records(draw):
    """A ladder of real steps or of aimed plans, then checks of that kind:
    a device where a step needs `scale` times the line (allocator overhead)
    or, for plans, where XLA recomputes above `flat`."""
    plans = draw(st.booleans())
    per_sample = draw(st.integers(1, 64)) * MIB
    static = draw(st.integers(0, 512)) * MIB
    scale = draw(st.floats(1.0, 1.3))
    flat = draw(st.integers(10, 3000))
    top = draw(st.integers(1, 4))
    obs = ladder(per_sample, static, sizes=[2 ** i for i in range(top + 1)],
                 how=AIMED if plans else STEP)
    room = LIMIT - IN_USE
    for b in draw(st.lists(st.integers(1, 6000), max_size=8)):
        true = scale * (static + per_sample * b)
        if plans:
            planned = true if b <= flat else max(true * flat / b, 0.97 * room)
            obs.append(Observation(b, int(planned), PLAN))
        elif true <= room:
            obs.append(Observation(b, int(static + per_sample * b), draw(
                st.sampled_from([STEP, JOB]))))
        else:
            obs.append(Observation(b, None, draw(st.sampled_from([STEP, JOB])),
                                   ran=False))
    return evidence(*obs)


@settings(max_examples=300, deadline=None)
@given(records())
def test_never_rises_as_the_headroom_grows(ev):
    answers = [ev.batch_size_for(h) for h in HEADROOMS]
    assert all(a >= b for a, b in zip(answers, answers[1:])), answers


@settings(max_examples=300, deadline=None)
@given(records())
def test_never_at_or_above_a_size_that_failed(ev):
    failed = ev.smallest_failure
    if failed is not None:
        assert all(ev.batch_size_for(h) < failed for h in HEADROOMS)


@settings(max_examples=300, deadline=None)
@given(records())
def test_holds_every_size_that_ran_below_every_failure(ev):
    failed = ev.smallest_failure
    ran = [o.batch_size for o in ev.observations
           if o.how in (STEP, JOB) and o.ran
           and (failed is None or o.batch_size < failed)]
    if ran:
        assert ev.batch_size_for(0.0) >= max(ran)


@settings(max_examples=300, deadline=None)
@given(records())
def test_what_it_answers_fits_by_the_record(ev):
    b = ev.batch_size_for(0.1)
    needs = ev.needs()
    assert needs is not None and b is not None
    assert all(n <= ev.room(0.1) for size, n in needs if size <= b)


def test_a_plan_over_the_limit_does_not_lift_the_recomputed_plans_below_it():
    # keras-hub GPT-2 base under an 8 GiB cap on an H200 (docs/capacity.md):
    # XLA recomputes from batch 16 on and keeps 16-30 under 5.8 GiB; batch
    # 34's plan needs 8.2 GiB, more than the room.
    room = 6768 * MIB
    ev = Evidence(tuple(ladder(per_sample=367 * MIB, static=0, how=AIMED)) + tuple(
        Observation(b, n * MIB, PLAN) for b, n in
        [(16, 5149), (22, 5405), (24, 5391), (26, 5371), (27, 5335), (28, 5400),
         (30, 5784), (34, 8430)]), LIMIT, LIMIT - room)
    assert ev.smallest_failure == 34
    assert ev.batch_size_for(0.0) == 30
    assert ev.recomputes_from == 16
