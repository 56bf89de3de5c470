"""`max_seconds`: no round starts that cannot end in time; the answer is the
record's so far, and says what is left open."""

from __future__ import annotations

import time

import pytest

from capacity_helpers import MIB, FakeStrategy
from keras_memwatch.capacity import search as S
from keras_memwatch.capacity.deadline import Deadline


class SlowFake(FakeStrategy):
    """Each size takes `delay` seconds, as a real step would."""

    def __init__(self, *args, delay=0.2, **kwargs):
        super().__init__(*args, seconds=delay, **kwargs)
        self.delay = delay

    def _observe(self, b, ladder):
        time.sleep(self.delay)
        return super()._observe(b, ladder)


def allocator(b):
    return 1.1 * (100 * MIB + 10 * MIB * b)


def test_a_deadline_is_honoured_within_a_size_and_the_answer_says_what_is_open():
    fake = SlowFake(allocator, reported=lambda b: 100 * MIB + 10 * MIB * b)
    began = time.perf_counter()
    search = S.Search(fake, on_gpu=True, host_largest=None,
                      deadline=Deadline(1.0, began))
    ev = search.run(0.1, None)
    took = time.perf_counter() - began
    assert took <= 1.0 + fake.delay / 2  # no size started that could not end
    assert search.out_of_time
    assert ev.batch_size_for(0.1) is not None  # an answer, from what was seen
    assert search.open and all("out of time" in why for why in search.open.values())
    assert "out of time (max_seconds)" in (search.checks_left + search.stopped)
    # the same search without a limit asks more
    unbounded = SlowFake(allocator, reported=lambda b: 100 * MIB + 10 * MIB * b,
                         delay=0.0)
    S.Search(unbounded, on_gpu=True, host_largest=None).run(0.1, None)
    assert len(unbounded.asked) > len(fake.asked)


def test_the_first_two_sizes_are_measured_however_short_the_time():
    fake = SlowFake(lambda b: 10 * MIB * b, delay=0.05)
    search = S.Search(fake, on_gpu=True, host_largest=None,
                      deadline=Deadline(0.001))
    ev = search.run(0.1, None)
    assert len(fake.asked) == 2 and ev.line is not None
    assert ev.batch_size_for(0.1) is not None
    assert "out of time" in search.stopped


def test_expected_round_time_comes_from_the_rounds_before():
    fake = SlowFake(lambda b: 10 * MIB * b, delay=0.0)
    search = S.Search(fake, on_gpu=True, host_largest=None)
    search.rounds = [("ladder", [1], 0.5), ("ladder", [2], 0.6)]
    # steps: as long as the largest batch timed (0.6 s at 2), in proportion
    # to the batch above it
    assert search._expected("check", [4]) == pytest.approx(0.6 * 2)
    assert search._expected("check", [4, 8]) == pytest.approx(0.6 * 6)
    assert search._expected("check", [2]) == pytest.approx(0.6)
    # compilations side by side: the slowest round; a first one as `fit`
    # compiles it, twice that
    fake.how = "plan"
    assert search._expected("ladder", [16, 32]) == pytest.approx(0.6)
    assert search._expected("check", [16, 32]) == pytest.approx(1.2)
    search.rounds.append(("check", [16, 17], 0.8))
    assert search._expected("check", [18]) == pytest.approx(0.8)


def test_checks_compiled_in_turn_are_expected_one_after_another():
    """A convnet's checks compile one at a time (`Plans.checks_in_turn`):
    a round of four takes four checks' time, not one's."""
    fake = SlowFake(lambda b: 10 * MIB * b, delay=0.0, how="plan",
                    checks_in_turn=True)
    search = S.Search(fake, on_gpu=True, host_largest=None)
    search.rounds = [("ladder", [1, 2], 0.5), ("aim", [16, 32], 0.6)]
    # a first check, twice the slowest round before it, for each size
    assert search._expected("check", [16, 17, 32, 33]) == pytest.approx(4 * 1.2)
    search.rounds.append(("check", [16, 17], 3.0))
    assert search._expected("check", [18, 19, 20]) == pytest.approx(3 * 1.5)
    # the quick plans still compile side by side
    assert search._expected("aim", [40, 48]) == pytest.approx(0.6)


def test_a_deadline_starts_no_round_of_checks_in_turn_that_cannot_end():
    """With 1 s left, four checks of about 0.4 s each start side by side
    (0.4 s) but not one after another (1.6 s)."""
    for in_turn, starts in ((False, True), (True, False)):
        fake = SlowFake(lambda b: 10 * MIB * b, delay=0.0, how="plan",
                        checks_in_turn=in_turn)
        search = S.Search(fake, on_gpu=True, host_largest=None,
                          deadline=Deadline(1.0))
        search.observations = fake.ladder([1, 2])
        search.rounds = [("ladder", [1, 2], 0.1), ("aim", [16, 32], 0.2)]
        assert search._in_time("check", [16, 17, 32, 33]) is starts
        assert search.out_of_time is not starts


def test_a_small_batchs_fixed_share_does_not_stop_the_ladder_early():
    """The rounds of a keras-hub Qwen2 on the host (JAX): batch 1 was
    compiled while setting up, 8 and 64 each compiled their shape first.
    Scaled up from batch 1, 512 would take 164 s and a 120 s budget would
    stop the ladder at 64; from 64, the largest batch timed, 26 s."""
    fake = SlowFake(lambda b: 10 * MIB * b, delay=0.0)
    search = S.Search(fake, on_gpu=False, host_largest=None)
    search.rounds = [("ladder", [1], 0.32), ("ladder", [8], 2.57),
                     ("ladder", [64], 3.19)]
    assert search._expected("ladder", [512]) == pytest.approx(3.19 * 8)
