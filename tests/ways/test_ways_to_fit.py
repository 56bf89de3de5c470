"""`ways_to_fit` on the CPU: each lever measured on the user's own model at
the wanted batch (XLA's plans on JAX; the host's peak resident memory of
real steps on PyTorch and TensorFlow, hence generous ratios), the model
left as it was, bad arguments refused before any work."""

from __future__ import annotations

import ast
import re
import time

import keras
import numpy as np
import pandas as pd
import pytest

from conftest import tiny_gpt2
from keras_memwatch.explain.ways_text import format_ways
from keras_memwatch.ways import LEVER_NAMES, ways_to_fit

BACKEND = keras.backend.backend()
MIB = 2**20


def read_loosely(row):
    """Whether `row`'s bytes come from TensorFlow's CPU allocator, whose
    reading of a step moves by up to twice with the order its threads run
    the backward ops and with what the process ran before (docs/capacity.md,
    "The host's heap"): no share of such a need is asked of it."""
    return BACKEND == "tensorflow" and row["how"].startswith("measured")


def state_of(model):
    variables = (list(model.variables) + list(model.optimizer.variables)
                 + list(model.metrics_variables))
    return [(v.path, np.array(keras.ops.convert_to_numpy(v.value)).copy())
            for v in variables]


def wide_model():
    """Parameters dominate: 6M weights, 24 MiB a slot of Adam's."""
    model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(2048),
                              keras.layers.Dense(2048), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    return model


