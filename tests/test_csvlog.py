"""The streamed log is written per sample and read back unchanged."""


import pandas as pd
import pytest

from keras_memwatch import columns as C
from keras_memwatch.csvlog import CsvLog, load_log

from conftest import GPU_SOURCES, HOST_SOURCES, gpu_row, host_row
from keras_memwatch.recorder import Recorder


def write_both(path, n):
    log = CsvLog(path)
    recorder = Recorder()
    recorder.reset({"GPU:0": GPU_SOURCES, "host": HOST_SOURCES})
    for i in range(n):
        rows = [gpu_row(i, spike=i == 2), host_row(i)]
        batch = None if i == 0 else i - 1
        recorder.append(0, batch, "train", i * 0.25, rows)
        log.write(i, 0, batch, "train", i * 0.25, ("GPU:0", "host"), rows)
    return log, recorder


def test_log_reads_back_equal_to_the_recorder(tmp_path):
    log, recorder = write_both(tmp_path / "m.csv", 5)
    log.close()
    pd.testing.assert_frame_equal(load_log(tmp_path / "m.csv"), recorder.to_dataframe())


def test_each_sample_is_on_disk_before_the_next(tmp_path):
    path = tmp_path / "m.csv"
    log, _ = write_both(path, 3)
    # Not closed, not flushed: another reader already sees every row.
    assert len(load_log(path)) == 6
    log.close()


def test_a_line_cut_short_is_dropped(tmp_path):
    path = tmp_path / "m.csv"
    log, _ = write_both(path, 3)
    log.close()
    with open(path, "ab") as f:
        f.write(b"3,0,2,train,GPU:0,0.75,20")
    frame = load_log(path)
    assert frame["step"].max() == 2 and len(frame) == 6


def test_existing_file_is_never_overwritten(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("precious")
    with pytest.raises(FileExistsError):
        CsvLog(path)
    assert path.read_text() == "precious"


def test_header_only_log_is_an_empty_frame(tmp_path):
    CsvLog(tmp_path / "m.csv").close()
    frame = load_log(tmp_path / "m.csv")
    assert frame.empty and tuple(frame.columns) == C.COLUMNS
