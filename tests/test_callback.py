"""MemWatch inside real `model.fit` calls on the CPU, on the active backend."""

import inspect
import logging
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest

from conftest import FakeProbe, scripted, tiny_data, tiny_model
from keras_memwatch import MemWatch, load_log
from keras_memwatch import columns as C

MIB = 2**20


def fit(watch, epochs=2, n=64, batch_size=16, model=None, **kwargs):
    model = model or tiny_model()
    x, y = tiny_data(n)
    return model.fit(x, y, epochs=epochs, batch_size=batch_size,
                     callbacks=[watch, *kwargs.pop("callbacks", [])],
                     verbose=0, **kwargs)


def test_every_hook_it_defines_is_a_keras_hook():
    defined = [name for name, _ in inspect.getmembers(MemWatch, inspect.isfunction)
               if name.startswith("on_") and name in vars(MemWatch)]
    assert defined
    for name in defined:
        assert hasattr(keras.callbacks.Callback, name), name
        assert (inspect.signature(getattr(MemWatch, name)).parameters.keys()
                == inspect.signature(getattr(keras.callbacks.Callback, name)).parameters.keys())


def _torch_on_the_cpu():
    if keras.backend.backend() != "torch":
        return False
    import torch

    return not torch.cuda.is_available()


def test_is_async_safe_where_steps_are_asynchronous():
    watch = MemWatch(probes="host")
    callbacks = keras.callbacks.CallbackList([watch])
    if _torch_on_the_cpu():
        # Synchronous steps: hooks stay on the training thread, so that each
        # sample's peak is its own step's.
        assert watch.async_safe is False and not callbacks._async_train
    else:
        assert watch.async_safe is True
        if keras.backend.backend() == "jax":
            assert callbacks._async_train


def test_records_train_begin_and_every_batch_of_every_epoch():
    watch = MemWatch(probes="host")
    fit(watch, epochs=2)
    frame = watch.to_dataframe()
    assert frame["step"].tolist() == list(range(9))
    assert frame["device"].unique().tolist() == ["host"]
    assert frame["epoch"].tolist() == [0] * 5 + [1] * 4
    assert frame["batch"].tolist()[1:] == [0, 1, 2, 3] * 2
    assert pd.isna(frame["batch"].iloc[0])
    assert (frame["phase"] == "train").all()
    assert frame["time_s"].is_monotonic_increasing
    for col in (C.HOST_RSS, C.HOST_PEAK_RSS, "current_bytes", "peak_bytes"):
        assert frame[col].notna().all() and (frame[col] > 10 * MIB).all(), col
    assert frame[C.ALLOCATOR_CURRENT].isna().all()


def test_auto_probes_on_a_cpu_machine_record_the_host():
    watch = MemWatch()
    fit(watch, epochs=1)
    frame = watch.to_dataframe()
    assert "host" in frame["device"].tolist()
    assert len(frame[frame["device"] == "host"]) == 5


def test_during_a_fit_it_can_be_sampled_on_demand_without_recording():
    watch = MemWatch(probes="host", verbose=0)
    seen = []

    class Peek(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((watch.training, watch.sample_now()))

    x, y = tiny_data(32)
    tiny_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[watch, Peek()])
    assert [training for training, _ in seen] == [True, True]
    assert all(set(now) == {"host"} and now["host"]["current_bytes"] > 0
               for _, now in seen)
    assert len(watch.to_dataframe()) == 3  # train begin and two batches only
    assert not watch.training and watch.sample_now() == {}
    assert watch.sources["host"].startswith("host: RSS")


def test_one_instance_serves_several_fits():
    watch = MemWatch(probes="host")
    fit(watch, epochs=2)
    fit(watch, epochs=1)
    frame = watch.to_dataframe()
    assert frame["step"].tolist() == list(range(5))
    assert frame["epoch"].max() == 0


def test_every_n_batches():
    watch = MemWatch(probes="host", every_n_batches=3)
    fit(watch, epochs=2, n=96)  # 6 batches an epoch
    frame = watch.to_dataframe()
    assert frame["batch"].tolist()[1:] == [2, 5, 2, 5]
    assert frame["epoch"].tolist() == [0, 0, 0, 1, 1]


