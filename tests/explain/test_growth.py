"""Which layer grew: from shapes between two inputs, and named live for a
spike whose batch had an unusual input shape."""

import logging
import time

import keras
import numpy as np
import pytest

from conftest import scripted
from keras_memwatch import MemWatch
from keras_memwatch.explain.layers import LOSS
from keras_memwatch.explain.layers.growth import growth

BACKEND = keras.backend.backend()
LONG = (6, 12)  # the batches of 256-step sequences; the others have 16


def sequence_model():
    inputs = keras.Input((None, 4))
    h = keras.layers.Dense(8, name="narrow")(inputs)
    h = keras.layers.Dense(256, name="wide")(h)
    h = keras.layers.GlobalAveragePooling1D(name="pool")(h)
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(h))
    model.compile(optimizer="adam", loss="mse")
    return model


class Sequences(keras.utils.PyDataset):
    """16 batches of 8 sequences: 16 steps long, 256 at the `LONG` batches."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        steps = 256 if i in LONG else 16
        return (np.ones((8, steps, 4), "float32"), np.ones((8, 1), "float32"))


def sequences():
    """`Sequences`, where TensorFlow is told that their length varies."""
    if BACKEND != "tensorflow":
        return Sequences()
    import tensorflow as tf

    return tf.data.Dataset.from_generator(
        lambda: (Sequences()[i] for i in range(16)),
        output_signature=(tf.TensorSpec((8, None, 4)), tf.TensorSpec((8, 1)))
    ).apply(tf.data.experimental.assert_cardinality(16))


def test_growth_names_the_layer_whose_outputs_grew_most():
    model = sequence_model()
    found = growth(model, keras.KerasTensor((8, 16, 4)), keras.KerasTensor((8, 256, 4)))
    assert found.layer == "wide"
    assert (found.before_bytes, found.after_bytes) == (8 * 16 * 256 * 4, 8 * 256 * 256 * 4)
    assert (found.before_shape, found.after_shape) == ((8, 16, 4), (8, 256, 4))
    assert found.message == ("the activations of wide grew most: 128.0 KiB -> 2.0 MiB "
                             "(from shapes)")


def test_growth_is_none_where_nothing_grew():
    model = sequence_model()
    assert growth(model, keras.KerasTensor((8, 16, 4)), keras.KerasTensor((8, 16, 4))) is None


def test_a_spike_at_an_unusual_input_shape_names_its_layer(memwatch_logs):
    working = [400 if b in LONG else 40 for b in range(16)]
    probe = scripted(working)
    events = []
    watch = MemWatch(probes=[probe], on_spike=events.append)
    sequence_model().fit(sequences(), epochs=1, callbacks=[watch], verbose=0,
                             shuffle=False)
    named = [r.getMessage() for r in memwatch_logs.records if "came with input" in r.getMessage()]
    assert events and 12 in [e.batch for e in events]
    if BACKEND == "tensorflow":
        # A compiled TensorFlow step calls the model only while tracing:
        # no batch's shape is known, so nothing is named.
        assert named == [] and all(e.layer is None for e in events)
        return
    assert [e.layer for e in events] == ["wide"] * len(events)
    assert watch.spikes["layer"].tolist() == ["wide"] * len(events)  # kept
    first = min(e.batch for e in events)
    assert named == [
        f"memory spike at epoch 0 batch {first} came with input shape (8, 256, 4), "
        "where most batches had (8, 16, 4): the activations of wide grew most: "
        "128.0 KiB -> 2.0 MiB (from shapes)"]
    assert "call" not in vars(watch.model)  # the model's own call again


def test_a_spike_at_the_usual_shape_names_no_layer(memwatch_logs):
    working = [400 if b == 9 else 40 for b in range(16)]
    probe = scripted(working)
    events = []
    watch = MemWatch(probes=[probe], on_spike=events.append)
    sequence_model().fit(sequences(), epochs=1, callbacks=[watch], verbose=0,
                             shuffle=False)
    assert [(e.batch, e.layer) for e in events] == [(9, None)]
    assert "came with input" not in memwatch_logs.text


def test_a_spike_is_named_in_the_middle_of_an_epoch(memwatch_logs):
    # Under JAX a fit keeps the variables' values out of the model until the
    # epoch ends; slow batches after the spike let it be named before then.
    fetched = []

    class Slow(Sequences):
        def __getitem__(self, i):
            fetched.append(i)
            if i > LONG[0]:
                time.sleep(0.1)
            return super().__getitem__(i)

    if BACKEND == "tensorflow":
        pytest.skip("no batch's shape is known under TensorFlow")
    working = [400 if b in LONG else 40 for b in range(16)]
    probe = scripted(working)
    named = []
    watch = MemWatch(probes=[probe], on_spike=lambda e: named.append(
        (e.batch, e.layer, max(fetched))))
    sequence_model().fit(Slow(), epochs=1, callbacks=[watch], verbose=0, shuffle=False)
    batch, layer, fetched_then = named[0]
    assert fetched_then < 15  # named in the middle of the epoch
    assert batch in LONG and layer == "wide"


def test_growth_names_the_loss_where_the_logits_grew_most():
    # A language model's logits (sequence x vocabulary) outgrow every layer
    # as the sequence grows: the loss keeps them and their gradient.
    tokens = keras.Input((None,), dtype="int32")
    h = keras.layers.Embedding(1000, 16, name="embed")(tokens)
    h = keras.layers.Dense(64, activation="relu", name="hidden")(h)
    model = keras.Model(tokens, keras.layers.Dense(1000, name="logits")(h))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    found = growth(model, keras.KerasTensor((4, 16), "int32"),
                   keras.KerasTensor((4, 256), "int32"))
    logits = 4 * 1000 * 4  # bytes per token
    assert found.layer == LOSS
    assert (found.before_bytes, found.after_bytes) == (4 * 16 * logits, 4 * 256 * logits)
    assert found.message == ("the loss's logits and their gradient grew most: "
                             "1000.0 KiB -> 15.6 MiB (from shapes)")


class Tokens(keras.utils.PyDataset):
    """16 batches of 4 token sequences: 16 tokens long, 256 at the `LONG`
    batches; the targets are the tokens."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        tokens = np.ones((4, 256 if i in LONG else 16), "int32")
        return tokens, tokens


def test_a_spike_at_a_longer_sequence_names_the_loss(memwatch_logs):
    if BACKEND == "tensorflow":
        pytest.skip("no batch's shape is known under TensorFlow")
    tokens = keras.Input((None,), dtype="int32")
    h = keras.layers.Embedding(1000, 16, name="embed")(tokens)
    model = keras.Model(tokens, keras.layers.Dense(1000, name="logits")(h))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    probe = scripted([400 if b in LONG else 40 for b in range(16)])
    events = []
    watch = MemWatch(probes=[probe], on_spike=events.append)
    model.fit(Tokens(), epochs=1, callbacks=[watch], verbose=0, shuffle=False)
    assert events and {e.layer for e in events} == {LOSS}
    assert "came with input shape (4, 256), where most batches had (4, 16): the " \
           "loss's logits and their gradient grew most" in memwatch_logs.text
