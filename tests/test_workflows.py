"""MemWatch in the workflows users already run, with the real libraries:
a KerasTuner search, `evaluate` and `predict`, keras-hub models, threaded
`PyDataset` workers, and JAX steps dispatched ahead of the device."""

from __future__ import annotations

import copy
import pickle
import sys
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest

from conftest import FakeProbe, tiny_data, tiny_model
from keras_memwatch import MemWatch, load_log
from keras_memwatch import columns as C
from keras_memwatch.cli import main as cli
from keras_memwatch.explain.report import report_text
from keras_memwatch.session.batch_hooks import NAMES
from keras_memwatch.record.probes.base import Probe
from keras_memwatch.units import format_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.gpu.jax_peaks import BatchLogs, logs_against_rows  # noqa: E402

MIB = 2**20


def fit(watch, model=None, epochs=2, n=64, **kwargs):
    x, y = tiny_data(n)
    model = model or tiny_model()
    model.fit(x, y, batch_size=16, epochs=epochs, verbose=0,
              callbacks=[watch, *kwargs.pop("callbacks", [])], **kwargs)
    return model


def assert_each_batch_logs_its_own_row_or_names_a_prior_one(frame, logs, device):
    """A batch's `mem_*` figures are its row's; where its read was not taken
    yet, an earlier batch's, under the `_prior_batch` names; never both."""
    steps = frame[(frame["device"] == device) & (frame["phase"] == "train")
                  & frame["batch"].notna()]
    own, prior, wrong = logs_against_rows(steps, logs)
    assert wrong == 0 and own + prior == len(steps) == len(logs) > 0


# -- copies -------------------------------------------------------------------


def test_a_deep_copy_is_a_new_watch_with_the_same_options(tmp_path):
    events = []
    probe = FakeProbe([(500 * MIB, 540 * MIB)])
    watch = MemWatch(every_n_batches=2, window=20, threshold=2.0, min_delta_mb=8,
                     warmup=3, log_path=tmp_path / "mem.csv", on_spike=events.append,
                     add_to_logs=False, probes=[probe, "host"], verbose=0,
                     max_rows=100)
    options = ("every_n_batches", "window", "threshold", "min_delta_mb", "warmup",
               "log_path", "on_spike", "add_to_logs", "verbose", "max_rows")
    for recorded in (False, True):
        if recorded:
            fit(watch)
        twin = copy.deepcopy(watch)
        assert ([getattr(twin, o) for o in options]
                == [getattr(watch, o) for o in options])
        assert twin.on_spike is watch.on_spike  # the user's callable, shared
        copied = twin._sampler.probes[0]
        assert isinstance(copied, FakeProbe) and copied is not probe
        assert twin.to_dataframe().empty and twin.spikes.empty
        assert twin.log_paths == [] and twin.model is None and not twin.training
        assert not any(name in vars(twin) for name in NAMES)
        assert twin._sampler is not watch._sampler
    frame = watch.to_dataframe()
    fit(twin, epochs=1)
    assert len(twin.to_dataframe()) == 2 * 3  # two devices, train begin and 2 batches
    pd.testing.assert_frame_equal(watch.to_dataframe(), frame)  # untouched
    assert twin.log_paths == [str(tmp_path / "mem.1.csv")]


def test_an_unused_watch_pickles_and_a_recording_one_says_what_to_do():
    back = pickle.loads(pickle.dumps(MemWatch(probes="host", window=7, verbose=0)))
    assert back.window == 7 and back.to_dataframe().empty
    fit(back, epochs=1)
    with pytest.raises(TypeError,
                       match=r"recorded 1 call.*Pickle watch.to_dataframe\(\)"):
        pickle.dumps(back)


# -- KerasTuner ---------------------------------------------------------------


