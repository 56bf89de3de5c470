"""The recorder keeps typed columns and builds the documented DataFrame."""

import threading

import numpy as np

from keras_memwatch import columns as C
from keras_memwatch.record.recorder import Recorder, concat_frames, empty_frame

from conftest import GPU_SOURCES, HOST_SOURCES, block_of, gpu_row, host_row


def filled(n, max_rows=None, block=3):
    recorder = Recorder(max_rows)
    recorder.reset({"GPU:0": GPU_SOURCES, "host": HOST_SOURCES})
    samples = [(i, 0, None if i == 0 else i - 1, "train", i * 0.5,
                [gpu_row(i, spike=i == 3), host_row(i)]) for i in range(n)]
    for start in range(0, n, block):
        recorder.extend(block_of(samples[start:start + block],
                                 [GPU_SOURCES, HOST_SOURCES]))
    return recorder


def test_frame_has_the_documented_columns_and_dtypes():
    frame = filled(4).to_dataframe()
    assert tuple(frame.columns) == C.COLUMNS
    assert frame["step"].dtype == np.int64
    assert frame["batch"].dtype == "Int64"
    assert frame["time_s"].dtype == np.float64
    assert frame["spike"].dtype == bool
    for name in C.BYTES_COLUMNS:
        assert frame[name].dtype == "Int64", name
    assert list(frame["phase"].cat.categories) == ["train", "test", "predict"]


def test_rows_run_step_by_step_with_devices_in_order():
    frame = filled(3).to_dataframe()
    assert frame["step"].tolist() == [0, 0, 1, 1, 2, 2]
    assert frame["device"].tolist() == ["GPU:0", "host"] * 3
    assert frame["peak_bytes"].tolist() == [200, 2000, 201, 2001, 202, 2002]


def test_unknown_values_are_missing_never_zero():
    frame = filled(3).to_dataframe()
    gpu = frame[frame["device"] == "GPU:0"]
    host = frame[frame["device"] == "host"]
    assert gpu[C.ALLOCATOR_LIMIT].isna().all()
    assert gpu[C.HOST_RSS].isna().all()
    assert host[C.ALLOCATOR_CURRENT].isna().all()
    assert frame["batch"].isna().tolist() == [True, True] + [False] * 4
    assert gpu["baseline_bytes"].isna().tolist() == [True, True, False]


def test_spike_flags_are_kept():
    frame = filled(5).to_dataframe()
    assert frame.loc[frame["spike"], "step"].tolist() == [3]


def test_ring_keeps_the_newest_rows_with_their_steps():
    recorder = filled(10, max_rows=4)
    frame = recorder.to_dataframe()
    assert frame["step"].tolist() == [6, 6, 7, 7, 8, 8, 9, 9]
    assert frame.loc[frame["device"] == "GPU:0", "peak_bytes"].tolist() == [206, 207, 208, 209]
    assert recorder.total_samples == 10
    assert len(recorder) == 8


def test_a_ring_holds_at_most_about_twice_its_rows():
    recorder = filled(3000, max_rows=500, block=7)
    assert recorder.to_dataframe()["step"].tolist()[::2] == list(range(2500, 3000))
    for more in range(1, 4):
        recorder.extend(block_of([(0, 0, 0, "train", 0.0, [gpu_row(0), host_row(0)])]
                                 * 300, [GPU_SOURCES, HOST_SOURCES]))
        assert recorder._blocks.kept <= 2 * 500 + 300
        assert len(recorder) == 2 * 500


def test_reset_forgets_everything():
    recorder = filled(3)
    recorder.reset({"host": HOST_SOURCES})
    assert recorder.to_dataframe().empty
    assert tuple(recorder.to_dataframe().columns) == C.COLUMNS


def test_empty_frame_matches_the_filled_dtypes():
    empty, full = empty_frame(), filled(2).to_dataframe()
    assert (empty.dtypes.astype(str) == full.dtypes.astype(str)).all()


def test_concurrent_appends_lose_nothing():
    recorder = Recorder()
    recorder.reset({"host": HOST_SOURCES})

    def work(offset):
        for i in range(2000):
            recorder.extend(block_of([(0, 0, offset + i, "train", 0.0,
                                       [host_row(offset + i)])], [HOST_SOURCES]))

    threads = [threading.Thread(target=work, args=(k * 10000,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    frame = recorder.to_dataframe()
    assert len(frame) == 8000
    assert frame["batch"].is_unique


def test_builds_a_million_rows_from_small_blocks():
    recorder = Recorder()
    recorder.reset({"host": HOST_SOURCES})
    block = block_of([(0, 0, 1, "train", 0.0, [host_row(1)])] * 10, [HOST_SOURCES])
    for i in range(100_000):
        recorder.extend(block)
    frame = recorder.to_dataframe()
    assert len(frame) == 1_000_000
    assert frame["step"].iloc[-1] == 999_999


def test_the_frames_of_several_calls_join_in_order_devices_kept():
    first = filled(2).to_dataframe()
    host_only = Recorder()
    host_only.reset({"host": HOST_SOURCES}, call=1)
    host_only.extend(block_of([(0, 0, None, "predict", 0.0, [host_row(0)])],
                              [HOST_SOURCES]))
    joined = concat_frames([first, empty_frame(), host_only.to_dataframe()])
    assert joined[C.CALL].tolist() == [0, 0, 0, 0, 1]
    assert joined["device"].tolist() == ["GPU:0", "host", "GPU:0", "host", "host"]
    assert list(joined["device"].cat.categories) == ["GPU:0", "host"]
    assert joined["phase"].tolist()[-1] == "predict"
    assert tuple(concat_frames([empty_frame()]).columns) == C.COLUMNS