def sequence_model():
    """Activations dominate: 64 x 2048 floats a sample, kept by the wide layer."""
    model = keras.Sequential([
        keras.Input((64, 32)),
        keras.layers.Dense(2048, activation="relu"),
        keras.layers.Dense(64),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def sequence_data(n=8):
    rng = np.random.default_rng(0)
    return (rng.normal(size=(n, 64, 32)).astype("float32"),
            rng.integers(0, 10, size=(n,)).astype("int32"))


def row(table, lever):
    rows = table[table["lever"] == lever]
    assert len(rows) == 1, list(table["lever"])
    return rows.iloc[0]


def test_the_optimizer_levers_save_one_or_two_slots_of_the_weights():
    model = wide_model()
    x = np.ones((8, 1024), "float32")
    y = np.zeros((8, 4), "float32")
    model.fit(x, y, verbose=0)
    before, function = state_of(model), model.train_function
    policy = keras.config.dtype_policy().name
    table = ways_to_fit(model, x, y, batch_size=8, levers=["adafactor", "sgd_momentum"],
                        combinations=False)
    assert list(table.columns) == ["lever", "change", "need_bytes", "saved_bytes",
                                   "largest_batch", "step_time_ratio", "fits", "how",
                                   "notes"]
    slot = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    assert row(table, "as is")["need_bytes"] > 3 * slot  # weights and two slots
    # A slot of state (Keras's Adafactor keeps a full-size velocity beside
    # its factored moments), and on PyTorch more: Keras's Adam updates
    # every weight at once there (`torch._foreach_*`), each op's result a
    # temporary the size of all weights (XLA fuses them).
    fused = row(table, "as is")["how"] == "plan"
    most = 1.5 if fused else 8.0
    sgd = row(table, "sgd_momentum")
    if read_loosely(sgd):
        assert sgd["saved_bytes"] < most * slot
    else:
        assert 0.6 * slot < sgd["saved_bytes"] < most * slot
    adafactor = row(table, "adafactor")["saved_bytes"]
    if fused:
        assert 0.6 * slot < adafactor < 2.5 * slot
    else:  # its update runs weight by weight, each op a full-size temporary
        assert -2.0 * slot < adafactor < (most + 1) * slot
    assert list(table["lever"])[0] == "as is"
    savings = list(table["saved_bytes"][1:])
    assert savings == sorted(savings, reverse=True)
    assert "Adafactor()" in row(table, "adafactor")["change"]
    # nothing changed: state, compiled function, global policy
    after = state_of(model)
    assert [p for p, _ in before] == [p for p, _ in after]
    assert all(a.tobytes() == b.tobytes() for (_, a), (_, b) in zip(before, after))
    assert model.train_function is function
    assert keras.config.dtype_policy().name == policy
    text = format_ways(table)
    assert "Ways to fit a batch of 8" in text and "adafactor" in text


def test_mixed_precision_and_accumulation_lower_the_activations_need():
    model = sequence_model()
    x, y = sequence_data()
    model.fit(x, y, verbose=0)
    before = state_of(model)
    policy = keras.config.dtype_policy().name
    table = ways_to_fit(model, x, y, batch_size=16,
                        levers=["mixed_precision", "gradient_accumulation"])
    as_is = row(table, "as is")
    mixed = row(table, "mixed_precision")
    accumulated = row(table, "gradient_accumulation")
    assert mixed["how"] in ("plan", "measured") and "mixed_bfloat16" in mixed["change"]
    # 64 x 2048 floats a sample, 8 MiB at 16 samples, kept for the backward
    assert as_is["need_bytes"] > (0 if read_loosely(as_is) else 8 * MIB)
    # XLA's plans are exact. The host's resident memory of PyTorch's steps
    # still carries some of the process's history (docs/capacity.md, "The
    # host's heap"): on this model bfloat16 saved 12% of the need in a new
    # process, 0-34% after other models trained in it, 10% late in the
    # suite. There, only that it costs no more than a fifth
    exact = mixed["how"] == "plan"
    if exact:
        assert mixed["saved_bytes"] > 0.05 * as_is["need_bytes"]
    elif not read_loosely(mixed):
        assert mixed["saved_bytes"] > -0.2 * as_is["need_bytes"]
    # the batch fits already: 2 steps of 8, about what a batch of 8 needs
    assert "2 steps of 8" in accumulated["how"]
    if read_loosely(accumulated):
        assert accumulated["need_bytes"] > 0
    else:
        assert 0.3 * as_is["need_bytes"] < accumulated["need_bytes"] < (
            0.8 if exact else 0.9) * as_is["need_bytes"]
    if mixed["saved_bytes"] > 0:  # only levers that saved are combined
        pair = row(table, "mixed_precision + gradient_accumulation")
        assert pair["how"].startswith(mixed["how"])  # measured, not added up
    if exact:  # the host's largest batches extrapolate noisy lines far out
        assert accumulated["largest_batch"] > as_is["largest_batch"]
        assert mixed["largest_batch"] > as_is["largest_batch"]
        assert pair["need_bytes"] < accumulated["need_bytes"]
    assert all(bool(f) for f in table["fits"])
    assert keras.config.dtype_policy().name == policy
    after = state_of(model)
    assert all(a.tobytes() == b.tobytes() for (_, a), (_, b) in zip(before, after))


def test_levers_that_cannot_apply_keep_a_row_that_says_why():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(4)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model.compile(optimizer="sgd", loss="mse")
    table = ways_to_fit(model, np.ones((4, 8), "float32"), np.zeros((4, 4), "float32"),
                        levers=["mixed_precision", "sgd_momentum", "shorter_sequence"],
                        combinations=False)
    assert len(table) == 4
    mixed = row(table, "mixed_precision")
    assert mixed["how"].startswith("not applied:") and "get_config" in mixed["how"]
    assert "set_dtype_policy('mixed_bfloat16')" in mixed["how"]
    assert pd.isna(mixed["need_bytes"])
    assert "not an Adam-like optimizer" in row(table, "sgd_momentum")["how"]
    assert "no token ids" in row(table, "shorter_sequence")["how"]
    assert table["need_bytes"].isna().sum() == 3


@pytest.mark.parametrize("verbose", [0, 2])
def test_each_row_is_shown_as_it_is_measured(capsys, verbose):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    ways_to_fit(model, np.ones((4, 8), "float32"), np.zeros((4, 4), "float32"),
                levers=["sgd_momentum", "shorter_sequence"], combinations=False,
                verbose=verbose)
    out = [line for line in capsys.readouterr().out.splitlines()
           if line.startswith("ways_to_fit:")]
    if verbose == 0:
        assert out == []
        return
    assert [line.split(":")[1].strip() for line in out] == [
        "as is", "sgd_momentum", "shorter_sequence"]
    assert "saves" in out[1] and "largest batch" in out[1]
    assert "not applied" in out[2]


def test_a_keras_hub_gpt2_gets_a_shorter_sequence():
    model, x, y = tiny_gpt2(vocabulary=1000, layers=1, width=16, sequence=64)
    keras.Model.fit(model, x, y, verbose=0)
    before = state_of(model)
    table = ways_to_fit(model, x, y, batch_size=16,
                        levers=["shorter_sequence", "remat_layers"])
    shorter = row(table, "shorter_sequence")
    assert "32 tokens" in shorter["change"]
    assert shorter["how"] in ("plan", "measured")
    # logits over the vocabulary, 16 x 64 x 1000 floats
    share = 0.0 if read_loosely(shorter) else 0.2
    assert shorter["saved_bytes"] > share * (row(table, "as is")["need_bytes"]
                                             - 3 * 4 * model.count_params())
    # the recomputed layers are the model's own, never the loss's row
    change = row(table, "remat_layers")["change"]
    named = ast.literal_eval(re.search(r"layer_names=(\[.*?\])", change).group(1))
    layers = {layer.name for layer in model._flatten_layers(recursive=True)}
    assert named and set(named) <= layers
    after = state_of(model)
    assert all(a.tobytes() == b.tobytes() for (_, a), (_, b) in zip(before, after))


def test_the_whole_model_recomputed_leaves_out_what_the_scope_cannot_run():
    """On JAX, `keras.RematScope` traces every argument of a layer's call,
    so a call that branches on one (keras-hub's `ReversibleEmbedding` on
    Gemma) cannot be recomputed: the row recomputes every other layer. On
    TensorFlow, recomputation takes no keyword arguments in a compiled
    step, which leaves no layer here; on PyTorch the whole model runs."""

    class Flip(keras.layers.Layer):
        def call(self, x, reverse=False):
            return -x if reverse else x

    inputs = keras.Input((8,))
    model = keras.Model(inputs, Flip(name="flip")(
        keras.layers.Dense(4, name="dense")(inputs), reverse=False))
    model.compile(optimizer="adam", loss="mse")
    table = ways_to_fit(model, np.ones((4, 8), "float32"), np.zeros((4, 4), "float32"),
                        levers=["remat"], combinations=False, verbose=0)
    remat = row(table, "remat")
    if BACKEND == "torch":
        assert remat["how"] == "measured"
        assert 'mode="full"' in remat["change"]
    elif BACKEND == "tensorflow":
        assert remat["how"].startswith("not applied: the scope can recompute no layer")
        assert re.search(r"left out: .*flip.*arguments besides its inputs",
                         remat["notes"]), remat["notes"]
    else:
        assert remat["how"] == "plan"
        assert "layer_names=['dense']" in remat["change"]
        assert "flip (its recomputed call raised TracerBoolConversionError)" in \
            remat["notes"]


@pytest.mark.skipif(BACKEND != "jax", reason="JAX traces a recomputed call's arguments")
def test_on_jax_a_layer_around_one_that_raised_is_left_out_too():
    class Flip(keras.layers.Layer):
        def call(self, x, reverse=False):
            return -x if reverse else x

    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = keras.layers.Dense(4, name="inner")
            self.flip = Flip(name="flip")

        def call(self, x):
            return self.flip(self.inner(x), reverse=False)

    inputs = keras.Input((8,))
    model = keras.Model(inputs, Block(name="block")(inputs))
    model.compile(optimizer="adam", loss="mse")
    table = ways_to_fit(model, np.ones((4, 8), "float32"), np.zeros((4, 4), "float32"),
                        levers=["remat"], combinations=False, verbose=0)
    remat = row(table, "remat")
    # the block's recomputed call traces the flip's again: both left out
    assert remat["how"] == "plan" and "layer_names=['inner']" in remat["change"]
    assert "block (its recomputed call raised TracerBoolConversionError in Flip)" \
        in remat["notes"]


@pytest.mark.skipif(BACKEND != "jax", reason="JAX traces a recomputed call's arguments")
def test_on_jax_a_backbone_holding_a_layer_that_raised_is_left_out_too():
    """keras-hub OPT: the error's traceback goes through a block, its
    attention and a Dropout, but not the backbone, whose recomputed call
    runs that Dropout again; it is left out by what it holds."""
    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.OPTBackbone(
        vocabulary_size=100, num_layers=1, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=16)
    model = keras_hub.models.OPTCausalLM(backbone=backbone, preprocessor=None)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    tokens = np.random.default_rng(0).integers(0, 100, (4, 17)).astype("int32")
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((4, 16), "bool")}
    table = ways_to_fit(model, x, tokens[:, 1:], levers=["remat"], combinations=False,
                        verbose=0)
    remat = row(table, "remat")
    assert remat["how"] == "plan", remat["how"]
    named = re.search(r"layer_names=(\[.*?\])", remat["change"]).group(1)
    assert "opt_backbone" not in ast.literal_eval(named)
    words = (r"opt_backbone \(its recomputed call raised "
             r"TracerBoolConversionError in \w+\)")
    assert re.search(words, remat["notes"]), remat["notes"]


@pytest.mark.parametrize("arguments, error, words", [
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"batch_size": 2.5}, TypeError, "batch_size"),
    ({"headroom": 1.5}, ValueError, "headroom"),
    ({"levers": "mixed"}, ValueError, "levers"),
    ({"levers": "adafactor"}, TypeError, "['adafactor']"),
    ({"levers": ["remat", "warp_drive"]}, ValueError, "levers"),
    ({"levers": []}, ValueError, "levers"),
    ({"device": "TPU:0"}, ValueError, "device"),
    ({"combinations": "yes"}, TypeError, "combinations"),
])
def test_bad_arguments_are_refused_before_any_work(arguments, error, words):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    with pytest.raises(error, match="Expected") as caught:
        ways_to_fit(model, np.ones((2, 4), "float32"), np.ones((2, 2), "float32"),
                    **arguments)
    assert words in str(caught.value)
    assert not model.optimizer.built  # refused before any step