def random_search(keras_tuner):
    """KerasTuner's `RandomSearch`. On TensorFlow it imports tensorboard at
    every trial to set up TensorBoard callbacks (there are none here), and
    the test extra does not install it: without it, that step is left out."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        class RandomSearch(keras_tuner.RandomSearch):
            def _configure_tensorboard_dir(self, callbacks, trial, execution=0):
                pass

        return RandomSearch
    return keras_tuner.RandomSearch


def test_a_kerastuner_search_leaves_one_complete_log_per_trial(tmp_path, capsys):
    keras_tuner = pytest.importorskip("keras_tuner")

    def build(hp):
        model = keras.Sequential([
            keras.Input((8,)),
            keras.layers.Dense(hp.Int("units", 4, 16, step=4), activation="relu"),
            keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        return model

    tuner = random_search(keras_tuner)(build, objective="val_loss", max_trials=2,
                                       seed=1, directory=str(tmp_path / "tuner"),
                                       project_name="p")
    x, y = tiny_data(64)
    watch = MemWatch(probes="host", log_path=tmp_path / "kt.csv", verbose=0)
    tuner.search(x, y, epochs=2, batch_size=16, validation_data=(x[:32], y[:32]),
                 callbacks=[watch], verbose=0)
    trials = sorted(tuner.oracle.trials)
    assert len(trials) == 2
    paths = [tmp_path / f"kt.trial{t}.csv" for t in trials]
    assert sorted(tmp_path.glob("*.csv")) == sorted(paths)
    for path in paths:
        frame = load_log(path)
        steps = frame[frame["batch"].notna()]
        assert steps.groupby(["epoch", "phase"], observed=True).size().to_dict() == {
            (0, "train"): 4, (0, "test"): 2, (1, "train"): 4, (1, "test"): 2}
    assert watch.to_dataframe().empty  # the search ran copies of it
    report = report_text(load_log([str(p) for p in paths]))
    for path in paths:
        assert f"({path})" in report
    assert cli(["report", *map(str, paths)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("keras_memwatch summary: 8 training steps") == 2


# -- evaluate and predict -----------------------------------------------------


def test_evaluate_and_predict_are_recorded_as_calls_of_their_own(tmp_path):
    watch = MemWatch(probes="host", log_path=tmp_path / "mem.csv", verbose=0)
    x, y = tiny_data(64)
    model = fit(watch, validation_data=(x[:32], y[:32]))
    model.evaluate(x, y, batch_size=16, callbacks=[watch], verbose=0)
    model.predict(x, batch_size=32, callbacks=[watch], verbose=0)
    frame = watch.to_dataframe()
    calls = {call: rows for call, rows in frame.groupby(C.CALL)}
    assert list(calls) == [0, 1, 2]
    assert calls[0]["phase"].tolist() == (["train"] * 5 + ["test"] * 2
                                          + ["train"] * 4 + ["test"] * 2)
    assert calls[1]["phase"].tolist() == ["test"] * 5
    assert calls[2]["phase"].tolist() == ["predict"] * 3
    for rows in calls.values():  # numbered like training, within each call
        assert rows["step"].tolist() == list(range(len(rows)))
        assert pd.isna(rows["batch"].iloc[0])
        assert (rows.loc[rows["batch"].notna(), "peak_bytes"] > 10 * MIB).all()
    assert calls[1]["batch"].tolist()[1:] == [0, 1, 2, 3]
    assert watch.log_paths == [str(tmp_path / n) for n in ("mem.csv", "mem.1.csv",
                                                           "mem.2.csv")]
    for call, path in enumerate(watch.log_paths):
        logged = load_log(path)
        assert set(logged[C.CALL]) == {call}
        assert len(logged) == len(calls[call])
    summary = watch.summary()
    assert summary.splitlines()[0] == (
        "keras_memwatch summary: 8 training steps sampled over 2 epoch(s), 8 test "
        "batches (validation and evaluate), 2 predict batches")
    assert "  test on host: 8 batches (validation and evaluate), peak " in summary
    assert "  predict on host: 2 batches, peak " in summary
    fit(watch, epochs=1)  # a new fit starts a new record
    assert set(watch.to_dataframe()[C.CALL]) == {0}


class Scripted(Probe):
    """A GPU with a peak per step, replaying `(current, peak)` MiB per phase
    from the start of each call."""

    name = "scripted"
    columns = (C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK, C.ALLOCATOR_LIMIT)
    peak_per_sample = True

    def __init__(self, script):
        self.script, self.phase = script, "train"

    def start(self):
        self.reads = iter(self.script[self.phase])
        return ("GPU:0",)

    def read(self):
        current, peak = next(self.reads)
        return ((current * MIB, peak * MIB, 16 * 2**30),)


def test_each_phase_is_judged_against_its_own_baseline(tmp_path):
    # Training steps need 400 MiB; prediction steps 40 MiB, and one 400 MiB:
    # a spike for prediction, where the training baseline would hide it.
    predict = [40] * 10 + [400] + [40] * 5
    probe = Scripted({"train": [(500, 500)] + [(500, 900)] * 16,
                      "predict": [(500, 500)] + [(500, 500 + w) for w in predict]})
    watch = MemWatch(probes=[probe], verbose=0, log_path=tmp_path / "mem.csv")
    x, _ = tiny_data(256)
    model = fit(watch, epochs=1, n=256)
    probe.phase = "predict"
    model.predict(x, batch_size=16, callbacks=[watch], verbose=0)
    spikes = watch.spikes
    assert spikes[["phase", "call", "batch"]].values.tolist() == [["predict", 1, 10]]
    assert spikes["working_bytes"].tolist() == [400 * MIB]
    assert spikes["usual_working_bytes"].tolist() == [40 * MIB]
    frame = watch.to_dataframe()
    predicted = frame[frame["phase"] == "predict"]
    assert predicted["baseline_bytes"].dropna().unique().tolist() == [540 * MIB]
    summary = watch.summary()
    assert "GPU:0: peak 900 MiB" in summary and "  no spikes" in summary
    assert ("    1 spike(s); worst 900 MiB at call 1 epoch 0 batch 10 (it needed "
            "400 MiB, 10.0x the usual 40.0 MiB)") in summary
    merged = report_text(load_log(watch.log_paths))
    assert "predict on GPU:0: 16 batches" in merged and "1 spike(s)" in merged


def test_the_plot_shows_the_calls_one_after_another(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from keras_memwatch.explain import plot as P

    watch = MemWatch(probes="host", verbose=0)
    x, y = tiny_data(64)
    model = fit(watch, epochs=1, validation_data=(x[:32], y[:32]))
    model.predict(x, batch_size=16, callbacks=[watch], verbose=0)
    figure = watch.plot()
    ax = figure.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines[P.LABEL_PEAK].get_xdata()) == list(range(7 + 5))
    labels = {artist.get_label() for artist in ax.get_children()}
    assert {P.LABEL_VALIDATION, P.LABEL_PREDICT, P.LABEL_CALL} <= labels
    plt.close(figure)


# -- keras-hub ----------------------------------------------------------------


def hub_model(name):
    keras_hub = pytest.importorskip("keras_hub")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (16, 8)).astype("int32")
    x = {"token_ids": tokens, "padding_mask": np.ones((16, 8), "int32")}
    sizes = dict(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16,
                 intermediate_dim=32, max_sequence_length=16)
    if name == "gpt2":
        model = keras_hub.models.GPT2CausalLM(
            backbone=keras_hub.models.GPT2Backbone(**sizes), preprocessor=None)
        y = rng.integers(0, 64, (16, 8)).astype("int32")
    else:
        x["segment_ids"] = np.zeros((16, 8), "int32")
        model = keras_hub.models.BertTextClassifier(
            backbone=keras_hub.models.BertBackbone(**sizes), num_classes=2,
            preprocessor=None)
        y = rng.integers(0, 2, (16,)).astype("int32")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    return model, x, y


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_keras_hub_models_fit_evaluate_and_predict_under_watch(name):
    model, x, y = hub_model(name)
    watch = MemWatch(probes="host", verbose=0)
    model.fit(x, y, batch_size=4, epochs=1, callbacks=[watch], verbose=0)
    model.evaluate(x, y, batch_size=4, callbacks=[watch], verbose=0)
    model.predict(x, batch_size=4, callbacks=[watch], verbose=0)
    frame = watch.to_dataframe()
    assert frame.groupby(C.CALL)["phase"].agg(lambda p: sorted(set(p))).tolist() == [
        ["train"], ["test"], ["predict"]]
    steps = frame[frame["batch"].notna()]
    assert steps.groupby(C.CALL).size().tolist() == [4, 4, 4]
    assert (steps["peak_bytes"] >= steps["current_bytes"]).all()
    assert watch.breakdown()["weights_bytes"] > 0


# -- Keras's logs with threaded data workers ----------------------------------


class Threaded(keras.utils.PyDataset):
    """Batches of 8 made by two worker threads."""

    def __init__(self):
        super().__init__(workers=2, use_multiprocessing=False)
        self.x, self.y = tiny_data(8 * 24)

    def __len__(self):
        return 24

    def __getitem__(self, index):
        at = slice(8 * index, 8 * index + 8)
        return self.x[at], self.y[at]


def test_batch_logs_carry_the_batchs_own_figures_with_threaded_workers():
    watch, seen = MemWatch(probes="host", verbose=0), BatchLogs()
    tiny_model().fit(Threaded(), epochs=2, verbose=0, callbacks=[watch, seen])
    assert len(seen.logs) == 48
    assert_each_batch_logs_its_own_row_or_names_a_prior_one(
        watch.to_dataframe(), seen.logs, "host")


# -- JAX steps in flight --------------------------------------------------------

STATE = 100 * MIB  # in use between steps
IN_FLIGHT = 600 * MIB  # what a reading holds when it catches a step in flight


class InFlightGPU(Probe):
    """A JAX GPU as its allocator reports it: no per-step peak, `in_use`
    between steps, and every third reading taken while a step is in flight."""

    name = "in flight"
    columns = (C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK, C.ALLOCATOR_LIMIT)
    peak_per_sample = False

    def __init__(self, in_use=STATE):
        self.in_use = in_use

    def start(self):
        self.reads, self.high_water = 0, 0
        return ("GPU:0",)

    def read(self):
        self.reads += 1
        current = self.in_use + (IN_FLIGHT if self.reads % 3 == 0 else 0)
        self.high_water = max(self.high_water, current)
        return ((current, self.high_water, 16 * 2**30),)


@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="XLA's plan is read on the JAX backend")
def test_on_jax_every_output_counts_a_step_once(monkeypatch):
    import jax

    from keras_memwatch.cli.demo import OversizedBatches
    from keras_memwatch.judge import xla_plan

    # The fake GPU is the device the step runs on, as on a JAX GPU.
    monkeypatch.setattr("keras_memwatch.record.probes.jax.local_gpu_names",
                        lambda: ("GPU:0",))
    model = keras.Sequential([keras.Input((16, 16, 3)),
                              keras.layers.Conv2D(8, 3, padding="same"),
                              keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    watch = MemWatch(probes=[InFlightGPU()], verbose=0, min_delta_mb=0.01)
    seen = BatchLogs()
    data = OversizedBatches(batches=12, batch_size=2, oversized=64, every=6,
                            input_shape=(16, 16, 3), classes=4)
    model.fit(data, epochs=2, shuffle=False, verbose=0, callbacks=[watch, seen])
    state = sum(int(leaf.nbytes) for leaf in
                jax.tree_util.tree_leaves(xla_plan.training_state(model)))
    frame = watch.to_dataframe()
    steps = frame[frame["batch"].notna()]
    working = steps[C.PLAN] - state
    assert steps[C.PLAN].notna().all()
    assert (steps["peak_bytes"] == STATE + working).all()
    assert (steps["peak_bytes"] <= steps["current_bytes"] + steps[C.PLAN]).all()
    largest = STATE + int(working.max())
    assert (f"GPU:0: peak {format_bytes(largest)}, typical step peak "
            f"{format_bytes(STATE + int(working.median()))}, in use between steps "
            f"{format_bytes(STATE)}") in watch.summary()
    assert set(watch.spikes["peak_bytes"]) == {largest}
    assert watch.spikes["batch"].tolist() == [5, 11, 5, 11]
    assert_each_batch_logs_its_own_row_or_names_a_prior_one(frame, seen.logs, "GPU:0")
