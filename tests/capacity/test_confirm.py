"""Confirming the answer by real steps on a GPU: the decisions, with fakes."""

from __future__ import annotations

import functools

import pytest

from capacity_helpers import BACKEND, GIB, MIB, simulate_torch_gpu, tiny
from keras_memwatch.capacity import CapacityEstimate, estimate_max_batch_size
from keras_memwatch.capacity.allocator import parse_alloc_conf, read_settings
from keras_memwatch.capacity.confirm import (
    MAX_FRESH,
    MAX_STEPS,
    scaled_recommendation,
    search_boundary,
)
from keras_memwatch.capacity.result import LIMIT_ALLOCATOR


def runs_below(limit, log):
    def runs(size):
        log.append(size)
        return size <= limit
    return runs


def test_search_confirms_an_exact_line_in_two_steps():
    log = []
    assert search_boundary(runs_below(500, log), 500, None, 8) == (500, 505)
    assert log == [500, 505]


def test_search_steps_down_to_the_hint_then_bisects():
    log = []
    lo, hi = search_boundary(runs_below(134, log), 164, 140, 8)
    assert log[:2] == [164, 140]  # the line's answer, then the reserved line's
    assert lo == 134 and hi - lo <= max(1, 0.01 * lo)
    assert len(log) <= 8 and len(set(log)) == len(log)


def test_search_without_a_hint_goes_down_by_ten_then_fifteen_percent():
    log = []
    lo, hi = search_boundary(runs_below(100, log), 164, None, 8)
    assert log[:3] == [164, 147, 124]
    assert lo is not None and lo <= 100 < hi


def test_search_upward_when_the_line_is_conservative():
    log = []
    lo, hi = search_boundary(runs_below(130, log), 100, None, 12)
    assert log[:3] == [100, 101, 107]
    assert lo == 130 and hi == 131 or hi - lo <= 1.3


def test_search_keeps_to_its_budget_and_says_none_when_nothing_ran():
    log = []
    assert search_boundary(runs_below(0, log), 1000, None, 5) == (None, min(log))
    assert len(log) == 5


def estimate_for(limit=16 * GIB, in_use=GIB, static=64 * MIB, per_sample=10 * MIB,
                 headroom=0.1):
    return CapacityEstimate(
        predicted_batch_size=1, static_bytes=in_use + static,
        per_sample_bytes=per_sample, limit_bytes=limit, limit_source=LIMIT_ALLOCATOR,
        measurements=(), residual=0.0, explanation="", headroom=headroom,
        in_use_bytes=in_use, step_static_bytes=static)


