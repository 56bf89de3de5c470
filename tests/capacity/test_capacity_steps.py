"""Real steps as a size's measure: on a GPU they stand for a job's first
steps, on the host for one step met by the same garbage every time."""

from __future__ import annotations

import gc
import logging
import weakref

import keras
import numpy as np
import pytest

from conftest import arrays_of_shape, collector_paused, tiny_phi3
from keras_memwatch.capacity import steps
from keras_memwatch.measure.batches import Batches


class FakeDevice:
    backend = "fake"  # not torch: nothing to synchronize
    name = "GPU:0"
    gpu_index = 0
    peak_words = "the allocator's peak"

    def __init__(self, on_gpu: bool, events: list[str]):
        self.on_gpu = on_gpu
        self.events = events
        self.used = 0

    def in_use(self) -> int:
        return self.used

    def limit(self, in_use: int):
        return 2**30, "a cap", True

    def read(self) -> None:
        self.events.append("peaks reset")

    def need(self, in_use: int) -> int:
        return 2**20


def _sequence(monkeypatch, on_gpu: bool, builds_first: bool = False,
              build=None) -> list[str]:
    events: list[str] = []
    monkeypatch.setattr(steps, "fit_steps",
                        lambda model, batch, n: events.append(f"{n} step(s)"))
    monkeypatch.setattr(steps.Steps, "_clean", lambda self: events.append("freed"))
    monkeypatch.setattr(steps, "build_as_a_first_fit",
                        build or (lambda model, x: events.append("built")))
    data = Batches(np.zeros((4, 2), "float32"), np.zeros((4,), "float32"))
    device = FakeDevice(on_gpu, events)
    strategy = steps.Steps(object(), data, device, lambda line: None)
    strategy.builds_first = builds_first  # PyTorch on a GPU
    events.clear()  # building and warming up the model
    for _ in range(2):
        [observation] = strategy.check([8])
        assert observation.ran and observation.need_bytes == 2**20
    return events


def test_on_a_gpu_a_sizes_steps_are_a_new_jobs_first_steps(monkeypatch):
    """From a freed cache; Keras's build at that shape (PyTorch), the first
    step, then the measured steps with nothing freed between them, so that
    they meet the blocks the first step split and what it left in reference
    cycles."""
    job = ["freed", "built", "1 step(s)", "peaks reset", f"{steps.GPU_STEPS} step(s)"]
    assert _sequence(monkeypatch, on_gpu=True, builds_first=True) == job * 2
    assert steps.GPU_STEPS >= 3


def test_steps_the_allocator_retried_in_give_their_need_but_no_step_time(
        monkeypatch):
    """Near its cap PyTorch's caching allocator frees its cache and retries
    an allocation, which slows that step by an amount of its own: such a
    size keeps its need, and no step time."""
    monkeypatch.setattr(steps, "fit_steps", lambda model, batch, n: None)
    monkeypatch.setattr(steps.Steps, "_clean", lambda self: None)
    retries = iter([0, 0, 0, 2])  # read before and after each size's steps
    monkeypatch.setattr(steps.Steps, "_retries", lambda self: next(retries))
    data = Batches(np.zeros((4, 2), "float32"), np.zeros((4,), "float32"))
    strategy = steps.Steps(object(), data, FakeDevice(True, []), lambda line: None)
    at_ease, retried = strategy.check([8, 16])
    assert at_ease.step_seconds is not None
    assert retried.ran and retried.need_bytes == 2**20
    assert retried.step_seconds is None


def test_a_step_that_found_the_device_full_under_the_cap_is_said(monkeypatch, caplog):
    """Other processes filled the device before this process reached its
    cap: the size reads out of memory, and a warning says the answers may
    read low."""
    from conftest import TORCH_MESSAGE  # 1.06 GiB free, 2.00 GiB asked

    monkeypatch.setattr(steps, "fit_steps", lambda model, batch, n: None)
    monkeypatch.setattr(steps.Steps, "_clean", lambda self: None)
    data = Batches(np.zeros((4, 2), "float32"), np.zeros((4,), "float32"))
    lines: list[str] = []
    strategy = steps.Steps(object(), data, FakeDevice(True, []), lines.append)
    strategy.cap_fits_device = True  # PyTorch: the card had room for the cap

    def full(model, batch, n):
        raise MemoryError(TORCH_MESSAGE)

    monkeypatch.setattr(steps, "fit_steps", full)
    with caplog.at_level(logging.WARNING, logger="keras_memwatch"):
        first, second = strategy.check([8, 16])
    assert not first.ran and not second.ran
    assert lines[0].endswith("out of memory (the device was full)")
    said = [r for r in caplog.records if "other processes hold the device" in r.message]
    assert len(said) == 1 and "answers may read low" in said[0].message


