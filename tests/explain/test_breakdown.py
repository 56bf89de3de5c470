"""The breakdown counts static memory exactly and measures a step's working
memory from the record."""

from __future__ import annotations

import keras
import numpy as np
import pandas as pd
import pytest

from conftest import GIB, HOST, MIB, built, dense_model, record, steady
from keras_memwatch.explain.breakdown import format_breakdown, memory_breakdown, step_peaks
from keras_memwatch.variables import dtype_size, variable_bytes

INT = 8 if keras.backend.backend() == "tensorflow" else 4
COUNTERS = INT + 4  # an optimizer's iteration and float32 learning rate


# -- static memory: exact bytes ---------------------------------------------

DENSE_PARAMS = 10 * 32 + 32 + 32 * 4 + 4  # 484


def conv_model(optimizer, dtype=None):
    # Conv2D 3 -> 8, 3x3: 3*3*3*8 + 8 = 224
    # BatchNorm(8): gamma, beta trainable (16); moving mean, variance not (16)
    # Conv2D 8 -> 16, 3x3: 3*3*8*16 + 16 = 1168
    # Dense 16 -> 5: 16*5 + 5 = 85
    model = keras.Sequential([
        keras.Input((12, 12, 3)),
        keras.layers.Conv2D(8, 3, padding="same", dtype=dtype),
        keras.layers.BatchNormalization(dtype=dtype),
        keras.layers.Conv2D(16, 3, dtype=dtype),
        keras.layers.GlobalAveragePooling2D(dtype=dtype),
        keras.layers.Dense(5, dtype="float32"),
    ])
    model.compile(optimizer=optimizer, loss="mse")
    return model


CONV_TRAINABLE = 224 + 16 + 1168 + 85  # 1493
CONV_NON_TRAINABLE = 16


def trained(model):
    """One real step of training."""
    x = np.zeros((4, *model.inputs[0].shape[1:]), "float32")
    y = np.zeros((4, model.outputs[0].shape[-1]), "float32")
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)
    return model


@pytest.fixture
def mixed_precision():
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("optimizer, slots", [
    (lambda: keras.optimizers.SGD(), 0),
    (lambda: keras.optimizers.SGD(momentum=0.9), 1),
    (lambda: keras.optimizers.Adam(), 2),
])
def test_dense_stack_weights_and_optimizer_state(optimizer, slots):
    model = built(dense_model(optimizer()))
    b = memory_breakdown(model, pd.DataFrame())
    assert b["trainable_params"] == DENSE_PARAMS
    assert b["trainable_bytes"] == 4 * DENSE_PARAMS
    assert b["non_trainable_bytes"] == 0
    assert b["optimizer_bytes"] == slots * 4 * DENSE_PARAMS + COUNTERS
    assert b["optimizer_slots_per_weight"] == slots
    assert b["static_bytes"] == (1 + slots) * 4 * DENSE_PARAMS + COUNTERS


@pytest.mark.parametrize("optimizer, slots", [
    (lambda: keras.optimizers.SGD(), 0),
    (lambda: keras.optimizers.SGD(momentum=0.9), 1),
    (lambda: keras.optimizers.Adam(), 2),
])
def test_conv_stack_counts_batchnorm_statistics_as_non_trainable(optimizer, slots):
    model = built(conv_model(optimizer()))
    b = memory_breakdown(model, pd.DataFrame())
    assert b["trainable_bytes"] == 4 * CONV_TRAINABLE
    assert b["non_trainable_params"] == CONV_NON_TRAINABLE
    assert b["non_trainable_bytes"] == 4 * CONV_NON_TRAINABLE
    assert b["weights_bytes"] == 4 * (CONV_TRAINABLE + CONV_NON_TRAINABLE)
    # Slots are kept for trainable weights only.
    assert b["optimizer_bytes"] == slots * 4 * CONV_TRAINABLE + COUNTERS