@pytest.mark.skipif(keras.backend.backend() == "torch",
                    reason="PyTorch backend requires steps_per_execution=1")
def test_steps_per_execution_samples_once_per_execution():
    model = tiny_model()
    model.compile(optimizer="adam", loss="mse", steps_per_execution=2)
    watch = MemWatch(probes="host")
    fit(watch, epochs=1, n=64, model=model)
    assert watch.to_dataframe()["batch"].tolist()[1:] == [1, 3]


def test_validation_batches_are_recorded_as_test_rows():
    x, y = tiny_data(32, seed=1)
    watch = MemWatch(probes="host")
    fit(watch, epochs=2, validation_data=(x, y))
    frame = watch.to_dataframe()
    assert frame["phase"].tolist() == (["train"] * 5 + ["test"] * 2
                                       + ["train"] * 4 + ["test"] * 2)
    assert frame["step"].is_monotonic_increasing
    assert not frame.loc[frame["phase"] == "test", "spike"].any()


def test_memory_metrics_reach_history_and_csvlogger(tmp_path):
    csv = tmp_path / "history.csv"
    history = fit(MemWatch(probes="host"), epochs=2,
                  callbacks=[keras.callbacks.CSVLogger(str(csv))])
    assert len(history.history["mem_peak_mib"]) == 2
    assert all(v > 10 for v in history.history["mem_peak_mib"])
    assert "mem_current_mib" in history.history
    logged = pd.read_csv(csv)
    assert {"mem_peak_mib", "mem_current_mib"} <= set(logged.columns)


def test_batch_logs_carry_the_metrics():
    seen = []
    probe = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(dict(logs)))
    fit(MemWatch(probes="host"), epochs=1, callbacks=[probe])
    assert len(seen) == 4
    assert all(logs["mem_peak_mib"] > 10 for logs in seen)


def test_add_to_logs_false_leaves_logs_alone():
    history = fit(MemWatch(probes="host", add_to_logs=False), epochs=1)
    assert "mem_peak_mib" not in history.history


def test_streamed_log_equals_the_dataframe(tmp_path):
    watch = MemWatch(probes="host", log_path=tmp_path / "mem.csv")
    fit(watch, epochs=2)
    pd.testing.assert_frame_equal(load_log(tmp_path / "mem.csv"), watch.to_dataframe())


def test_a_second_fit_streams_to_a_new_file(tmp_path):
    watch = MemWatch(probes="host", log_path=tmp_path / "mem.csv")
    fit(watch, epochs=1)
    fit(watch, epochs=1)
    assert watch.log_paths == [str(tmp_path / "mem.csv"), str(tmp_path / "mem.1.csv")]
    pd.testing.assert_frame_equal(load_log(watch.log_paths[1]), watch.to_dataframe())
    assert len(load_log(watch.log_paths[0])) == 5


def test_to_csv_and_parquet_round_trip(tmp_path):
    watch = MemWatch(probes="host")
    fit(watch, epochs=1)
    watch.to_csv(tmp_path / "m.csv")
    pd.testing.assert_frame_equal(load_log(tmp_path / "m.csv"), watch.to_dataframe())
    watch.to_parquet(tmp_path / "m.parquet")
    back = pd.read_parquet(tmp_path / "m.parquet")
    assert back["peak_bytes"].tolist() == watch.to_dataframe()["peak_bytes"].tolist()


def test_spikes_are_flagged_logged_and_passed_to_on_spike(memwatch_logs):
    working = [40, 41, 39, 40, 42, 40, 400, 41, 40, 39, 40, 41, 40, 420, 40, 40]
    events = []
    watch = MemWatch(probes=[scripted(working)], on_spike=events.append)
    fit(watch, epochs=1, n=256)  # 16 batches
    frame = watch.to_dataframe()
    assert frame.loc[frame["spike"], "batch"].tolist() == [6, 13]
    assert [(e.batch, e.device) for e in events] == [(6, "GPU:0"), (13, "GPU:0")]
    spikes = watch.spikes
    assert spikes["batch"].tolist() == [6, 13]
    assert spikes["peak_bytes"].tolist() == [900 * MIB, 920 * MIB]
    assert spikes["ratio"].round(1).tolist() == [10.0, 10.5]
    alerts = [r.getMessage() for r in memwatch_logs.records if r.levelno == logging.WARNING]
    assert alerts == [
        "memory spike at epoch 0 batch 6 on GPU:0: peak 900 MiB vs baseline 540 MiB "
        "(this step needed 400 MiB, 10.0x the usual 40.0 MiB)",
        "memory spike at epoch 0 batch 13 on GPU:0: peak 920 MiB vs baseline 540 MiB "
        "(this step needed 420 MiB, 10.5x the usual 40.0 MiB)",
    ]
    baseline = frame["baseline_bytes"]
    assert baseline.iloc[:6].isna().all()  # train begin and warm-up
    assert (baseline.iloc[6:] == 540 * MIB).all()