def test_no_row_begins_after_max_seconds_and_each_says_so(monkeypatch):
    from keras_memwatch.ways import run

    slow = run.measure

    def measure(*args, **kwargs):  # a larger model: each row takes 0.4 s more
        time.sleep(0.4)
        return slow(*args, **kwargs)
    monkeypatch.setattr(run, "measure", measure)
    model = wide_model()
    x, y = np.ones((8, 1024), "float32"), np.zeros((8, 4), "float32")
    table = ways_to_fit(model, x, y, max_seconds=0.5, verbose=0,
                        levers=["adafactor", "sgd_momentum", "remat_layers"])
    # the model as it is is always measured; after it, nothing begins
    assert not pd.isna(row(table, "as is")["need_bytes"])
    for lever in ("adafactor", "sgd_momentum"):
        how = row(table, lever)["how"]
        assert re.fullmatch(r"not measured: out of time \(max_seconds=0.5\) after "
                            r"\d+\.\d s", how), how
        assert "optimizer=" in row(table, lever)["change"]  # what it would be
    assert row(table, "remat_layers")["how"].startswith(
        "not applied: the by-layer table was not made: out of time (max_seconds=0.5)")
    assert len(table) == 4  # nothing saved: no combination is measured
    assert table.attrs["max_seconds"] == 0.5


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's plans: JAX")
def test_with_a_compilation_cache_a_second_table_compiles_nothing(jax_config,
                                                                  tmp_path):
    x, y = sequence_data()
    cache = str(tmp_path / "cache")

    def ways():
        lines = []
        table = ways_to_fit(sequence_model(), x, y, batch_size=16,
                            levers=["sgd_momentum"], combinations=False, verbose=0,
                            compilation_cache=cache, progress=lines.append)
        return table, lines

    first, lines = ways()
    assert any("compiled the step" in line for line in lines)
    assert jax_config.config.jax_compilation_cache_dir == cache
    second, lines = ways()
    assert not any("compiled the step" in line for line in lines), lines
    # the plans read back (the host's free memory, and so the largest
    # batch, moves between calls)
    columns = ["lever", "need_bytes"]
    assert second[columns].equals(first[columns])