def test_on_the_host_the_measured_step_starts_clean_after_the_first(monkeypatch):
    assert _sequence(monkeypatch, on_gpu=False) == [
        "1 step(s)", "freed", "peaks reset", "1 step(s)"] * 2


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="PyTorch alone builds on the meta device, or eagerly")
def test_what_kerass_build_leaves_stays_through_the_measured_steps(monkeypatch):
    """In a job only a full collection frees what the build left, and none
    may come for many steps: the measured steps meet it whatever the
    collector does meanwhile, and the next size starts without it."""
    import torch

    phi3, x, y = tiny_phi3(vocabulary=97, sequence=16)
    left: list[weakref.ref] = []  # the build's logits
    alive: list[int] = []

    def build(model, x):
        steps_build(model, x)
        left.extend(weakref.ref(t) for t in gc.get_objects()
                    if issubclass(type(t), torch.Tensor)
                    and tuple(t.shape) == (3, 16, 97))

    def fit_steps(model, batch, n):
        gc.collect()
        alive.append(sum(ref() is not None for ref in left))

    steps_build = steps.build_as_a_first_fit
    monkeypatch.setattr(steps, "build_as_a_first_fit", build)
    monkeypatch.setattr(steps, "fit_steps", fit_steps)
    strategy = steps.Steps(phi3, Batches(x, y), FakeDevice(True, []), lambda line: None)
    strategy.builds_first = True
    alive.clear()  # the warm-up
    strategy.check([3])
    assert left and alive == [len(left)] * 2  # the first step, the measured ones
    strategy._clean()
    assert all(ref() is None for ref in left)


def test_the_explanation_says_what_the_build_left_and_how_to_free_it(monkeypatch):
    """Where Keras's build leaves arrays, the answers hold them, and the
    measure's words say how much and that CollectCycles frees them; where it
    leaves nothing (its forward pass ran on the meta device), they do not."""
    device = FakeDevice(True, [])

    def build(model, x):  # leaves 3 MiB a sample, as eager logits would
        device.used += 3 * 2**20 * len(x)

    monkeypatch.setattr(steps, "fit_steps", lambda model, batch, n: None)
    monkeypatch.setattr(steps.Steps, "_clean", lambda self: None)
    data = Batches(np.zeros((4, 2), "float32"), np.zeros((4,), "float32"))
    for build_leaves in (False, True):
        monkeypatch.setattr(steps, "build_as_a_first_fit",
                            build if build_leaves else (lambda model, x: None))
        strategy = steps.Steps(object(), data, device, lambda line: None)
        strategy.builds_first = True
        strategy.check([8, 16, 4])
        if build_leaves:
            assert strategy.build_left == (16, 48 * 2**20)
            assert "left 48.0 MiB at batch 16 in reference cycles" in strategy.words
            assert "`keras_memwatch.CollectCycles()`" in strategy.words
        else:
            assert strategy.build_left == (0, 0)
            assert strategy.words == "the allocator's peak of real steps"


def test_on_pytorch_the_explanation_says_keras_holds_steps_arrays_and_the_fix(
        monkeypatch, tree_functions_restored):
    """On a GPU under PyTorch, where this Keras holds a step's arrays in
    reference cycles, the words say so and name `break_tree_cycles`; once
    the fix is in, or on another backend, they do not."""
    from keras_memwatch import break_tree_cycles
    from keras_memwatch.configure.tree_cycles import tree_holds_cycles

    monkeypatch.setattr(steps, "fit_steps", lambda model, batch, n: None)
    monkeypatch.setattr(steps.Steps, "_clean", lambda self: None)
    device = FakeDevice(True, [])
    device.backend = keras.backend.backend()
    data = Batches(np.zeros((4, 2), "float32"), np.zeros((4,), "float32"))

    def words():
        return steps.Steps(object(), data, device, lambda line: None).words

    held = keras.backend.backend() == "torch" and tree_holds_cycles()
    assert ("`keras_memwatch.break_tree_cycles()` before `fit`" in words()) is held
    if held:
        assert "keras-team/keras#23110" in words()
        break_tree_cycles()
    assert words() == "the allocator's peak of real steps"


def test_a_build_that_fails_is_said_once_and_the_sizes_measured_without_it(
        monkeypatch, caplog):
    def failing(model, x):
        raise ValueError("cannot build from shapes")

    with caplog.at_level(logging.WARNING, logger="keras_memwatch"):
        events = _sequence(monkeypatch, on_gpu=True, builds_first=True, build=failing)
    assert events.count("1 step(s)") == 2
    [record] = caplog.records
    assert "raised ValueError; sizes are measured without it" in record.getMessage()


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="PyTorch alone builds on the meta device, or eagerly")
def test_a_first_fits_build_leaves_the_forward_pass_where_the_meta_device_fails():
    """keras-hub's Phi-3 cannot run on PyTorch's meta device, so Keras's build
    runs it eagerly and leaves its logits in reference cycles, as a new
    process's first `fit` leaves them for its first step; a model that runs
    on the meta device leaves nothing."""
    phi3, x, _ = tiny_phi3(vocabulary=97, sequence=16)
    logits = (3, 16, 97)
    dense = keras.Sequential([keras.Input((16, 8)), keras.layers.Dense(97)])
    with collector_paused():
        steps.build_as_a_first_fit(phi3, x)
        assert arrays_of_shape(logits) >= 1
        gc.collect()
        assert arrays_of_shape(logits) == 0
        steps.build_as_a_first_fit(dense, np.zeros((3, 16, 8), "float32"))
        assert arrays_of_shape(logits) == 0
