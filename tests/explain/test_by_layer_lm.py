"""`memory_by_layer` on a decoder language model (issue 46): a keras-hub GPT-2
with a large vocabulary, where the logits and the loss are most of a step.
The loss is a row holding at least the logits; the rest is small where the
step's working memory is measured; `expand_blocks=True` opens the
transformer blocks; the model's state and dtype policy are put back."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

from keras_memwatch import memory_by_layer
from keras_memwatch.explain.layers import LOSS, REST, UPDATE
from keras_memwatch.measure.device import tensorflow_cpu_pool

keras_hub = pytest.importorskip("keras_hub")

BACKEND = keras.backend.backend()
ROOT = Path(__file__).resolve().parents[2]
VOCAB, LAYERS, WIDTH, SEQ, BATCH = 8000, 2, 64, 64, 8
LOGITS = BATCH * SEQ * VOCAB * 4  # float32

GPT2 = textwrap.dedent(f"""
    import keras, keras_hub, numpy as np

    def gpt2():
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size={VOCAB}, num_layers={LAYERS}, num_heads=2,
            hidden_dim={WIDTH}, intermediate_dim={4 * WIDTH},
            max_sequence_length={SEQ})
        model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      weighted_metrics=["accuracy"])
        return model

    def batch():
        rng = np.random.default_rng(0)
        x = {{"token_ids": rng.integers(0, {VOCAB}, ({BATCH}, {SEQ})).astype("int32"),
             "padding_mask": np.ones(({BATCH}, {SEQ}), "int32")}}
        return x, rng.integers(0, {VOCAB}, ({BATCH}, {SEQ})).astype("int32")
