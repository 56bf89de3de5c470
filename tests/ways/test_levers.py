"""Which layers `keras.RematScope` can recompute on each backend, and which
levers can be pulled together: the rules are Keras's, so each backend's is
checked here whatever backend runs the test."""

from __future__ import annotations

import keras
import pytest

from keras_memwatch.ways.levers import (MIXED_REMAT_BACKENDS, all_levers, compatible,
                                        why_not_recomputable)

BACKEND = keras.backend.backend()


def built(layer, shape=(4, 8)):
    layer.build(shape)
    return layer


@pytest.fixture
def mixed_policy():
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy(before)


def test_a_layer_without_keywords_is_recomputed_everywhere_in_float32():
    for layer in (built(keras.layers.Conv1D(4, 1), (4, 8, 2)), keras.layers.ReLU()):
        for backend in ("jax", "tensorflow", "torch"):
            assert why_not_recomputable(layer, backend) == ""


def test_on_tensorflow_a_layer_given_keywords_is_not_recomputed():
    # Keras passes `training` to every layer whose call takes it (Dense
    # does, unused); JAX traces it, and only a layer that branches on it
    # fails there, which shows only in a step (`ways.run._measured`)
    for layer in (built(keras.layers.Dense(4)), built(keras.layers.BatchNormalization()),
                  keras.layers.Dropout(0.1)):
        assert "keywords" in why_not_recomputable(layer, "tensorflow")
        assert why_not_recomputable(layer, "jax") == ""
        assert why_not_recomputable(layer, "torch") == ""


def test_under_a_mixed_policy_cast_weights_are_not_recomputed_on_tf_or_torch(
        mixed_policy):
    conv = built(keras.layers.Conv1D(4, 1), (4, 8, 2))
    for backend in MIXED_REMAT_BACKENDS:
        assert "keras-team/keras#21448" in why_not_recomputable(conv, backend)
    assert why_not_recomputable(conv, "jax") == ""
    # BatchNormalization reads its weights in float32, uncast
    assert why_not_recomputable(built(keras.layers.BatchNormalization()),
                                "torch") == ""
    # no weights, nothing to cast
    assert why_not_recomputable(keras.layers.ReLU(), "torch") == ""


def test_recomputation_and_mixed_precision_go_together_only_on_jax():
    levers = {lever.name: lever for lever in all_levers()}
    pair = [levers["mixed_precision"], levers["remat_layers"]]
    assert compatible(pair) == (BACKEND not in MIXED_REMAT_BACKENDS)
    assert compatible([levers["mixed_precision"], levers["gradient_accumulation"]])
    assert not compatible([levers["remat"], levers["remat_layers"]])
    assert not compatible([levers["adafactor"], levers["sgd_momentum"]])


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