@pytest.mark.skipif(BACKEND == "jax", reason="JAX keeps a cache")
def test_a_compilation_cache_is_accepted_and_does_nothing_elsewhere(tmp_path):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    table = ways_to_fit(model, np.ones((4, 8), "float32"), np.zeros((4, 4), "float32"),
                        levers=["sgd_momentum"], combinations=False, verbose=0,
                        compilation_cache=str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()
    assert table.attrs["compilation_cache"] is None


def test_an_uncompiled_model_is_refused():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="compiled model"):
        ways_to_fit(model, np.ones((2, 4), "float32"))


def test_every_lever_has_a_name_the_argument_takes():
    assert LEVER_NAMES == ("mixed_precision", "adafactor", "sgd_momentum", "remat",
                           "remat_layers", "gradient_accumulation", "shorter_sequence")


def test_real_steps_near_a_limit_ask_a_spare_size_below_the_wanted_batch():
    from keras_memwatch.ways.measure import sizes_for

    assert sizes_for(16, None) == [8, 16]
    assert sizes_for(16, None, spare=True) == [4, 8, 16]  # 16 may run out
    assert sizes_for(2, None, spare=True) == [1, 2]
    assert sizes_for(16, 10, spare=True) == [4, 8]


def test_recomputing_the_heaviest_layers_leaves_out_those_the_scope_cannot_run():
    """The gate keeps the most activations and branches on `training`. JAX
    traces that argument in a recomputed call (found by the step: the
    layer is left out, with every layer of its class, and the rest measured
    again); TensorFlow refuses it as a keyword (known before the step);
    PyTorch recomputes it."""

    class Gate(keras.layers.Layer):
        def call(self, x, training=None):
            wide = keras.ops.tanh(keras.ops.repeat(x, 4, axis=-1))
            return wide if training else keras.ops.zeros_like(wide)

    inputs = keras.Input((64, 32))
    wide = Gate(name="gate")(keras.layers.Conv1D(256, 1, name="wide")(inputs))
    narrow = Gate(name="small_gate")(keras.layers.Conv1D(8, 1, name="narrow")(inputs))
    h = keras.layers.Concatenate(name="both")([wide, narrow])
    outputs = keras.layers.Dense(10, name="head")(
        keras.layers.GlobalAveragePooling1D(name="pool")(h))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = sequence_data()
    table = ways_to_fit(model, x, y, batch_size=16, levers=["remat_layers"],
                        combinations=False, verbose=0)
    remat = row(table, "remat_layers")
    assert not pd.isna(remat["need_bytes"]), remat["how"]
    named = ast.literal_eval(re.search(r"layer_names=(\[.*?\])", remat["change"])[1])
    if BACKEND == "torch":
        assert "gate" in named and "left out" not in remat["notes"]
    else:
        assert "gate" not in named and named
        why = ("its recomputed call raised TracerBoolConversionError"
               if BACKEND == "jax" else "keywords")
        assert re.search(r"left out: .*\bgate\b.*" + why, remat["notes"]), \
            remat["notes"]
        # the other gate is the same code: left out with the first
        assert "small_gate" in remat["notes"]