def test_verbose_0_records_spikes_silently(memwatch_logs):
    watch = MemWatch(probes=[scripted([40] * 8 + [500] + [40] * 7)], verbose=0)
    fit(watch, epochs=1, n=256)
    assert watch.spikes["batch"].tolist() == [8]
    assert not [r for r in memwatch_logs.records if r.levelno >= logging.WARNING]


def test_on_spike_may_stop_training():
    watch = MemWatch(probes=[scripted([40] * 8 + [500] + [40] * 7)])
    watch.on_spike = lambda event: setattr(watch.model, "stop_training", True)
    fit(watch, epochs=3, n=256)
    assert watch.to_dataframe()["epoch"].max() == 0


def test_on_spike_errors_do_not_stop_training(memwatch_logs):
    def broken(event):
        raise RuntimeError("user bug")

    watch = MemWatch(probes=[scripted([40] * 8 + [500] + [40] * 7)], on_spike=broken)
    fit(watch, epochs=1, n=256)
    assert len(watch.to_dataframe()) == 17
    assert "user bug" in memwatch_logs.text


def test_a_failing_probe_never_crashes_fit(memwatch_logs):
    probe = FakeProbe([RuntimeError("NVML: GPU is lost")])
    watch = MemWatch(probes=[probe, "host"])
    fit(watch, epochs=2)
    frame = watch.to_dataframe()
    assert len(frame) == 18  # every sample kept, GPU values missing
    assert frame.loc[frame["device"] == "GPU:0", "peak_bytes"].isna().all()
    assert memwatch_logs.text.count("GPU is lost") == 1


def test_summary_names_devices_peaks_and_sources():
    watch = MemWatch(probes="host")
    fit(watch, epochs=1)
    text = watch.summary()
    assert "host: peak" in text and ("MiB" in text or "GiB" in text)
    assert "since the previous sample" in text or "high-water" in text


def test_a_leak_is_reported_once_per_epoch_not_as_spikes(memwatch_logs):
    # 2 MiB more held after every step, 40 MiB of working memory each.
    values = [(500 * MIB, 500 * MIB)]
    values += [((500 + 2 * i) * MIB, (540 + 2 * i) * MIB) for i in range(1, 129)]
    watch = MemWatch(probes=[FakeProbe(values)])
    fit(watch, epochs=2, n=1024)  # 64 batches an epoch
    assert watch.spikes.empty
    drift = [r.getMessage() for r in memwatch_logs.records if "drift" in r.getMessage()]
    assert len(drift) == 2
    assert drift[0].startswith("memory drift on GPU:0 in epoch 0: baseline grew from")


def test_an_allocator_sawtooth_is_not_a_leak(memwatch_logs):
    values = [(500 * MIB, 500 * MIB)]
    values += [((500 + 20 * (i % 8)) * MIB, (540 + 20 * (i % 8)) * MIB) for i in range(1, 129)]
    watch = MemWatch(probes=[FakeProbe(values)])
    fit(watch, epochs=2, n=1024)
    assert watch.spikes.empty
    assert "drift" not in memwatch_logs.text


def test_no_absurd_ratio_against_a_near_zero_usual_step(memwatch_logs):
    static = 500 * MIB
    working = [10 * 1024] * 8 + [500 * MIB] + [10 * 1024] * 7  # usually 10 KiB
    probe = FakeProbe([(static, static)] + [(static, static + w) for w in working])
    watch = MemWatch(probes=[probe])
    fit(watch, epochs=1, n=256)
    assert pd.isna(watch.spikes["ratio"].iloc[0])
    assert "this step needed 500 MiB, against a usual 10.0 KiB" in memwatch_logs.text
    assert "x the usual" not in memwatch_logs.text
    assert "x the usual" not in watch.summary()


