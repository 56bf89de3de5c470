"""Which levers can be pulled together, the code a combination says to
write, and what a recomputation that met Keras's uncast weights says to do."""

from __future__ import annotations

import keras

from keras_memwatch.measure.batches import Batches
from keras_memwatch.ways.levers import Situation, all_levers, changes, compatible
from keras_memwatch.ways.recompute import MIXED_REMAT_BACKENDS

BACKEND = keras.backend.backend()


def test_recomputation_and_mixed_precision_go_together_only_on_jax():
    levers = {lever.name: lever for lever in all_levers()}
    pair = [levers["mixed_precision"], levers["remat_layers"]]
    assert compatible(pair) == (BACKEND not in MIXED_REMAT_BACKENDS)
    assert compatible([levers["mixed_precision"], levers["gradient_accumulation"]])
    assert not compatible([levers["remat"], levers["remat_layers"]])
    assert not compatible([levers["adafactor"], levers["sgd_momentum"]])


def test_a_new_optimizer_with_gradient_accumulation_is_the_one_that_accumulates():
    import numpy as np

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    s = Situation(model, Batches(np.zeros((8, 4)), np.zeros((8, 2))), batch_size=32)
    levers = {lever.name: lever for lever in all_levers()}
    accumulation = levers["gradient_accumulation"]
    assert changes([accumulation], s) == (
        "Adam(..., gradient_accumulation_steps=2); model.fit(..., batch_size=16)")
    assert changes([levers["adafactor"], accumulation], s) == (
        "model.compile(optimizer=keras.optimizers.Adafactor("
        "gradient_accumulation_steps=2), ...)  # was Adam; "
        "model.fit(..., batch_size=16)")
    assert "SGD(momentum=0.9, gradient_accumulation_steps=2)" in changes(
        [accumulation, levers["sgd_momentum"]], s)
    assert changes([levers["sgd_momentum"]], s) == (
        "model.compile(optimizer=keras.optimizers.SGD(momentum=0.9), ...)  # was Adam")


def test_a_recomputation_that_met_uncast_weights_says_why():
    remat = {lever.name: lever for lever in all_levers()}["remat"]
    tf_words = ("Input 'filter' of 'Conv2D' Op has type float32 that does not "
                "match type float16 of argument 'input'.")
    torch_words = ("torch.utils.checkpoint: Recomputed values for the following "
                   "tensors have different metadata than during the forward pass.\n"
                   "saved metadata: {'dtype': torch.float16}")
    for words in (tf_words, torch_words):
        hint = remat.failure_hint(TypeError(words))
        assert "keras-team/keras#21448" in hint and "recompute on JAX" in hint
    assert remat.failure_hint(TypeError("shapes do not match")) == ""


def test_a_recomputation_that_raised_says_what_to_do_on_each_backend():
    remat = {lever.name: lever for lever in all_levers()}["remat"]
    traced = type("TracerBoolConversionError", (TypeError,), {})
    assert "keep the layer out of the scope" in remat.failure_hint(
        traced("Attempted boolean conversion of traced array"))
    keywords = ValueError("The custom_gradient decorator currently supports keywords "
                          "arguments only when eager execution is enabled.")
    assert "run_eagerly=True" in remat.failure_hint(keywords)
