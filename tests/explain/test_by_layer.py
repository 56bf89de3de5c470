"""`memory_by_layer` and `MemWatch.by_layer()` (issue 40): one row per layer
in call order and a row for the rest, each figure with its source; shapes
exact on every backend, PyTorch's saved tensors measured and checked against
the host's memory; shared layers, nested models, mixed precision and
`RematScope`; the model's state put back bit for bit; the summary's block."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

from conftest import arrays_of_shape, collector_paused, tiny_phi3
from keras_memwatch import MemWatch, memory_by_layer
from keras_memwatch.explain.layers import LOSS, REST, STEP_ROWS, UPDATE
from keras_memwatch.measure.device import tensorflow_cpu_pool

BACKEND = keras.backend.backend()
ROOT = Path(__file__).resolve().parents[2]
TORCH = pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's saved tensors")


def convnet():
    model = keras.Sequential([
        keras.Input((16, 16, 3)),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv_a"),
        keras.layers.BatchNormalization(name="norm"),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv_b"),
        keras.layers.MaxPooling2D(name="pool"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dropout(0.5, name="dropout"),
        keras.layers.Dense(10, name="logits"),
    ])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def transformer(seq=12, dim=16, vocab=40):
    tokens = keras.Input((seq,), dtype="int32")
    h = keras.layers.Embedding(vocab, dim)(tokens)
    a = keras.layers.MultiHeadAttention(2, dim // 2)(h, h)
    h = keras.layers.LayerNormalization()(keras.layers.Add()([h, a]))
    f = keras.layers.Dense(dim, activation="relu")(keras.layers.Dense(32)(h))
    h = keras.layers.LayerNormalization()(keras.layers.Add()([h, f]))
    out = keras.layers.Dense(vocab)(keras.layers.GlobalAveragePooling1D()(h))
    model = keras.Model(tokens, out)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def images(n=4):
    rng = np.random.default_rng(0)
    return rng.random((n, 16, 16, 3), dtype="float32"), np.zeros(n, "int32")


def tokens(n=4):
    return np.random.default_rng(0).integers(0, 40, (n, 12)).astype("int32"), \
        np.zeros(n, "int32")


def state_of(model):
    variables = (list(model.variables) + list(model.optimizer.variables)
                 + list(model.metrics_variables))
    return [(v.path, np.array(keras.ops.convert_to_numpy(v.value)).copy())
            for v in variables]


def layers_of(table):
    return table[~table["layer"].isin(STEP_ROWS)]


def expected_source():
    return {"torch": "measured", "jax": "plan"}.get(BACKEND, "shapes")


def output_bytes(shape, itemsize=4):
    return math.prod(shape) * itemsize


# -- rows: every layer, in call order ----------------------------------------


@pytest.mark.parametrize("build, data, batch", [(convnet, images, 32),
                                                (transformer, tokens, 8)],
                         ids=["convnet", "transformer"])
def test_a_row_per_layer_in_call_order_and_the_rest_last(build, data, batch):
    model = build()
    table = memory_by_layer(model, *data(), batch_size=batch)
    expected = [layer.name for layer in model.layers  # in call order, here
                if not isinstance(layer, keras.layers.InputLayer)]
    assert list(layers_of(table)["layer"]) == expected
    assert table["layer"].iloc[-1] == REST
    # The step's own rows: the loss, the update (where a step runs), the rest.
    steps = [LOSS, REST] if BACKEND == "tensorflow" else [LOSS, UPDATE, REST]
    assert list(table["layer"].iloc[-len(steps):]) == steps
    assert set(layers_of(table)["source"]) == {expected_source()}
    assert all(shape.startswith(f"({batch},")
               for shape in layers_of(table)["output_shape"])
    weights = sum(np.asarray(keras.ops.convert_to_numpy(v.value)).nbytes
                  for v in model.weights)
    assert table["param_bytes"].sum() == weights
    trainable = sum(np.asarray(keras.ops.convert_to_numpy(v.value)).nbytes
                    for v in model.trainable_weights)
    layers = layers_of(table)
    assert layers["grad_bytes"].sum() == trainable  # the loss's: of its outputs
    assert table["optimizer_bytes"].sum() == 2 * trainable  # Adam's two slots
    assert (layers["working_bytes"]
            == layers["activation_bytes"] + layers["grad_bytes"]).all()


def test_the_rows_add_up_to_the_step_where_it_is_measured():
    table = memory_by_layer(convnet(), *images(), batch_size=32)
    total = table.attrs["working_bytes"]
    if BACKEND == "tensorflow" and not tensorflow_cpu_pool():  # no statistics
        assert total is None and table["working_bytes"].isna().iloc[-1]
        assert "not measured" in table.attrs["working_source"]
    else:
        assert total > 0 and table["working_bytes"].sum() == total


@pytest.mark.skipif(BACKEND != "tensorflow", reason="PyTorch and JAX measure instead")
def test_shapes_give_each_layer_its_outputs_at_the_batch_size():
    table = memory_by_layer(convnet(), *images(), batch_size=32).set_index("layer")
    assert table.loc["conv_a", "output_shape"] == "(32, 16, 16, 8)"
    assert table.loc["conv_a", "activation_bytes"] == output_bytes((32, 16, 16, 8))
    assert table.loc["conv_b", "activation_bytes"] == output_bytes((32, 16, 16, 16))
    assert table.loc["pool", "activation_bytes"] == output_bytes((32, 8, 8, 16))
    # The logits are the loss's: the outputs and their log-softmax, and two
    # arrays of their gradient.
    assert table.loc["logits", "activation_bytes"] == 0
    assert table.loc[LOSS, "activation_bytes"] == 2 * output_bytes((32, 10))
    assert table.loc[LOSS, "grad_bytes"] == 2 * output_bytes((32, 10))
    assert table["measured_forward_bytes"].isna().all()
    assert table["measured_backward_bytes"].isna().all()


@pytest.mark.skipif(BACKEND != "torch",
                    reason="PyTorch alone may run a traced forward pass for real")
def test_shapes_leave_nothing_behind_where_pytorch_runs_the_forward_pass():
    """keras-hub's Phi-3 cannot run on PyTorch's meta device, so Keras runs
    its forward pass for real; the trace collects what that pass left in
    reference cycles (a spike's layer is named inside `fit`)."""
    from keras_memwatch.explain.layers.shapes import batch_spec, trace_step

    model, x, _ = tiny_phi3(vocabulary=97, sequence=16)
    with collector_paused():
        rows, outputs = trace_step(model, batch_spec(x, 3))
        assert ((3, 16, 97), "float32") in outputs and rows
        assert arrays_of_shape((3, 16, 97)) == 0


def test_mixed_precision_counts_activations_in_the_compute_dtype():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = convnet()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    table = memory_by_layer(model, *images(), batch_size=8).set_index("layer")
    assert table.loc["conv_a", "output_shape"] == "(8, 16, 16, 8) float16"
    assert table.loc["conv_a", "param_bytes"] == (3 * 3 * 3 * 8 + 8) * 4  # float32
    saves = output_bytes((8, 16, 16, 8), 2)
    if BACKEND == "torch":  # and the float16 copies of its input and kernel
        saves += output_bytes((8, 16, 16, 3), 2) + output_bytes((3, 3, 3, 8), 2)
    if BACKEND == "jax":  # XLA keeps float16 buffers of the output's size
        assert table.loc["conv_a", "activation_bytes"] % saves == 0
    else:
        assert table.loc["conv_a", "activation_bytes"] == saves


# -- JAX: XLA's plan -----------------------------------------------------------


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's plan of the JAX step")
def test_jax_charges_what_the_plan_keeps_for_the_backward_pass_to_layers():
    table = memory_by_layer(convnet(), *images(), batch_size=32).set_index("layer")
    assert set(table["source"].iloc[:-1]) == {"plan"}
    # A convolution keeps at least its output (for its ReLU's gradient).
    assert table.loc["conv_a", "activation_bytes"] >= output_bytes((32, 16, 16, 8))
    assert table.loc["conv_b", "activation_bytes"] >= output_bytes((32, 16, 16, 16))
    assert table.loc["flatten", "activation_bytes"] == 0  # a reshape: a bitcast
    assert table["activation_bytes"].sum() <= table.attrs["working_bytes"]


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's plan of the JAX step")
def test_jax_says_so_when_the_plan_cannot_be_read_and_uses_the_shapes(
        monkeypatch, caplog):
    from keras_memwatch.explain.layers import jax_plan

    def unreadable(hlo, is_loss, gpu=False):
        raise ValueError("an HLO text this parser does not know")

    monkeypatch.setattr(jax_plan, "read_plan", unreadable)
    with caplog.at_level("WARNING", logger="keras_memwatch"):
        table = memory_by_layer(convnet(), *images(), batch_size=32)
    assert set(table["source"].iloc[:-1]) == {"shapes"}
    assert "XLA's plan could not be read (ValueError: an HLO text" in caplog.text


# -- PyTorch: autograd's saved tensors ----------------------------------------


@TORCH
def test_pytorch_measures_what_each_layer_saves_for_the_backward_pass():
    table = memory_by_layer(convnet(), *images(), batch_size=32).set_index("layer")
    # The first convolution saves the batch it reads, its kernel in
    # PyTorch's layout (a copy) and its ReLU's output.
    assert table.loc["conv_a", "activation_bytes"] == (
        output_bytes((32, 16, 16, 3)) + output_bytes((3, 3, 3, 8))
        + output_bytes((32, 16, 16, 8)))
    # Flatten makes a view of a tensor saved already: a storage counts once.
    assert table.loc["flatten", "activation_bytes"] == 0
    layers = table[~table.index.isin(STEP_ROWS)]
    assert table.attrs["saved_bytes"] >= layers["activation_bytes"].sum()


@TORCH
def test_pytorch_saved_bytes_match_the_host_memory_held_at_the_backward_pass():
    """In a fresh process where glibc hands every block of 128 KiB or more
    straight back to the system (`MALLOC_MMAP_THRESHOLD_`), the host's
    resident memory follows the tensors alive: when the backward pass
    starts it holds what autograd saved, within 10%; the layers' share of
    the step's working memory is between 40% and 100% (the rest: the
    backward pass's gradients of activations, the loss, the batch)."""
    script = textwrap.dedent("""
        import keras, numpy as np
        from keras_memwatch import memory_by_layer
        from keras_memwatch.explain.layers import REST
        model = keras.Sequential([keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(), keras.layers.Flatten(),
            keras.layers.Dense(10)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
        x, y = np.ones((8, 32, 32, 3), "float32"), np.zeros(8, "int32")
        memory_by_layer(model, x, y, batch_size=64)  # the process's first step
        t = memory_by_layer(model, x, y, batch_size=64)
        layers = int(t[t.layer != REST].working_bytes.sum())  # and the loss
        print(t.attrs["saved_bytes"], t.attrs["held_at_backward_bytes"], layers,
              t.attrs["working_bytes"])
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", KERAS_BACKEND="torch",
                 PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]
    saved, held, layers, working = map(int, done.stdout.split()[-4:])
    assert abs(held - saved) <= 0.1 * saved, (held, saved)
    assert 0.4 * working <= layers <= working, (layers, working)


# -- shared layers, nested models, remat --------------------------------------


def shared_and_nested(remat=False):
    inner = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(8, name="inner_dense")], name="inner")
    shared = keras.layers.Dense(8, activation="tanh", name="shared")
    if remat:
        with keras.RematScope(mode="full"):
            last = keras.layers.Dense(4, activation="tanh", name="last")
    else:
        last = keras.layers.Dense(4, activation="tanh", name="last")
    x = keras.Input((8,))
    out = last(shared(inner(shared(x))))
    model = keras.Model(x, out)
    model.compile("sgd", "mse")
    return model


def dense_data(n=4):
    return np.ones((n, 8), "float32"), np.ones((n, 4), "float32")


def test_a_shared_layer_is_one_row_with_its_calls_and_its_weights_once():
    table = memory_by_layer(shared_and_nested(), *dense_data()).set_index("layer")
    assert table.loc["shared", "calls"] == 2
    assert table.loc["shared", "param_bytes"] == (8 * 8 + 8) * 4
    if BACKEND != "torch":  # the outputs of both calls are kept
        assert table.loc["shared", "activation_bytes"] == 2 * output_bytes((4, 8))


def test_a_nested_model_is_expanded_or_kept_whole():
    model = shared_and_nested()
    expanded = memory_by_layer(model, *dense_data())
    assert list(layers_of(expanded)["layer"]) == ["shared", "inner/inner_dense", "last"]
    whole = memory_by_layer(model, *dense_data(), expand_nested=False)
    assert list(layers_of(whole)["layer"]) == ["shared", "inner", "last"]
    assert whole.set_index("layer").loc["inner", "class"] == "Sequential"
    assert whole["param_bytes"].sum() == expanded["param_bytes"].sum()


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.head = keras.layers.Dense(4, name="head")  # made first, called last
        self.stem = keras.layers.Dense(8, activation="relu", name="stem")
        self.body = keras.Sequential([keras.layers.Dense(8, name="body_dense")],
                                     name="body")

    def call(self, x):
        h = self.stem(x)
        return self.head(self.body(h) + h)


def test_a_subclassed_model_gets_its_rows_in_call_order():
    model = Subclassed()
    model.compile("sgd", "mse")
    table = memory_by_layer(model, *dense_data())
    assert list(layers_of(table)["layer"]) == ["stem", "body/body_dense", "head"]
    assert layers_of(table)["output_shape"].tolist() == ["(4, 8)", "(4, 8)", "(4, 4)"]


@pytest.mark.skipif(BACKEND == "tensorflow", reason="Keras's RematScope does not "
                    "trace in a TensorFlow graph (tf.custom_gradient with keywords)")
def test_a_rematerialized_layer_is_marked_and_pytorch_sees_it_keep_nothing():
    table = memory_by_layer(shared_and_nested(remat=True), *dense_data())
    table = table.set_index("layer")
    assert bool(table.loc["last", "remat"]) and not bool(table.loc["shared", "remat"])
    if BACKEND == "torch":
        assert table.loc["last", "activation_bytes"] == 0


# -- the model's state --------------------------------------------------------


def test_the_model_state_is_put_back_bit_for_bit():
    model = convnet()
    x, y = images(16)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # trained a little
    before = state_of(model)
    memory_by_layer(model, x, y, batch_size=16)
    after = state_of(model)
    assert [p for p, _ in before] == [p for p, _ in after]
    for (path, a), (_, b) in zip(before, after):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), path


def test_a_model_that_is_not_compiled_is_refused():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="Expected `model` to be a compiled model"):
        memory_by_layer(model, np.ones((2, 8), "float32"))


# -- the watch ----------------------------------------------------------------


class Batches(keras.utils.PyDataset):
    """Batches of 8 images, one of 32."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return images(32 if i == 4 else 8)


def test_the_watch_splits_its_fit_and_the_summary_shows_the_top_layers():
    model = convnet()
    watch = MemWatch(probes="host", verbose=0)
    model.fit(Batches(), shuffle=False, callbacks=[watch], verbose=0)
    assert "call" not in vars(model)  # the fit's shapes were noted, and let go
    assert "Where a step's working memory goes" not in watch.summary()
    before = state_of(model)
    batch = None if BACKEND != "tensorflow" else 8  # TF traced batch `None`
    table = watch.by_layer(batch_size=batch)
    assert [s for s, _ in state_of(model)] == [s for s, _ in before]
    assert all(a.tobytes() == b.tobytes() for (_, a), (_, b)
               in zip(before, state_of(model)))
    assert list(layers_of(table)["layer"]) == [layer.name for layer in model.layers]
    assert layers_of(table)["output_shape"].iloc[0] == "(8, 16, 16, 8)"
    summary = watch.summary()
    block = summary.split("Where a step's working memory goes (by layer):\n", 1)[1]
    assert block.splitlines()[0].startswith("  conv_b (Conv2D, (8, 16, 16, 16)): ")
    assert REST in block
    if BACKEND != "tensorflow":  # TensorFlow traces its step once, batch `None`
        assert ("where the input grew from (8, 16, 16, 3) to (32, 16, 16, 3), the "
                "activations of conv_b grew most") in block


def test_a_watch_that_saw_no_fit_says_what_to_call_instead():
    with pytest.raises(ValueError, match="memory_by_layer"):
        MemWatch(probes="host", verbose=0).by_layer()