def test_a_burst_of_spikes_is_one_alert_and_one_summary(memwatch_logs):
    # A new, persistent level: flagged a few times, then accepted.
    watch = MemWatch(probes=[scripted([40] * 8 + [600] * 8)])
    fit(watch, epochs=1, n=256)
    flagged = watch.spikes["batch"].tolist()
    assert len(flagged) >= 2 and flagged == list(range(8, 8 + len(flagged)))
    warnings = [r.getMessage() for r in memwatch_logs.records if r.levelname == "WARNING"]
    assert len(warnings) == 2
    assert warnings[0].startswith("memory spike at epoch 0 batch 8 on GPU:0")
    assert warnings[1].startswith(
        f"memory spike burst on GPU:0: {len(flagged)} consecutive spiking samples")


class InOrder(keras.callbacks.Callback):
    """A batch-end hook that is not async-safe: Keras then runs every batch
    hook in order on the training thread, so batches count samples exactly
    (with async dispatch, hooks may run some batches behind the step)."""

    def on_train_batch_end(self, batch, logs=None):
        pass


def test_on_spike_returning_true_stops_training_within_the_bound(memwatch_logs):
    watch = MemWatch(probes=[scripted([40] * 8 + [500] + [40] * 7)],
                     on_spike=lambda event: True)
    # 512 batches an epoch; the spike is batch 8.
    fit(watch, epochs=3, n=16 * 512, callbacks=[InOrder()])
    frame = watch.to_dataframe()
    assert frame["epoch"].max() == 0
    assert frame["batch"].max() <= 8 + 256 + 1  # 256 sampled batches, and the next
    assert "on_spike returned True at epoch 0 batch 8: training stops" in memwatch_logs.text


def test_on_spike_returning_anything_else_goes_on():
    watch = MemWatch(probes=[scripted([40] * 8 + [500] + [40] * 7)],
                     on_spike=lambda event: event)  # truthy, but not True
    fit(watch, epochs=2, n=256)
    assert watch.to_dataframe()["epoch"].max() == 1


def test_exports_never_replace_a_file_unless_asked(tmp_path):
    watch = MemWatch(probes="host")
    fit(watch, epochs=1)
    writers = {"m.csv": watch.to_csv, "m.parquet": watch.to_parquet,
               "m.png": watch.plot}
    for name, write in writers.items():
        path = tmp_path / name
        path.write_bytes(b"earlier")
        with pytest.raises(FileExistsError, match="overwrite=True") as raised:
            write(path)
        assert str(path) in str(raised.value)
        assert path.read_bytes() == b"earlier"
        write(path, overwrite=True)
        assert path.read_bytes() != b"earlier"
    pd.testing.assert_frame_equal(load_log(tmp_path / "m.csv"), watch.to_dataframe())
    import matplotlib.pyplot as plt

    plt.close("all")


# -- a source without a per-step peak: only what it can see is judged --------

def test_jitter_of_the_current_value_is_never_a_spike_only_a_rising_mark_is():
    rng = np.random.default_rng(0)
    mark = 600 * MIB
    values = [(300 * MIB, mark)]
    for batch in range(40):
        if batch == 30:
            mark = 1600 * MIB  # one step needed far more: the mark rises once
        values.append((int(rng.uniform(10, 520)) * MIB, mark))
    probe = FakeProbe(values)
    probe.peak_per_sample = False  # a high-water mark, as JAX's allocator gives
    watch = MemWatch(probes=[probe], verbose=0)
    fit(watch, epochs=1, n=40 * 16)
    assert watch.spikes["batch"].tolist() == [30]
    frame = watch.to_dataframe()
    assert frame["peak_bytes"].notna().sum() == 1  # the only peak it saw
    assert watch.spikes["baseline_bytes"].iloc[0] == 600 * MIB  # the old mark


