"""`estimate_max_batch_size` on the CPU, with the models people bring: its
own step (`fit`'s), a custom `train_step`, dict inputs and several outputs,
keras-hub models; the model's state put back bit for bit; bad arguments
refused before anything runs."""

from __future__ import annotations

import logging
import time

import keras
import numpy as np
import pytest

from capacity_helpers import BACKEND, MIB, assert_same_state, conv_data, conv_model, state_of
from conftest import tiny_gpt2
from keras_memwatch.capacity import STEP, estimate_max_batch_size

SIZES = (8, 32, 128)


def test_a_real_estimate_keeps_the_model_bit_for_bit_and_explains_itself():
    model = conv_model()
    x, y = conv_data()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # trained a little
    before = state_of(model)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=SIZES)
    assert_same_state(before, state_of(model))
    assert estimate.device == "host" and estimate.backend == BACKEND
    assert [o.batch_size for o in estimate.evidence.observations] == list(SIZES)
    assert all(o.how == STEP and o.ladder for o in estimate.evidence.observations)
    assert estimate.in_use_bytes > 50 * MIB
    assert estimate.refusal == ""
    # two 32x32x16 conv activations are kept for the backward pass
    assert estimate.per_sample_bytes > 64 * 1024
    assert estimate.predicted_batch_size == estimate.batch_size_for(0.1) > 128
    assert estimate.ceiling_batch_size >= estimate.predicted_batch_size
    assert "x the largest batch measured (128), read off the line" in estimate.explanation
    assert "Batches repeat the 16 samples given" in estimate.explanation
    text = str(estimate)
    assert "Largest batch that fits" in text and "step (ladder)" in text
    frame = estimate.to_dataframe()
    assert list(frame["batch_size"]) == list(SIZES)
    assert {"need_bytes", "how", "ran", "line_bytes"} <= set(frame.columns)
    assert estimate.to_dict()["predicted_batch_size"] == estimate.predicted_batch_size


def test_training_after_an_estimate_equals_training_without():
    x, y = conv_data()
    estimated, untouched = conv_model(), conv_model()
    untouched.set_weights(estimated.get_weights())
    estimate_max_batch_size(estimated, x, y, trial_sizes=(4, 8, 16))
    for model in (estimated, untouched):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert_same_state(state_of(untouched), state_of(estimated), paths=False)


def test_a_collector_the_user_paused_stays_paused():
    import gc

    gc.disable()
    try:
        estimate_max_batch_size(conv_model(), *conv_data(), trial_sizes=(4, 8))
        assert not gc.isenabled()
    finally:
        gc.enable()


class GuideModel(keras.Model):
    """The custom `train_step` of the Keras guides: it unpacks `x, y = data`,
    which `train_on_batch` (packing `(x, y, None)`) would break."""

    if BACKEND == "jax":
        def train_step(self, state, data):
            x, y = data
            return super().train_step(state, (x, y))
    else:
        def train_step(self, data):
            x, y = data
            return super().train_step((x, y))


def guide_model():
    inputs = keras.Input((32,))
    outputs = keras.layers.Dense(1)(keras.layers.Dense(64, activation="relu")(inputs))
    model = GuideModel(inputs, outputs)
    model.compile(optimizer="adam", loss="mse")
    return model


def test_a_custom_train_step_is_measured_through_the_step_fit_runs():
    model = guide_model()
    x = np.random.rand(16, 32).astype("float32")
    y = np.random.rand(16, 1).astype("float32")
    model.fit(x, y, epochs=1, verbose=0)  # builds the optimizer's slots
    before = state_of(model)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(64, 512, 4096))
    assert estimate.refusal == "" and estimate.predicted_batch_size > 4096
    assert_same_state(before, state_of(model))


def test_dict_inputs_and_two_outputs_work_like_arrays():
    image = keras.Input((16, 16, 3), name="image")
    meta = keras.Input((4,), name="meta")
    h = keras.layers.Conv2D(8, 3, activation="relu")(image)
    h = keras.layers.Concatenate()([keras.layers.GlobalAveragePooling2D()(h), meta])
    model = keras.Model({"image": image, "meta": meta},
                        {"label": keras.layers.Dense(3, name="label")(h),
                         "score": keras.layers.Dense(1, name="score")(h)})
    model.compile(optimizer="adam",
                  loss={"label": keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True), "score": "mse"})
    x = {"image": np.random.rand(8, 16, 16, 3).astype("float32"),
         "meta": np.random.rand(8, 4).astype("float32")}
    y = {"label": np.zeros((8,), "int32"), "score": np.zeros((8, 1), "float32")}
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(16, 128, 1024))
    assert estimate.refusal == "", estimate.explanation
    assert estimate.predicted_batch_size > 1024