def test_mixed_float16_counts_float32_master_weights_and_loss_scale_state(
        mixed_precision):
    model = trained(conv_model(keras.optimizers.Adam()))
    assert model.optimizer.__class__.__name__ == "LossScaleOptimizer"
    b = memory_breakdown(model, pd.DataFrame())
    # Variables stay float32 under mixed_float16; only computations are
    # float16.
    assert b["trainable_bytes"] == 4 * CONV_TRAINABLE
    assert b["non_trainable_bytes"] == 4 * CONV_NON_TRAINABLE
    # Inner Adam: 2 float32 slots per weight and its counters; the
    # LossScaleOptimizer: its own counters, an int step counter and a
    # float32 dynamic scale.
    assert b["optimizer_bytes"] == (2 * 4 * CONV_TRAINABLE + COUNTERS
                                    + COUNTERS + INT + 4)
    assert b["optimizer"] == "LossScaleOptimizer(Adam)"
    assert b["optimizer_slots_per_weight"] == 2


def test_float16_variables_count_two_bytes_each():
    model = built(conv_model(keras.optimizers.SGD(momentum=0.9), dtype="float16"))
    b = memory_breakdown(model, pd.DataFrame())
    assert b["trainable_bytes"] == 2 * (CONV_TRAINABLE - 85) + 4 * 85
    assert b["non_trainable_bytes"] == 2 * CONV_NON_TRAINABLE


def test_after_real_training_the_count_is_the_same():
    model = trained(dense_model(keras.optimizers.Adam()))
    b = memory_breakdown(model, pd.DataFrame())
    assert b["optimizer_bytes"] == 2 * 4 * DENSE_PARAMS + COUNTERS


def test_an_unbuilt_optimizer_is_unknown_and_said_so():
    model = dense_model(keras.optimizers.Adam())  # compiled, never trained
    b = memory_breakdown(model, pd.DataFrame())
    assert b["trainable_bytes"] == 4 * DENSE_PARAMS
    assert b["optimizer_bytes"] is None and b["static_bytes"] is None
    assert any("not built yet" in note for note in b["notes"])
    assert "Adam not built yet" in format_breakdown(b)


def test_an_uncompiled_model_has_no_optimizer_state():
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32)])
    b = memory_breakdown(model, pd.DataFrame())
    assert b["optimizer_bytes"] is None
    assert b["static_bytes"] == b["weights_bytes"] == 4 * (10 * 32 + 32)
    assert "not compiled" in format_breakdown(b)


def test_shared_variables_are_counted_once():
    dense = keras.layers.Dense(3)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, dense(dense(inputs)))
    assert memory_breakdown(model, pd.DataFrame())["trainable_bytes"] == 4 * (9 + 3)


def test_dtype_sizes():
    assert [dtype_size(d) for d in ("float32", "float16", "bfloat16", "int64",
                                    "int8", "bool", "float8_e4m3fn")] == [4, 2, 2, 8, 1, 1, 1]
    v = keras.Variable(np.zeros((3, 5)), dtype="bfloat16")
    assert variable_bytes([v, v]) == 30


# -- the transient part: measured -------------------------------------------

def test_transient_is_a_step_peak_minus_the_memory_in_use_before_it():
    working = [40, 42, 38, 40, 44, 40, 400, 40, 36]
    frame, _ = record(steady(working))
    b = memory_breakdown(None, frame, batch_size=16)
    assert b["device"] == "GPU:0"
    assert b["transient_source"] == "per-step peak"
    assert b["transient_bytes"] == 40 * MIB  # the median step
    assert b["transient_max_bytes"] == 400 * MIB
    assert b["transient_max_at"] == (0, 6)
    assert b["transient_per_sample_bytes"] == 40 * MIB // 16
    assert b["peak_bytes"] == 900 * MIB
    assert b["in_use_bytes"] == 500 * MIB


def test_memory_in_use_before_the_step_is_the_previous_sample():
    # Batch 1 keeps 100 MiB more in use (peak 640 on 500 before: 140);
    # batch 2's peak of 640 is then 40 MiB above the 600 in use before it.
    readings = [(500, 500), (500, 540), (600, 640), (600, 640)]
    b = memory_breakdown(None, record(readings)[0])
    assert b["transient_max_bytes"] == 140 * MIB
    assert b["transient_max_at"] == (0, 1)
    assert b["transient_bytes"] == 40 * MIB  # median of 40, 140, 40


def test_in_use_beyond_static_is_reported():
    model = built(dense_model(keras.optimizers.Adam()))
    frame, _ = record(steady([40] * 6))
    b = memory_breakdown(model, frame)
    assert b["other_in_use_bytes"] == 500 * MIB - b["static_bytes"]


