"""The ladder's rules read off a record: which plans asked beside it,
its own way, it takes as its own rungs."""

from __future__ import annotations

from capacity_helpers import MIB
from keras_memwatch.capacity.evidence import AIMED, PLAN, Observation
from keras_memwatch.capacity.ladder import SAFE, TARGET, rungs

ROOM = 1000 * MIB


def plans(needs, ladder, how=AIMED):
    """Quick plans of `needs` (MiB by batch), those in `ladder` on it."""
    return [Observation(b, int(n * MIB), how, ladder=b in ladder)
            for b, n in needs.items()]


def test_plans_beside_the_ladder_join_it_up_to_the_first_that_reaches_its_target():
    needs = {1: 10, 2: 20, 4: 40, 8: 80, 16: 160, 24: 240, 32: 320, 48: 480}
    record = plans(needs, ladder={1, 2, 4, 8})
    assert needs[32] * MIB >= TARGET * ROOM > needs[24] * MIB
    assert rungs(record, ROOM) == [16, 24, 32]


def test_a_ladder_already_at_its_target_takes_none():
    record = plans({1: 100, 2: 200, 4: 300, 8: 400, 16: 450}, ladder={1, 2, 4, 8})
    assert rungs(record, ROOM) == []


def test_no_plan_past_half_the_room_nor_of_another_kind_joins():
    # 16 jumps past SAFE: XLA may already recompute there
    record = plans({1: 1, 2: 2, 4: 4, 8: 8, 16: 600}, ladder={1, 2, 4, 8})
    assert 600 * MIB > SAFE * ROOM and rungs(record, ROOM) == []
    exact = plans({1: 1, 2: 2, 4: 4, 8: 8}, ladder={1, 2, 4, 8}) + [
        Observation(16, 16 * MIB, PLAN)]
    assert rungs(exact, ROOM) == []
    assert rungs(plans({1: 1, 2: 2, 16: 16}, ladder={1, 2}), None) == []