@pytest.fixture(scope="module")
def keras_hub():
    return pytest.importorskip("keras_hub")


def test_a_keras_hub_gpt2_gets_an_answer():
    model, x, y = tiny_gpt2()
    keras.Model.fit(model, x, y, verbose=0)  # builds all
    before = state_of(model)
    estimate = estimate_max_batch_size(model, x, y,
                                       trial_sizes=(32, 256, 1024))
    assert estimate.refusal == "", estimate.explanation
    # logits over the vocabulary: 32 x 500 floats a sample, at least
    assert estimate.per_sample_bytes > 32 * 500 * 4
    assert estimate.predicted_batch_size > 1024
    assert_same_state(before, state_of(model))


def test_a_keras_hub_bert_classifier_gets_an_answer(keras_hub):
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=500, num_layers=2, num_heads=2, hidden_dim=32,
        intermediate_dim=64, max_sequence_length=32)
    model = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=3,
                                                preprocessor=None)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    x = {"token_ids": np.ones((4, 32), "int32"),
         "segment_ids": np.zeros((4, 32), "int32"),
         "padding_mask": np.ones((4, 32), "bool")}
    estimate = estimate_max_batch_size(model, x, np.zeros((4,), "int32"),
                                       trial_sizes=(32, 256, 1024))
    assert estimate.refusal == "", estimate.explanation
    assert estimate.predicted_batch_size > 1024


def test_the_default_ladder_climbs_from_one_and_says_why_it_stopped():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256),
                              keras.layers.Dense(8)])
    model.compile(optimizer="adam", loss="mse")
    lines = []
    estimate = estimate_max_batch_size(model, np.zeros((8, 64), "float32"),
                                       np.zeros((8, 8), "float32"),
                                       progress=lines.append)
    sizes = [o.batch_size for o in estimate.evidence.observations]
    assert sizes[0] == 1 and sizes == sorted(sizes) and len(sizes) >= 3
    assert len(lines) == len(sizes)
    assert estimate.predicted_batch_size is not None, estimate.explanation
    assert estimate.stopped == "" or "The ladder stopped" in estimate.explanation


def test_jax_can_measure_by_xla_plans_on_the_cpu():
    if BACKEND != "jax":
        with pytest.raises(ValueError, match="method='xla' only with the JAX"):
            estimate_max_batch_size(guide_model(), np.zeros((2, 32)), np.zeros((2, 1)),
                                    method="xla")
        return
    model = conv_model()
    x, y = conv_data()
    estimate = estimate_max_batch_size(model, x, y, method="xla", trial_sizes=SIZES)
    assert {o.how for o in estimate.evidence.observations} == {"plan"}
    assert estimate.predicted_batch_size > 128


def test_fresh_process_on_the_cpu_says_why_it_trains_here(caplog):
    model, (x, y) = guide_model(), (np.zeros((4, 32), "float32"),
                                    np.zeros((4, 1), "float32"))
    with caplog.at_level(logging.WARNING, logger="keras_memwatch"):
        estimate = estimate_max_batch_size(model, x, y, trial_sizes=(8, 64),
                                           fresh_process=True)
    assert "only PyTorch on a GPU under an allocator cap" in caplog.text
    assert all(o.how == STEP for o in estimate.evidence.observations)


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(headroom=1.0), ValueError, "headroom"),
    (dict(headroom="0.1"), TypeError, "headroom"),
    (dict(headroom=True), TypeError, "headroom"),
    (dict(trial_sizes=[8]), ValueError, "trial_sizes"),
    (dict(trial_sizes=[0, 4]), ValueError, "trial_sizes"),
    (dict(trial_sizes=8), TypeError, "trial_sizes"),
    (dict(method="reserved"), ValueError, "method"),
    (dict(fresh_process="yes"), TypeError, "fresh_process"),
    (dict(progress="print"), TypeError, "progress"),
    (dict(device="TPU:0"), ValueError, "device"),
])
def test_bad_arguments_are_refused_before_any_step(kwargs, error, name):
    model = guide_model()
    with pytest.raises(error, match=f"`{name}`"):
        estimate_max_batch_size(model, np.zeros((4, 32)), np.zeros((4, 1)), **kwargs)
    assert model.optimizer.iterations.numpy() == 0