def test_scaled_recommendation_is_the_line_where_the_boundary_agrees():
    estimate = estimate_for()
    boundary = int((15 * GIB - 64 * MIB) // (10 * MIB))
    line = int((16 * GIB * 0.9 - GIB - 64 * MIB) // (10 * MIB))
    assert scaled_recommendation(estimate, boundary, boundary + 8, 0.1) == line


def test_scaled_recommendation_shrinks_by_what_the_allocator_needed():
    estimate = estimate_for()
    line0 = int((15 * GIB - 64 * MIB) // (10 * MIB))
    boundary = int(line0 / 1.2)  # the allocator needed 20% more than allocated
    recommended = scaled_recommendation(estimate, boundary, boundary + 5, 0.1)
    line = int((16 * GIB * 0.9 - GIB - 64 * MIB) // (10 * MIB))
    assert recommended == pytest.approx(line / 1.2, rel=0.01)
    assert recommended < boundary
    assert scaled_recommendation(estimate, None, 10, 0.1) is None


def test_allocator_settings_are_read_from_the_environment():
    assert parse_alloc_conf("expandable_segments:True, max_split_size_mb:128") == {
        "expandable_segments": "True", "max_split_size_mb": "128"}
    none = read_settings({})
    assert not none.expandable and none.variables == ()
    assert "PYTORCH_CUDA_ALLOC_CONF not set" in none.text()
    assert "expandable_segments off" in none.text()
    on = read_settings({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert on.expandable
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in on.text()
    newer = read_settings({"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    assert newer.expandable


@pytest.fixture
def torch_gpu(monkeypatch):
    return functools.partial(simulate_torch_gpu, monkeypatch)


def test_fragmentation_lowers_the_answer_and_the_recommendation_trains(torch_gpu):
    # The allocator needs 20% more than the step allocates (the issue's
    # transformer: the allocated line said 164, 134 trained).
    model, x, y = tiny()
    gpu, cache = torch_gpu(model, name=BACKEND, overhead=1.2, expandable_overhead=1.05)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    line0 = int((15 * GIB - 64 * MIB) // (10 * MIB))
    truth0 = max(b for b in range(line0) if gpu.in_use + 1.2 * gpu.working(b) <= 16 * GIB)
    assert estimate.batch_size_for(0.0) == line0
    assert truth0 * 0.99 <= estimate.ceiling_batch_size <= truth0
    # the recommendation keeps 10% free by what the allocator needs, and ran
    recommended = estimate.predicted_batch_size
    assert gpu.in_use + 1.2 * gpu.working(recommended) <= 0.9 * 16 * GIB
    assert gpu.in_use + 1.2 * gpu.working(recommended + 3) > 0.9 * 16 * GIB * 0.99
    assert any(t.batch_size == recommended and t.ran and t.purpose == "recommended"
               for t in estimate.trials)
    boundary = [t for t in estimate.trials if t.purpose == "boundary"]
    assert len([t for t in boundary if not t.fresh_process]) <= MAX_STEPS
    assert len([t for t in boundary if t.fresh_process]) <= MAX_FRESH
    # expandable_segments: measured by switching it on, and switched back
    truth_e = max(b for b in range(line0) if gpu.in_use + 1.05 * gpu.working(b) <= 16 * GIB)
    assert estimate.expandable_batch_size is not None
    assert truth0 < estimate.expandable_batch_size <= truth_e
    assert cache.calls.count("expandable:True") == 1
    assert cache.calls[-2:] == ["expandable:False", "free"] or "expandable:False" in cache.calls
    assert gpu.expandable is False
    assert "With expandable_segments:True" in estimate.explanation
    assert "PYTORCH_CUDA_ALLOC_CONF not set" in estimate.explanation
    assert "too many: what the allocator needs beyond what it allocates" in \
        estimate.explanation
    text = str(estimate)
    assert "trained:" in text and "out of memory" in text and "allocator:" in text
    assert "reserved (allocator)" in text  # the ladder's reserved peaks
    assert estimate.reserved_measurements


def test_every_size_is_tried_for_two_steps_since_the_second_needs_more(torch_gpu):
    # As PyTorch's allocator on the H200: from a freed cache the second step
    # reserves more than the first, so a size whose first step fits may fail.
    model, x, y = tiny()
    gpu, _ = torch_gpu(model, name=BACKEND, later_overhead=1.15)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")

    def fits(b, room):
        return gpu.in_use + 1.15 * gpu.working(b) <= room

    truth0 = max(b for b in range(2000) if fits(b, 16 * GIB))
    assert truth0 * 0.99 <= estimate.ceiling_batch_size <= truth0
    recommended = estimate.predicted_batch_size
    assert fits(recommended, 0.9 * 16 * GIB)
    assert not fits(int(recommended * 1.02) + 1, 0.9 * 16 * GIB)
    assert "trained 4 epochs of 15 steps in a new process" in estimate.explanation


def test_a_torch_that_cannot_switch_says_how_to_measure(torch_gpu):
    model, x, y = tiny()
    gpu, cache = torch_gpu(model, name=BACKEND, overhead=1.2, can_switch=False)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    assert estimate.expandable_batch_size is None
    assert "not measured (this torch cannot switch it at run time)" in \
        estimate.explanation
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in estimate.explanation


def test_expandable_already_on_is_said(torch_gpu):
    model, x, y = tiny()
    torch_gpu(model, name=BACKEND, overhead=1.05,
              environ={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    assert "expandable_segments is on already" in estimate.explanation
    assert "expandable segments" in estimate.allocator_settings


def test_without_a_cap_no_step_tries_the_limit(torch_gpu, monkeypatch):
    # The limit is the device's total (NVML): only the recommendation is
    # trained, and the reserved line (more cautious) sets it.
    model, x, y = tiny()
    gpu, _ = torch_gpu(model, name=BACKEND, overhead=1.1)
    monkeypatch.setattr("keras_memwatch.capacity.meter.Meter.limit",
                        lambda self: (16 * GIB, "NVML total", "total"))
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    assert [t.purpose for t in estimate.trials] == ["recommended"]
    assert estimate.ceiling_batch_size is None
    assert "No allocator cap is set" in estimate.explanation
    assert "not measured (no allocator cap is set" in estimate.explanation
    assert estimate.predicted_batch_size <= estimate.batch_size_for(0.1)


def test_a_recommendation_that_runs_out_of_memory_steps_down(torch_gpu, monkeypatch):
    model, x, y = tiny()
    gpu, _ = torch_gpu(model, name=BACKEND)
    monkeypatch.setattr("keras_memwatch.capacity.meter.Meter.limit",
                        lambda self: (16 * GIB, "NVML total", "total"))
    gpu.oom_at = GIB + 0.8 * 15 * GIB  # the device holds less than it says
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    steps = [t for t in estimate.trials if t.purpose == "recommended"]
    assert not steps[0].ran and steps[-1].ran
    assert all(b.batch_size > a.batch_size for a, b in zip(steps[1:], steps))
    assert estimate.predicted_batch_size == steps[-1].batch_size


def test_the_model_is_restored_after_the_real_steps(torch_gpu):
    from capacity_helpers import assert_same_state, state_of

    model, x, y = tiny()
    model.train_on_batch(x, y)
    before = state_of(model)
    torch_gpu(model, name=BACKEND, overhead=1.2)
    estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16), method="probes")
    assert_same_state(before, state_of(model))


# -- new processes (PyTorch): a process that has trained fits more --------


def test_the_answer_comes_from_new_processes_where_they_fit_less(torch_gpu):
    # As the block on the H200: 646 in the measuring process, 588-600 fresh.
    model, x, y = tiny()
    gpu, _ = torch_gpu(model, name=BACKEND, overhead=1.1, fresh_cold=1.08)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")

    def largest(cold, room=16 * GIB):
        return max(b for b in range(3000)
                   if gpu.in_use + 1.1 * cold * gpu.working(b) <= room)

    warm, fresh = largest(1.0), largest(1.08)
    assert warm * 0.99 <= estimate.in_process_ceiling_batch_size <= warm
    assert fresh * 0.99 <= estimate.ceiling_batch_size <= fresh
    runner, = gpu.fresh.made
    assert runner.closed and len(runner.sizes) <= MAX_FRESH + 1  # + the recommendation
    # the recommendation keeps 10% free by what a new process needs, and ran in one
    recommended = estimate.predicted_batch_size
    last = [t for t in estimate.trials if t.purpose == "recommended"][-1]
    assert (last.batch_size, last.ran, last.fresh_process) == (recommended, True, True)
    best = largest(1.08, room=0.9 * 16 * GIB)
    assert 0.97 * best <= recommended <= best
    assert "less than 2 steps in this process" in estimate.explanation
    failed = min(t.batch_size for t in estimate.trials if t.fresh_process and not t.ran)
    assert f"batch {estimate.ceiling_batch_size} ran, {failed} ran out of memory" in \
        estimate.explanation
    text = str(estimate)
    assert "in a new process" in text and f"{estimate.in_process_ceiling_batch_size} in " \
        "the measuring one" in text and "boundary, new process" in text


def test_new_processes_that_fit_more_stop_below_what_failed_here(torch_gpu):
    # As the convnet on the H200: 672 in the measuring process, 675-680 fresh.
    model, x, y = tiny()
    gpu, _ = torch_gpu(model, name=BACKEND, overhead=1.1, fresh_cold=0.95)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    failed_here = min(t.batch_size for t in estimate.trials
                      if t.purpose == "boundary" and not t.ran and not t.fresh_process)
    fresh = [t for t in estimate.trials if t.fresh_process and t.purpose == "boundary"]
    assert all(t.batch_size < failed_here for t in fresh)
    assert estimate.in_process_ceiling_batch_size <= estimate.ceiling_batch_size < \
        failed_here
    assert f"({failed_here}, which failed in this process, was not tried)" in \
        estimate.explanation


def test_fresh_process_false_starts_no_process(torch_gpu):
    model, x, y = tiny()
    gpu, _ = torch_gpu(model, name=BACKEND, overhead=1.1, fresh_cold=1.08)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes", fresh_process=False)
    assert gpu.fresh.made == []
    assert not any(t.fresh_process for t in estimate.trials)
    assert estimate.in_process_ceiling_batch_size is None
    assert estimate.ceiling_batch_size is not None


def test_new_processes_that_cannot_run_leave_the_measuring_process_answer(
        torch_gpu, caplog):
    model, x, y = tiny()
    why = "GPU:0 has 3.0 GiB free beside this process, less than the limit"
    torch_gpu(model, name=BACKEND, overhead=1.1, fresh_unavailable=why)
    with caplog.at_level("WARNING", logger="keras_memwatch"):
        estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                           method="probes", fresh_process=True)
    assert estimate.fresh_process_note == why
    assert f"No answer from new processes: {why}." in estimate.explanation
    assert "fresh_process=True, but " + why in caplog.text
    assert estimate.in_process_ceiling_batch_size is None
    assert estimate.predicted_batch_size is not None
    assert not any(t.fresh_process for t in estimate.trials)


def test_no_process_without_room_for_it_beside_this_one(torch_gpu):
    model, x, y = tiny()
    gpu, cache = torch_gpu(model, name=BACKEND, overhead=1.1, fresh_cold=1.08)
    cache.free_bytes = GIB
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    assert gpu.fresh.made == []
    assert estimate.fresh_process_note == (
        "GPU:0 has 1.00 GiB free beside this process, less than the limit of "
        "16.00 GiB a new process would need")
    assert estimate.in_process_ceiling_batch_size is None


def test_a_crashing_new_process_falls_back_to_this_one(torch_gpu):
    model, x, y = tiny()
    gpu, _ = torch_gpu(model, name=BACKEND, overhead=1.1, fresh_cold=1.08,
                       fresh_fail_after=2)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    assert gpu.fresh.made[0].closed
    assert "a new process could not train (batch" in estimate.fresh_process_note
    assert estimate.in_process_ceiling_batch_size is None
    last = [t for t in estimate.trials if t.purpose == "recommended"][-1]
    assert not last.fresh_process and last.ran


def test_fresh_process_must_be_a_bool_or_none():
    model, x, y = tiny()
    with pytest.raises(TypeError, match="fresh_process"):
        estimate_max_batch_size(model, x, y, fresh_process="yes")
