"""CollectCycles frees what reference cycles hold, when training begins and
every `every` batches after."""

from __future__ import annotations

import logging
import weakref

import keras
import numpy as np
import pytest

from conftest import arrays_of_shape, collector_paused, tensors_left_by, tiny_phi3
from keras_memwatch import CollectCycles


class Part:
    """A weakly referenceable member of a reference cycle."""


class MakesCycles(keras.callbacks.Callback):
    """Leaves one reference cycle per batch, as Keras's PyTorch steps do."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[weakref.ref] = []

    def on_train_batch_end(self, batch, logs=None):
        part = Part()
        part.me = part
        self.made.append(weakref.ref(part))


def fit(callbacks, epochs=2, samples=7):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((samples, 3), "float32")
    y = np.zeros((samples, 2), "float32")
    model.fit(x, y, batch_size=1, epochs=epochs, verbose=0, callbacks=callbacks)


@pytest.mark.parametrize("every", [0, -3, 2.5, True, "50", None])
def test_every_must_be_a_positive_whole_number_of_batches(every):
    with pytest.raises(ValueError, match=r"`every` must be a positive integer.*every=50"):
        CollectCycles(every=every)


def test_collects_every_n_batches_across_epochs_and_frees_the_cycles(caplog):
    maker, collect = MakesCycles(), CollectCycles(every=3)
    with collector_paused():  # only CollectCycles collects
        with caplog.at_level(logging.INFO, logger="keras_memwatch"):
            fit([maker, collect])  # 2 epochs of 7 batches
        alive = [i for i, ref in enumerate(maker.made) if ref() is not None]
    assert len(maker.made) == 14
    assert collect.collections == 5  # at the start, after batches 3, 6, 9 and 12
    assert alive == [12, 13]  # the cycles made after the last collection
    assert collect.objects_freed >= 12 and collect.seconds > 0
    assert "CollectCycles: 5 collections in 14 batches" in caplog.text


def test_counts_start_again_with_each_fit():
    collect = CollectCycles(every=5)
    fit([collect], epochs=1)
    fit([collect], epochs=1)
    assert collect.collections == 2  # the start and after 5 of 7 batches, not 14 // 5


def test_reads_no_logs_so_keras_need_not_wait_for_the_step():
    assert CollectCycles.async_safe is True


def test_on_pytorch_it_frees_what_keras_leaves_in_cycles():
    if keras.backend.backend() != "torch":
        pytest.skip("the cycles are Keras's PyTorch backend's")
    without = tensors_left_by([])
    if without == 0:
        pytest.skip("this Keras leaves no tensor in cycles (keras-team/keras#23110 fixed)")
    assert without >= 23  # at least one a step: they pile up until a collection
    assert tensors_left_by([CollectCycles(every=5)]) <= 3 * (23 % 5)  # since the last one


class CountsLogits(keras.callbacks.Callback):
    """Counts the arrays of the logits' shape alive when training begins."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.alive = shape, None

    def on_train_begin(self, logs=None):
        self.alive = arrays_of_shape(self.shape)


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="PyTorch alone builds on the meta device, or eagerly")
@pytest.mark.parametrize("collect", [False, True])
def test_frees_the_forward_pass_of_kerass_build_before_the_first_step(collect):
    """keras-hub's Phi-3 cannot run on PyTorch's meta device, so a first `fit`
    builds it by running its forward pass at the batch's shape, and leaves
    the logits in reference cycles for the first step to hold beside its own."""
    model, x, y = tiny_phi3(vocabulary=97, sequence=16)
    counts = CountsLogits((3, 16, 97))
    callbacks = [CollectCycles(every=1000), counts] if collect else [counts]
    with collector_paused():
        model.fit(x, y, batch_size=3, epochs=1, verbose=0, callbacks=callbacks)
    assert (counts.alive == 0) if collect else (counts.alive >= 1)
