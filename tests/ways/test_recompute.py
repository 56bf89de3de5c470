"""Which layers `keras.RematScope` can recompute on each backend (the rules
are Keras's, so each backend's is checked here whatever backend runs the
test), and which of them recomputing spares the most."""

from __future__ import annotations

import keras
import pytest

from keras_memwatch.ways.recompute import (MIXED_REMAT_BACKENDS, containing, heaviest,
                                           refused_when_traced, why_not_recomputable)


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
    for layer in (built(keras.layers.Dense(4)),
                  built(keras.layers.BatchNormalization()), keras.layers.Dropout(0.1)):
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


#: A by-layer table with its blocks expanded: what each layer keeps itself.
ROWS = [("embed", 4.0),
        ("block_0", 1.0), ("block_0/attention", 6.0), ("block_0/dense", 8.0),
        ("block_0/dropout", 2.0),
        ("block_1", 1.0), ("block_1/attention", 6.0), ("block_1/dense", 8.0),
        ("block_1/dropout_1", 2.0),
        ("head", 2.0)]


def test_the_heaviest_are_whole_blocks_first_to_half_of_all():
    # each block keeps 17 with its layers, of 40 in all
    assert heaviest(ROWS, set()) == ["block_0", "block_1"]


def test_a_block_left_out_leaves_its_layers_named_by_name_across_blocks():
    # `dense` is one name for both blocks' layers: the scope matches names
    assert heaviest(ROWS, {"block_0", "block_1"}) == ["dense", "attention"]
    assert heaviest(ROWS, {"block_0", "block_1", "dense"}) == [
        "attention", "embed", "dropout"]


def test_nothing_to_name_where_every_layer_is_left_out_or_keeps_nothing():
    assert heaviest(ROWS, {path.split("/")[-1] for path, _ in ROWS}) == []
    assert heaviest([("a", 0.0), ("b", 0.0)], set()) == []


def test_a_layer_holding_one_left_out_is_left_out_at_any_depth():
    leaf = keras.layers.Dropout(0.1, name="drop")
    block = keras.Sequential([keras.layers.Dense(4, name="dense"), leaf], name="block")
    inputs = keras.Input((4,))
    outer = keras.Model(inputs, block(inputs), name="outer")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(outer(inputs)))
    assert containing(model, {"drop"}) == {"block": "Dropout", "outer": "Dropout"}
    assert containing(model, {"head"}) == {}


def test_only_jax_refusing_a_traced_value_leaves_a_layer_out():
    traced = type("TracerBoolConversionError", (TypeError,), {})
    assert refused_when_traced(traced("Attempted boolean conversion"))
    assert not refused_when_traced(ValueError("a bug in a layer"))