def test_a_model_that_is_not_compiled_is_refused():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="compiled model"):
        estimate_max_batch_size(model, np.zeros((2, 4)), np.zeros((2, 1)))


def test_x_that_is_not_arrays_is_refused():
    with pytest.raises(TypeError, match="arrays"):
        estimate_max_batch_size(guide_model(), iter([1, 2]), None)


def test_max_seconds_is_honoured_and_the_answer_says_what_is_left_open(monkeypatch):
    from keras_memwatch.capacity import steps

    slow = steps.fit_steps

    def fit_steps(*args, **kwargs):  # a step of a larger model: 0.25 s more
        time.sleep(0.25)
        return slow(*args, **kwargs)
    monkeypatch.setattr(steps, "fit_steps", fit_steps)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256),
                              keras.layers.Dense(8)])
    model.compile(optimizer="adam", loss="mse")
    x, y = np.zeros((8, 64), "float32"), np.zeros((8, 8), "float32")
    lines = []  # when each size ended
    began = time.perf_counter()
    estimate = estimate_max_batch_size(
        model, x, y, max_seconds=2.0, verbose=0,
        progress=lambda line: lines.append(time.perf_counter() - began))
    took = time.perf_counter() - began
    # sizes are measured until the record can answer (two whose need
    # rises), whatever the time; from there none starts that cannot end in
    # time, and the estimate ends within a second of its last size
    assert took <= max(2.0, lines[-1]) + 1.0
    assert sum(t > 2.0 for t in lines) <= 1 or \
        estimate.evidence.line.batch_sizes[-1] == \
        estimate.evidence.observations[-1].batch_size
    assert estimate.max_seconds == 2.0 and estimate.seconds <= took + 0.01
    assert estimate.predicted_batch_size is not None, estimate.explanation
    assert "out of time (max_seconds)" in estimate.explanation
    assert set(estimate.left_open) == {0.1, 0.0}
    assert "out of time" in estimate.left_open[0.1]
    assert "of max_seconds=2." in estimate.explanation
    assert estimate.to_dict()["left_open"] == estimate.left_open


def test_a_budget_shorter_than_two_sizes_still_answers():
    model = guide_model()
    x, y = np.zeros((4, 32), "float32"), np.zeros((4, 1), "float32")
    estimate = estimate_max_batch_size(model, x, y, max_seconds=0.001, verbose=0)
    # the ladder goes on only until the record can answer (two sizes whose
    # need rises), however short the time
    assert estimate.evidence.line is not None
    sizes = [o.batch_size for o in estimate.evidence.observations]
    assert estimate.evidence.line.batch_sizes[-1] == sizes[-1]
    assert estimate.predicted_batch_size is not None, estimate.explanation
    assert "The ladder stopped: out of time (max_seconds)" in estimate.explanation


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(max_seconds=0), ValueError, "max_seconds"),
    (dict(max_seconds="60"), TypeError, "max_seconds"),
    (dict(compilation_cache=3), TypeError, "compilation_cache"),
    (dict(compilation_cache=""), ValueError, "compilation_cache"),
])
def test_bad_budgets_and_caches_are_refused_before_any_step(kwargs, error, name):
    model = guide_model()
    with pytest.raises(error, match=f"`{name}`"):
        estimate_max_batch_size(model, np.zeros((4, 32)), np.zeros((4, 1)), **kwargs)
    assert model.optimizer.iterations.numpy() == 0


@pytest.fixture
def jax_cache_restored(monkeypatch):
    """JAX's cache settings as they were, after the test."""
    from keras_memwatch.configure import compilation_cache

    monkeypatch.setattr(compilation_cache, "_ours", None)
    if BACKEND != "jax":
        yield
        return
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {n: getattr(jax.config, n) for n in names}
    yield
    for n, v in before.items():
        jax.config.update(n, v)
    jax_cache.reset_cache()


def test_compilation_cache_is_accepted_on_every_backend(tmp_path, jax_cache_restored):
    estimate = estimate_max_batch_size(
        guide_model(), np.zeros((4, 32), "float32"), np.zeros((4, 1), "float32"),
        trial_sizes=(64, 512, 4096), compilation_cache=str(tmp_path / "c"), verbose=0)
    assert estimate.refusal == "", estimate.explanation
    assert (tmp_path / "c").is_dir() == (BACKEND == "jax")