""")
exec(GPT2)  # gpt2() and batch(), as the subprocess below has them


def row(table, name):
    return table.set_index("layer").loc[name]


@pytest.fixture(scope="module")
def split():
    model = gpt2()  # noqa: F821 (from GPT2)
    return model, memory_by_layer(model, *batch())  # noqa: F821


def test_the_loss_is_a_row_holding_at_least_the_logits(split):
    model, table = split
    loss = row(table, LOSS)
    assert loss["output_shape"] == f"({BATCH}, {SEQ}, {VOCAB})"
    # What the loss keeps (the logits, their log-softmax) and their gradient.
    assert loss["activation_bytes"] >= LOGITS
    assert loss["grad_bytes"] >= LOGITS
    assert loss["working_bytes"] >= 2 * LOGITS
    ranked = table[table["layer"] != REST].sort_values("working_bytes")
    assert ranked["layer"].iloc[-1] == LOSS  # the largest item of the step
    # The logits are not the layer's that computes them (the tied embedding).
    embedding = row(table, f"{model.backbone.name}/token_embedding")
    assert embedding["activation_bytes"] < LOGITS / 4


def test_the_rows_add_up_and_the_rest_is_small_where_measured(split):
    table = split[1]
    working = table.attrs["working_bytes"]
    if BACKEND == "tensorflow" and not tensorflow_cpu_pool():  # no statistics
        assert working is None and row(table, REST)["note"]
        return
    if BACKEND == "torch":
        pytest.skip("measured in a fresh process below (the host's memory)")
    assert table["working_bytes"].sum() == working
    assert abs(row(table, REST)["working_bytes"]) <= 0.15 * working
    if BACKEND != "tensorflow":  # TensorFlow's split has no update row
        assert row(table, UPDATE)["working_bytes"] >= 0


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch measures the host's memory")
def test_pytorch_rest_is_small_in_a_process_whose_heap_follows_its_tensors():
    """As in `test_by_layer.py`: glibc hands blocks of 128 KiB or more back
    to the system, so the host's resident memory follows the tensors alive
    and the step's peak is measured."""
    script = GPT2 + textwrap.dedent("""
        from keras_memwatch import memory_by_layer
        from keras_memwatch.explain.layers import LOSS, REST
        model = gpt2()
        memory_by_layer(model, *batch())  # the process's first step
        t = memory_by_layer(model, *batch()).set_index("layer")
        print(t.attrs["working_bytes"], t.loc[REST, "working_bytes"],
              t.loc[LOSS, "working_bytes"])
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", KERAS_BACKEND="torch",
                 PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr[-3000:]
    working, rest, loss = map(int, done.stdout.split()[-3:])
    assert abs(rest) <= 0.15 * working, (rest, working)
    assert loss >= 2 * LOGITS


def test_expand_blocks_gives_the_parts_of_each_transformer_block():
    model = gpt2()  # noqa: F821
    whole = memory_by_layer(model, *batch())  # noqa: F821
    opened = memory_by_layer(model, *batch(), expand_blocks=True)  # noqa: F821
    layers = set(opened["layer"])
    block = f"{model.backbone.name}/transformer_layer_0"
    for part in ("self_attention", "self_attention/query", "self_attention/key",
                 "self_attention/value", "self_attention/attention_output",
                 "feedforward_intermediate_dense", "feedforward_output_dense"):
        assert f"{block}/{part}" in layers, part
    assert block in layers  # the block's own work, outside its parts
    assert not any(p.startswith(block + "/") for p in whole["layer"])
    # Each weight once, in its most deeply nested layer.
    assert opened["param_bytes"].sum() == whole["param_bytes"].sum()
    assert row(opened, block)["param_bytes"] == 0
    query = row(opened, f"{block}/self_attention/query")
    assert query["param_bytes"] == (WIDTH * WIDTH + WIDTH) * 4
    # The parts hold what the block held.
    parts = opened[opened["layer"].str.startswith(block)]["activation_bytes"].sum()
    if BACKEND == "tensorflow":  # shapes: every part's outputs, not just the block's
        assert parts > row(whole, block)["activation_bytes"]
    else:
        assert parts == pytest.approx(row(whole, block)["activation_bytes"], rel=0.05)
    assert {LOSS, REST} <= layers


def test_weights_optimizer_state_and_dtype_policy_are_put_back():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = gpt2()  # noqa: F821
    finally:
        keras.mixed_precision.set_global_policy("float32")
    x, y = batch()  # noqa: F821
    model.train_on_batch(x, y)  # trained a little
    variables = (list(model.variables) + list(model.optimizer.variables)
                 + list(model.metrics_variables))
    before = [(v.path, np.array(keras.ops.convert_to_numpy(v.value)).copy())
              for v in variables]
    policies = [(layer.name, layer.dtype_policy.name)
                for layer in model._flatten_layers()]
    table = memory_by_layer(model, x, y, expand_blocks=True)
    assert "float16" in row(table, f"{model.backbone.name}/transformer_layer_0/"
                                   "feedforward_output_dense")["output_shape"]
    after = [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in variables]
    for (path, a), b in zip(before, after):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), path
    assert [(layer.name, layer.dtype_policy.name)
            for layer in model._flatten_layers()] == policies
    assert keras.mixed_precision.global_policy().name == "float32"


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's plan of the JAX step")
def test_jax_llama_blocks_keep_their_activations_and_the_rest_is_small():
    """A keras-hub Llama shape: each block keeps what its backward pass
    reads, the loss its logits, and the rows add up to XLA's plan."""
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCAB, num_layers=LAYERS, num_query_heads=4,
        num_key_value_heads=2, hidden_dim=WIDTH, intermediate_dim=2 * WIDTH)
    model = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    table = memory_by_layer(model, *batch())  # noqa: F821
    working = table.attrs["working_bytes"]
    assert table["working_bytes"].sum() == working
    assert abs(row(table, REST)["working_bytes"]) <= 0.15 * working
    assert row(table, LOSS)["working_bytes"] >= 2 * LOGITS
    for i in range(LAYERS):  # at least its input and output, kept
        block = row(table, f"{backbone.name}/transformer_layer_{i}")
        assert block["activation_bytes"] >= 2 * BATCH * SEQ * WIDTH * 4
    assert table.attrs["peak_phase"] in ("forward", "backward", "update")
