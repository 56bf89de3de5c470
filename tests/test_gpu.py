"""On a real GPU (skipped without one): the sources are present and agree.

Run on the device machine with KERAS_BACKEND=jax or torch, e.g.
`python -m pytest -m gpu tests/test_gpu.py -s`.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_memwatch import MemWatch
from keras_memwatch import columns as C

pytestmark = pytest.mark.gpu
MIB = 2**20


def test_the_seed_model_records_allocator_nvml_and_process_memory():
    from keras_memwatch.cli.demo import SEED, build_model

    model = build_model(SEED)
    x = np.random.default_rng(0).normal(size=(256, *SEED.input_shape)).astype("float32")
    y = np.zeros((256,), "int64")
    watch = MemWatch()
    model.fit(x, y, batch_size=SEED.batch_size, epochs=1, callbacks=[watch], verbose=0)
    rows = watch.to_dataframe().query("device == 'GPU:0'")
    gpu = rows.iloc[1:]  # the steps
    print("\n" + gpu[[C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK, C.ALLOCATOR_LIMIT,
                      C.NVML_USED, C.NVML_TOTAL, C.PROCESS]].describe()
          .loc[["min", "max"]].map(lambda v: f"{v / MIB:,.0f} MiB").to_string())
    print(watch.summary())
    for col in (C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK):
        assert gpu[col].notna().all(), col
    # NVML is read at most once a second: at train begin, then as time passes.
    assert rows[C.NVML_USED].notna().any()
    gpu = rows.dropna(subset=[C.NVML_USED])
    weights = model.count_params() * 4
    assert (gpu[C.ALLOCATOR_CURRENT] >= 3 * weights).all()  # weights + Adam's 2 slots
    assert (gpu[C.ALLOCATOR_PEAK] >= gpu[C.ALLOCATOR_CURRENT]).all()
    assert (gpu[C.NVML_USED] <= gpu[C.NVML_TOTAL]).all()
    if gpu[C.PROCESS].notna().all():  # hidden inside some containers
        assert (gpu[C.PROCESS] >= gpu[C.ALLOCATOR_CURRENT]).all()
        assert (gpu[C.NVML_USED] >= gpu[C.PROCESS]).all()


def _scenario(*args):
    scenario = os.path.join(os.path.dirname(__file__), "scenarios", "oversized_batches.py")
    done = subprocess.run([sys.executable, scenario, "--gpu", *args], capture_output=True,
                          text=True, timeout=600,
                          env=dict(os.environ, KERAS_BACKEND=keras.backend.backend()))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print("\n", json.dumps(result))
    return result


def test_oversized_batches_on_the_gpu_are_all_flagged_and_nothing_else():
    result = _scenario("--epochs", "2")
    assert result["flagged_at"] == result["oversized_at"]
    if keras.backend.backend() == "jax":  # judged on XLA's plan of each step
        assert len(result["plan_mib_by_device"]["GPU:0"]) == 2


def _two_gpus():
    return keras.backend.backend() == "jax" and len(
        [d for d in __import__("jax").devices() if d.platform == "gpu"]) >= 2


@pytest.mark.skipif(not _two_gpus(), reason="needs JAX and two GPUs")
def test_data_parallel_over_two_gpus_flags_every_oversized_batch_on_both():
    result = _scenario("--epochs", "2", "--data-parallel")
    for device in ("GPU:0", "GPU:1"):
        assert result["flagged_by_device"][device] == result["oversized_at"]
        assert len(result["plan_mib_by_device"][device]) == 2
    uniform = _scenario("--data-parallel", "--uniform")
    assert uniform["flagged_by_device"] == {}


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="jobs in new processes are PyTorch's")
def test_a_job_in_a_new_process_under_the_cap_trains_small_batches_and_fails_large_ones(
        tmp_path):
    from keras_memwatch.capacity import fresh_process

    model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(1024),
                              keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.save(tmp_path / "model.keras")
    fresh_process.save_batch(str(tmp_path), np.ones((8, 1024), "float32"),
                             np.zeros((8,), "int32"))
    cap = 256 * MIB

    def job(size):
        done = subprocess.run(
            [sys.executable, "-m", "keras_memwatch.capacity.fresh_process",
             str(tmp_path), str(size), str(cap)], capture_output=True, text=True,
            timeout=600)
        return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])

    small, large = job(32), job(65536)  # a batch of inputs alone is the cap
    assert small[0] == 0 and 0 < small[1]["allocated"] <= cap
    assert large == (fresh_process.EXIT_OOM, {"error": "OutOfMemoryError"})


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="the allocator measures each layer's passes on PyTorch")
def test_pytorch_measures_each_layers_forward_and_backward_pass():
    from keras_memwatch import memory_by_layer
    from keras_memwatch.explain.layers import LOSS, STEP_ROWS

    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(256, 3, padding="same", activation="relu", name="conv1"),
        keras.layers.Conv2D(256, 3, padding="same", activation="relu", name="conv2"),
        keras.layers.GlobalAveragePooling2D(name="gap"),
        keras.layers.Dense(10, name="logits"),
    ])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(16, 32, 32, 3)).astype("float32")
    table = memory_by_layer(model, x, np.zeros(16, "int32")).set_index("layer")
    layers = table.drop(index=list(STEP_ROWS))
    print("\n" + layers[["activation_bytes", "grad_bytes", "measured_forward_bytes",
                         "measured_backward_bytes"]].to_string())
    assert layers["measured_forward_bytes"].notna().all()
    assert layers["measured_backward_bytes"].notna().all()
    # A layer's backward pass makes its variables' gradients, and conv2's
    # also the gradient of its input (conv1's output).
    for name in ("conv1", "conv2", "logits"):
        assert layers.loc[name, "measured_backward_bytes"] >= layers.loc[name, "grad_bytes"]
    conv1_output = 16 * 32 * 32 * 256 * 4
    assert layers.loc["conv2", "measured_backward_bytes"] >= conv1_output
    assert table.attrs["working_bytes"] >= layers["measured_backward_bytes"].max()
    # The loss's backward pass: from its gradient to the logits' (at least
    # the gradient of the logits).
    assert table.loc[LOSS, "measured_backward_bytes"] >= 16 * 10 * 4


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="XLA's plan of the JAX step")
def test_jax_splits_a_language_models_step_from_xlas_gpu_plan():
    """The split reads the plan XLA compiled for the GPU (not the shapes it
    falls back to), and the loss row holds the logits at least once,
    whether or not XLA writes their gradient into their buffer."""
    from keras_memwatch import memory_by_layer
    from keras_memwatch.explain.layers import LOSS, STEP_ROWS

    batch, seq, vocab = 8, 128, 32000
    model = keras.Sequential([
        keras.Input((seq,), dtype="int32"),
        keras.layers.Embedding(vocab, 128, name="embed"),
        keras.layers.Dense(256, activation="gelu", name="hidden"),
        keras.layers.Dense(vocab, name="logits"),
    ])
    model.compile("adamw", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (batch, seq)).astype("int32")
    table = memory_by_layer(model, tokens, tokens).set_index("layer")
    print("\n" + table[["working_bytes", "activation_bytes", "source"]].to_string())
    assert set(table.drop(index=list(STEP_ROWS))["source"]) == {"plan"}
    assert table.loc[LOSS, "working_bytes"] >= batch * seq * vocab * 4
    assert table["working_bytes"].sum() == table.attrs["working_bytes"]
