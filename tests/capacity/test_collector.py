"""The steps the estimate measures run with Python's garbage collector paused."""

from __future__ import annotations

import functools
import gc
import weakref

import pytest

from capacity_helpers import BACKEND, GIB, MIB, simulate_torch_gpu, tiny
from keras_memwatch.capacity import collector, estimate_max_batch_size
from keras_memwatch.units import format_bytes


class Part:
    """A weakly referenceable member of a reference cycle."""


def cycle() -> weakref.ref:
    part = Part()
    part.me = part
    return weakref.ref(part)


def test_cycles_made_while_paused_live_until_a_collection():
    with collector.paused():
        held = cycle()
        for _ in range(5 * gc.get_threshold()[0]):  # would trigger collections
            cycle()
        assert held() is not None
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.collect()
    assert held() is None


def test_a_caller_that_has_just_collected_can_skip_the_first_collection():
    gc.disable()  # no automatic collection between the cycle and the block
    try:
        held = cycle()
        with collector.paused(collect=False):
            assert held() is not None
    finally:
        gc.enable()
    gc.collect()
    assert held() is None


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with collector.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_comes_back_when_the_steps_raise():
    with pytest.raises(MemoryError):
        with collector.paused():
            raise MemoryError("out of memory")
    assert gc.isenabled()


def test_freed_by_collection_counts_what_cycles_held_and_nothing_else():
    in_use = {"bytes": 0}

    def hold(nbytes: int, in_a_cycle: bool) -> Part:
        part = Part()
        if in_a_cycle:
            part.me = part
        in_use["bytes"] += nbytes
        weakref.finalize(part, lambda: in_use.__setitem__("bytes",
                                                         in_use["bytes"] - nbytes))
        return part

    with collector.paused():
        kept = hold(3 * MIB, in_a_cycle=False)  # referenced: not garbage
        hold(5 * MIB, in_a_cycle=True)
        hold(2 * MIB, in_a_cycle=True)
        assert collector.freed_by_collection(lambda: in_use["bytes"]) == 7 * MIB
    assert in_use["bytes"] == 3 * MIB
    del kept


def test_the_steps_the_estimate_measures_run_with_the_collector_paused(
        monkeypatch):
    model, x, y = tiny()
    seen = []
    original = model.train_on_batch

    def train_on_batch(x, *args, **kwargs):
        seen.append((len(x), gc.isenabled()))
        return original(x, *args, **kwargs)

    monkeypatch.setattr(model, "train_on_batch", train_on_batch)
    estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16), method="probes")
    measured = {size: enabled for size, enabled in seen}  # each size's last step
    assert sorted(measured) == [2, 4, 8, 16] and not any(measured.values())
    assert gc.isenabled()


@pytest.fixture
def torch_gpu(monkeypatch):
    return functools.partial(simulate_torch_gpu, monkeypatch)


def test_what_cycles_hold_is_counted_and_said(torch_gpu):
    # Each step leaves 1 MiB a sample in reference cycles (the block on an
    # H200 under Keras's PyTorch backend: its input and two activations, 0.75
    # MiB a sample), which the next step meets while the collector waits.
    model, x, y = tiny()
    gpu, _ = torch_gpu(model, name=BACKEND, cyclic_per_sample=MIB)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    held = gpu.per_sample + MIB  # the first step's cycles, in the second
    truth = max(b for b in range(2000)
                if gpu.in_use + gpu.static + held * b <= 16 * GIB)
    assert truth * 0.99 <= estimate.ceiling_batch_size <= truth
    recommended = estimate.predicted_batch_size
    assert gpu.in_use + gpu.static + held * recommended <= 0.9 * 16 * GIB
    assert all(t.cyclic_bytes == 2 * MIB * t.batch_size
               for t in estimate.trials if t.ran)
    largest = max(t.cyclic_bytes for t in estimate.trials if t.ran)
    assert f"Reference cycles held up to {format_bytes(largest)}" in estimate.explanation
    assert "keras-team/keras#23110" in estimate.explanation
    assert "keras_memwatch.CollectCycles()" in estimate.explanation
    assert gpu.cyclic == 0  # collected after the steps


def test_nothing_is_said_where_no_cycle_held_memory(torch_gpu):
    model, x, y = tiny()
    torch_gpu(model, name=BACKEND)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    assert all(t.cyclic_bytes == 0 for t in estimate.trials if t.ran)
    assert "Reference cycles" not in estimate.explanation