def test_a_high_water_mark_gives_only_the_largest_working_memory():
    # JAX: the mark rises at batch 0 (to 540) and batch 2 (to 800); the
    # other steps' peaks are unseen.
    frame, _ = record(steady([40, 40, 300, 40, 40]), per_step_peak=False)
    assert not step_peaks(frame)
    b = memory_breakdown(None, frame, batch_size=8)
    assert b["transient_source"] == "high-water mark"
    assert b["transient_bytes"] is None and b["transient_per_sample_bytes"] is None
    assert b["transient_max_bytes"] == 300 * MIB
    assert b["transient_max_at"] == (0, 2)
    assert any("no peak per step" in n for n in b["notes"])
    assert "300 MiB at most on GPU:0 (epoch 0 batch 2); a typical step's is " \
           "unknown" in format_breakdown(b)


def test_a_high_water_mark_that_never_rose_tells_nothing():
    readings = [(500, 900)] + [(500, 540)] * 6  # the mark was set before fit
    frame, _ = record(readings, per_step_peak=False)
    b = memory_breakdown(None, frame)
    assert b["transient_max_bytes"] is None and b["transient_source"] is None
    assert "unknown (no peak per step on GPU:0)" in format_breakdown(b)


def test_the_accelerator_is_the_main_device_and_every_device_is_listed():
    gpu, _ = record(steady([40] * 6))
    host, _ = record(steady([5] * 6, in_use=900), device="host", sources=HOST)
    frame = pd.concat([gpu, host], ignore_index=True)
    b = memory_breakdown(None, frame)
    assert b["device"] == "GPU:0"
    assert set(b["devices"]) == {"GPU:0", "host"}
    assert b["devices"]["host"]["transient_bytes"] == 5 * MIB
    assert b["devices"]["GPU:0"]["limit_bytes"] == 16 * GIB
    assert b["devices"]["host"]["limit_bytes"] is None


def test_validation_rows_are_not_steps():
    readings = steady([40, 40, 40, 40, 900, 40])
    frame, _ = record(readings, phase_of=lambda b: "test" if b == 4 else "train")
    b = memory_breakdown(None, frame)
    assert b["transient_max_bytes"] == 40 * MIB


def test_without_a_model_weights_are_unknown():
    frame, _ = record(steady([40] * 6))
    b = memory_breakdown(None, frame)
    assert b["trainable_bytes"] is None and b["optimizer_bytes"] is None
    assert "unknown without the model" in format_breakdown(b)


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="batch_size"):
        memory_breakdown(None, pd.DataFrame(), batch_size=0)


def test_an_empty_record_has_no_step_figures():
    b = memory_breakdown(None, pd.DataFrame())
    assert b["device"] is None and b["devices"] == {}


# -- in words ---------------------------------------------------------------

def test_format_says_where_the_memory_went():
    # Sized like the classic question's network, by hand: 206,601,248
    # float32 weights, Adam's two slots, counters of 4 + 4 bytes.
    b = {
        "trainable_params": 206_601_248, "non_trainable_params": 0,
        "trainable_bytes": 826_404_992, "non_trainable_bytes": 0,
        "weights_bytes": 826_404_992, "optimizer": "Adam",
        "optimizer_bytes": 1_652_809_992, "optimizer_slots_per_weight": 2.0,
        "static_bytes": 2_479_214_984, "device": "GPU:0",
        "in_use_bytes": 2_600_000_000, "other_in_use_bytes": 120_785_016,
        "transient_bytes": 3 * GIB, "transient_max_bytes": 9 * GIB,
        "transient_max_at": (0, 14), "transient_source": "per-step peak",
        "batch_size": 32, "transient_per_sample_bytes": 96 * MIB, "notes": [],
    }
    text = format_breakdown(b)
    assert "weights:              788 MiB (206.6 M parameters" in text
    assert "optimizer state:      1.54 GiB (Adam keeps 2 slots per weight)" in text
    assert "= static:             2.31 GiB" in text
    assert ("step working memory:  3.00 GiB typical on GPU:0, 9.00 GiB at most "
            "(epoch 0 batch 14)") in text
    assert "activations, gradients and workspaces" in text
    assert "per sample:           96.0 MiB" in text
    assert "in use between steps: 2.42 GiB on GPU:0 (static 2.31 GiB" in text