def test_one_step_up_then_flat_is_a_rise_not_a_leak(memwatch_logs):
    up = [(500 * MIB, 540 * MIB)] * 10 + [(600 * MIB, 640 * MIB)] * 54
    watch = MemWatch(probes=[FakeProbe([(500 * MIB, 500 * MIB)] + up)])
    fit(watch, epochs=1, n=64 * 16)
    assert "drift" not in memwatch_logs.text
    summary = watch.summary()
    assert "Drift: none" in summary
    assert ("One-off rises (not leaks):\n  GPU:0 in epoch 0: in use rose from "
            "500 MiB to 600 MiB at once, then stayed") in summary


def test_a_steady_slope_is_drift_reported_once(memwatch_logs):
    slope = [((500 + 2 * i) * MIB, (540 + 2 * i) * MIB) for i in range(64)]
    watch = MemWatch(probes=[FakeProbe([(500 * MIB, 500 * MIB)] + slope)])
    fit(watch, epochs=1, n=64 * 16)
    assert memwatch_logs.text.count("memory drift on GPU:0 in epoch 0") == 1


# -- one time axis ----------------------------------------------------------


def test_timestamps_are_unix_seconds_monotone_across_fit_evaluate_and_predict(tmp_path):
    import time

    watch = MemWatch(probes="host", verbose=0, log_path=tmp_path / "mem.csv")
    model, (x, y) = tiny_model(), tiny_data(64)
    began = time.time()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[watch])
    model.evaluate(x, y, batch_size=16, verbose=0, callbacks=[watch])
    model.predict(x, batch_size=16, verbose=0, callbacks=[watch])
    ended = time.time()
    frame = watch.to_dataframe()
    stamps = frame["timestamp"].to_numpy()
    assert frame["call"].tolist() == sorted(frame["call"])  # fit, evaluate, predict
    assert (np.diff(stamps) >= 0).all() and began <= stamps[0] and stamps[-1] <= ended
    # time_s counts from each call's start; the timestamp does not restart
    first_of_each = frame.groupby("call")["time_s"].first()
    assert (first_of_each < 0.5).all()
    logged = load_log(watch.log_paths)  # the streamed logs, one per call
    assert np.allclose(logged["timestamp"], stamps, atol=1e-5)


def test_two_processes_writing_one_log_path_line_up_on_the_timestamp(tmp_path):
    import os
    import subprocess
    import sys
    import time

    script = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from conftest import tiny_data, tiny_model\n"
        "from keras_memwatch import MemWatch\n"
        "x, y = tiny_data(64)\n"
        f"watch = MemWatch(probes='host', verbose=0, log_path={str(tmp_path / 'mem.csv')!r})\n"
        "tiny_model().fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[watch])\n")
    root = Path(__file__).resolve().parents[1]
    began = time.time()
    runs = [subprocess.Popen([sys.executable, "-c", script], cwd=root, text=True,
                             stderr=subprocess.PIPE,
                             env=dict(os.environ, RANK=str(rank), WORLD_SIZE="2"))
            for rank in (0, 1)]  # two ranks of one job, at once
    for run in runs:
        assert run.wait(timeout=300) == 0, run.stderr.read()[-2000:]
    ended = time.time()
    both = load_log(tmp_path / "mem.rank*.csv")
    assert sorted(both["process"].unique()) == [0, 1]
    for _, rows in both.groupby("process"):
        stamps = rows["timestamp"].to_numpy()
        assert (np.diff(stamps) >= 0).all()
        assert began <= stamps[0] and stamps[-1] <= ended


def test_ways_to_fit_measures_the_model_it_watched_and_keeps_the_table(
        jax_config, tmp_path):
    watch = MemWatch(probes="host", verbose=0,
                     compilation_cache=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="has been used in `fit`"):
        watch.ways_to_fit(*tiny_data(8))
    fit(watch, epochs=1)
    table = watch.ways_to_fit(*tiny_data(8), levers=["sgd_momentum"],
                              combinations=False, verbose=0)
    assert watch.ways is table
    assert list(table["lever"]) == ["as is", "sgd_momentum"]
    # the watch's compilation cache serves the table's compilations (JAX)
    assert table.attrs["compilation_cache"] == watch.compilation_cache
    assert "Ways to fit a batch of 8" in watch.summary()
