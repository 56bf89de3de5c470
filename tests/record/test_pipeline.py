"""The pipeline hands blocks to its consumers off the hot path, within its
bounds, in the order read; a consumer that fails loses no row."""

from __future__ import annotations

import time

import keras

from conftest import FakeProbe, tiny_data, tiny_model
from keras_memwatch import MemWatch, load_log
from keras_memwatch.record.pipeline import Pipeline
from keras_memwatch.record.recorder import Recorder
from keras_memwatch.record.sampler import Sampler
from keras_memwatch.judge.block_judge import BlockJudge
from keras_memwatch.judge.detector import SpikeSettings
from keras_memwatch.judge.spikes import SpikeMonitor

MIB = 2**20


def started(values, interval_s=0.05, block=128):
    sampler = Sampler([FakeProbe(values)])
    devices = sampler.start()
    recorder = Recorder()
    recorder.reset(sampler.device_columns)
    monitor = SpikeMonitor(devices, SpikeSettings(50, 1.5, 64, 5), alert=False)
    pipe = Pipeline(sampler, [("judge samples", BlockJudge(monitor)),
                              ("record samples", recorder.extend)],
                    interval_s=interval_s, block=block)
    return pipe, sampler, recorder, pipe.lock


def put(pipe, sampler, lock, batch):
    with lock:
        pipe.pending.append((("train", 0, batch), 0.0, sampler.read()))


def test_samples_are_recorded_in_the_order_they_were_read_once_drained():
    pipe, sampler, recorder, lock = started([(i * MIB, i * MIB) for i in range(50)])
    for batch in range(40):
        put(pipe, sampler, lock, batch)
    assert recorder.total_samples == 0  # nothing but reads on the hot path
    pipe.drain()
    frame = recorder.to_dataframe()
    assert frame["batch"].tolist() == list(range(40))
    assert frame["current_bytes"].tolist() == [i * MIB for i in range(40)]


def test_a_fault_in_judging_loses_no_row(memwatch_logs):
    pipe, sampler, recorder, lock = started([(i * MIB, i * MIB) for i in range(20)])

    def broken(*args):
        raise RuntimeError("judging broke")

    pipe.consumers[0] = pipe.consumers[0]._replace(take=broken)
    for batch in range(20):
        put(pipe, sampler, lock, batch)
        if batch % 7 == 6:
            pipe.drain()
    pipe.drain()
    frame = recorder.to_dataframe()
    assert frame["batch"].tolist() == list(range(20))
    assert frame["baseline_bytes"].isna().all()
    assert memwatch_logs.text.count("could not judge samples") == 1


def test_blocks_carry_seconds_since_the_call_began_and_unix_timestamps():
    pipe, sampler, recorder, lock = started([(MIB, MIB)] * 3)
    pipe.t0, pipe.wall_t0 = 100.0, 1.7e9
    with lock:
        pipe.pending.append((("train", 0, 0), 100.25, sampler.read()))
    pipe.drain()
    frame = recorder.to_dataframe()
    assert frame["time_s"].tolist() == [0.25]
    assert frame["timestamp"].tolist() == [1.7e9 + 0.25]


def test_the_thread_drains_within_its_interval_without_being_asked():
    pipe, sampler, recorder, lock = started([(MIB, MIB)], interval_s=0.05)
    pipe.start()
    try:
        put(pipe, sampler, lock, 0)
        deadline = time.perf_counter() + 2
        while recorder.total_samples == 0 and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert recorder.total_samples == 1
    finally:
        pipe.stop()


def test_the_thread_falling_behind_is_overdue_and_the_caller_drains():
    pipe, sampler, recorder, lock = started([(MIB, MIB)], block=4)
    for batch in range(7):
        put(pipe, sampler, lock, batch)
    assert not pipe.overdue
    put(pipe, sampler, lock, 7)
    assert pipe.overdue  # 2 blocks wait: the training thread drains itself
    pipe.drain()
    assert not pipe.overdue and recorder.total_samples == 8


def test_an_alert_is_logged_within_256_sampled_batches(memwatch_logs):
    spike_at = 20
    static = 500 * MIB
    working = [40] * spike_at + [600] + [40] * 400
    probe = FakeProbe([(static, static)] + [(static, static + w * MIB) for w in working])
    seen = []

    class Look(keras.callbacks.Callback):
        # A batch-end hook that is not async-safe: Keras runs every hook in
        # order, so batch numbers count sampled batches exactly.
        def on_train_batch_end(self, batch, logs=None):
            if not seen and "memory spike at epoch 0 batch 20" in memwatch_logs.text:
                seen.append(batch)

    x, y = tiny_data(16 * 400)
    tiny_model().fit(x, y, batch_size=16, epochs=1, verbose=0,
                     callbacks=[MemWatch(probes=[probe]), Look()])
    assert seen and seen[0] <= spike_at + 256 + 1


def test_the_streamed_log_is_written_a_block_at_a_time_and_complete(tmp_path):
    watch = MemWatch(probes="host", log_path=tmp_path / "m.csv", verbose=0)
    x, y = tiny_data(16 * 100)
    tiny_model().fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[watch])
    frame = load_log(tmp_path / "m.csv")
    assert frame["step"].tolist() == list(range(201))
