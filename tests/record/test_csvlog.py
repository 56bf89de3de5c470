"""The streamed log is written per sample and read back unchanged; each
process gets its own file, a taken name the next free one; `load_log` reads
several logs, globs and Parquet, and names what a foreign file lacks."""

import os
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from keras_memwatch import columns as C
from keras_memwatch.record.csvlog import CsvLog, log_path_for, numbered, open_log
from keras_memwatch.record.log_reader import NotALogError, load_log

from conftest import GPU_SOURCES, HOST_SOURCES, block_of, gpu_row, host_row
from keras_memwatch.record.block import table_columns
from keras_memwatch.record.recorder import Recorder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


DEVICES = ("GPU:0", "host")
LAYOUT = [table_columns(GPU_SOURCES), table_columns(HOST_SOURCES)]


def write_both(path, n, phase_of=lambda i: "train", block=2):
    log = CsvLog(path)
    recorder = Recorder()
    recorder.reset({"GPU:0": GPU_SOURCES, "host": HOST_SOURCES})
    samples = [(i, 0, None if i == 0 else i - 1, phase_of(i), i * 0.25,
                [gpu_row(i, spike=i == 2), host_row(i)]) for i in range(n)]
    for start in range(0, n, block):
        part = block_of(samples[start:start + block], [GPU_SOURCES, HOST_SOURCES])
        recorder.extend(part)
        log.write_text(log.format(part, DEVICES, LAYOUT))
    return log, recorder


def test_log_reads_back_equal_to_the_recorder(tmp_path):
    log, recorder = write_both(tmp_path / "m.csv", 5)
    log.close()
    pd.testing.assert_frame_equal(load_log(tmp_path / "m.csv"), recorder.to_dataframe())


def test_a_block_of_mixed_phases_reads_back_equal_to_the_recorder(tmp_path):
    log, recorder = write_both(tmp_path / "m.csv", 9, block=4,
                               phase_of=lambda i: "test" if i % 3 == 2 else "train")
    log.close()
    frame = load_log(tmp_path / "m.csv")
    pd.testing.assert_frame_equal(frame, recorder.to_dataframe())
    assert (frame["phase"] == "test").sum() == 6


def test_missing_values_are_empty_fields_and_times_keep_microseconds(tmp_path):
    log, _ = write_both(tmp_path / "m.csv", 2)
    log.close()
    first = (tmp_path / "m.csv").read_text().splitlines()[1]
    # step, epoch, no batch, phase, device, time, no timestamp (a block made
    # without one), peak, current, no baseline
    assert first.startswith("0,0,,train,GPU:0,0.000000,,200,100,,0,,100,200,,,")


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


# -- one log per process, and a free name whatever the clash ----------------


def test_create_free_takes_the_next_free_name(tmp_path):
    (tmp_path / "m.csv").write_text("precious")
    (tmp_path / "m.1.csv").write_text("also precious")
    log = CsvLog.create_free(tmp_path / "m.csv", 3, "node-a")
    log.close()
    assert log.path == str(tmp_path / "m.2.csv")
    assert (tmp_path / "m.csv").read_text() == "precious"
    assert (tmp_path / "m.1.csv").read_text() == "also precious"
    assert list(numbered("a/m.csv"))[:3] == ["a/m.csv", "a/m.1.csv", "a/m.2.csv"]


def test_threads_racing_for_one_name_all_get_their_own_file(tmp_path):
    n = 8
    start, paths, errors = threading.Barrier(n), [], []

    def create():
        start.wait()
        try:
            log = CsvLog.create_free(tmp_path / "mem.csv")
            paths.append(log.path)
            log.close()
        except Exception as e:  # pragma: no cover - the failure being tested
            errors.append(e)

    threads = [threading.Thread(target=create) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(paths) == sorted(str(tmp_path / name) for name in
                                   ["mem.csv"] + [f"mem.{i}.csv" for i in range(1, n)])
    for path in paths:
        assert load_log(path).empty  # each has its header, nobody else's rows


def test_processes_started_at_once_all_get_their_own_file(tmp_path):
    """A sweep of jobs started at the same moment in one folder."""
    code = ("import sys, time\n"
            "from keras_memwatch.record.csvlog import CsvLog\n"
            "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
            "log = CsvLog.create_free(sys.argv[1])\n"
            "print(log.path)\n")
    at = time.time() + 4.0  # after every child has imported pandas
    children = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "mem.csv"),
                                  str(at)], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(3)]
    out = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0, 0, 0], out
    paths = sorted(stdout.strip() for stdout, _ in out)
    assert paths == sorted(str(tmp_path / n) for n in ("mem.csv", "mem.1.csv", "mem.2.csv"))


def test_log_path_of_each_process():
    assert log_path_for("/d/mem.csv", 0, 1) == "/d/mem.csv"
    assert log_path_for("/d/mem.csv", 3, 4) == "/d/mem.rank3.csv"
    assert log_path_for("/d/mem.{rank}.csv", 3, 4) == "/d/mem.3.csv"
    assert log_path_for("/d/{rank}/mem.csv", 1, 2) == "/d/1/mem.csv"
    assert log_path_for("/d/mem-{rank}.csv", 0, 1) == "/d/mem-0.csv"


def test_log_path_of_a_kerastuner_trial():
    assert log_path_for("/d/kt.csv", 0, 1, trial="03") == "/d/kt.trial03.csv"
    assert log_path_for("/d/kt.csv", 1, 2, trial="7") == "/d/kt.rank1.trial7.csv"
    assert log_path_for("/d/kt.csv", 0, 1, trial="a/b c") == "/d/kt.triala_b_c.csv"


def test_each_call_of_a_watch_has_its_number_on_every_row(tmp_path):
    log = CsvLog(tmp_path / "m.csv", call=2)
    recorder = Recorder()
    recorder.reset({"host": HOST_SOURCES}, call=2)
    part = block_of([(i, 0, i, "predict", 0.0, [host_row(i)]) for i in range(3)],
                    [HOST_SOURCES])
    recorder.extend(part)
    log.write_text(log.format(part, ("host",), [table_columns(HOST_SOURCES)]))
    log.close()
    frame = load_log(tmp_path / "m.csv")
    assert frame[C.CALL].tolist() == [2, 2, 2]
    pd.testing.assert_frame_equal(frame, recorder.to_dataframe())


def test_open_log_warns_about_a_taken_name_never_raises(tmp_path, memwatch_logs):
    (tmp_path / "mem.rank1.csv").write_text("another job's")
    log = open_log(tmp_path / "mem.csv", 1, 2, "node-b")
    log.close()
    assert log.path == str(tmp_path / "mem.rank1.1.csv")
    assert f"{tmp_path / 'mem.rank1.csv'} exists" in memwatch_logs.text
    memwatch_logs.clear()
    # A later fit of the same watch: its own earlier file, no warning.
    again = open_log(tmp_path / "mem.csv", 1, 2, "node-b",
                     earlier=[str(tmp_path / "mem.rank1.csv")])
    again.close()
    assert again.path == str(tmp_path / "mem.rank1.2.csv")
    assert memwatch_logs.text == ""
    # A second execution of a KerasTuner trial: its own name, no warning.
    for _ in range(2):
        open_log(tmp_path / "kt.csv", trial="3").close()
    assert sorted(p.name for p in tmp_path.glob("kt*")) == ["kt.trial3.1.csv",
                                                           "kt.trial3.csv"]
    assert memwatch_logs.text == ""
    assert open_log(tmp_path / "gone" / "mem.csv") is None
    assert "cannot create the log" in memwatch_logs.text


# -- reading several logs ------------------------------------------------------


def write_process(path, process, host, n=4, spike_at=None):
    log = CsvLog(path, process, host)
    for i in range(n):
        rows = [gpu_row(i + 10 * process, spike=i == spike_at),
                host_row(i + 10 * process)]
        batch = None if i == 0 else i - 1
        part = block_of([(i, 0, batch, "train", i * 0.25, rows)],
                        [GPU_SOURCES, HOST_SOURCES])
        log.write_text(log.format(part, DEVICES, LAYOUT))
    log.close()
    return str(path)


def test_several_logs_become_one_frame_by_process(tmp_path):
    one = write_process(tmp_path / "mem.rank1.csv", 1, "node-b")
    zero = write_process(tmp_path / "mem.rank0.csv", 0, "node-a", n=3)
    frame = load_log([one, zero])
    assert list(frame.columns) == list(C.COLUMNS) + ["log"]
    assert frame["process"].tolist() == [0] * 6 + [1] * 8
    assert frame["hostname"].tolist() == ["node-a"] * 6 + ["node-b"] * 8
    assert frame["log"].tolist() == [zero] * 6 + [one] * 8
    assert frame["step"].tolist() == [0, 0, 1, 1, 2, 2] + [0, 0, 1, 1, 2, 2, 3, 3]
    assert list(frame["device"].cat.categories) == ["GPU:0", "host"]
    mine = frame[frame["process"] == 1].drop(columns="log").reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, load_log(one), check_categorical=False)


def test_a_glob_in_natural_order_without_the_guards_copies(tmp_path):
    for rank in (10, 2, 1):
        write_process(tmp_path / f"mem.rank{rank}.csv", rank, "h")
    write_process(tmp_path / "mem.rank1.1.csv", 1, "h")  # a second fit
    write_process(tmp_path / "mem.rank2.oom.csv", 2, "h")  # guard's copy
    frame = load_log(str(tmp_path / "mem.rank*.csv"))
    names = [os.path.basename(p) for p in pd.unique(frame["log"])]
    assert names == ["mem.rank1.csv", "mem.rank1.1.csv", "mem.rank2.csv",
                     "mem.rank10.csv"]
    assert sorted(frame["process"].unique()) == [1, 2, 10]
    oom = load_log(str(tmp_path / "*.oom.csv"))  # asked for by name
    assert os.path.basename(oom["log"].iloc[0]) == "mem.rank2.oom.csv"
    # A list of a glob and a file it matches reads that file once.
    both = load_log([str(tmp_path / "mem.rank1.csv"), str(tmp_path / "mem.rank1.*csv")])
    assert both["log"].nunique() == 2 and len(both) == 16
    with pytest.raises(FileNotFoundError, match="no file matches"):
        load_log(str(tmp_path / "nothing*.csv"))


def test_parquet_from_to_parquet_reads_back(tmp_path):
    frame = load_log(write_process(tmp_path / "m.csv", 2, "node-c", spike_at=2))
    frame.to_parquet(tmp_path / "m.parquet", index=False)
    pd.testing.assert_frame_equal(load_log(tmp_path / "m.parquet"), frame)
    both = load_log([tmp_path / "m.parquet", tmp_path / "m.csv"])
    assert len(both) == 2 * len(frame)


@pytest.mark.parametrize("content, words", [
    (b"", ["is empty, not a MemWatch log"]),
    (b"hello\nworld\n", ["is not a MemWatch log", "lacks the column(s) step, epoch",
                         "its columns: hello"]),
    # Keras's CSVLogger, with MemWatch's metrics in it
    (b"epoch,loss,mem_current_mib,mem_peak_mib\n0,1.5,12.0,14.0\n1,1.2,12.0,14.5\n",
     ["is not a MemWatch log", "lacks the column(s) step, batch, phase, device, "
      "time_s, peak_bytes, current_bytes, baseline_bytes, spike",
      "its columns: epoch, loss, mem_current_mib, mem_peak_mib"]),
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", ["neither a CSV text file nor Parquet"]),
    (b"PAR1 not really parquet", ["not a readable Parquet file"]),
])
def test_a_file_that_is_not_a_log_is_named_with_what_it_lacks(tmp_path, content, words):
    path = tmp_path / "foreign.csv"
    path.write_bytes(content)
    with pytest.raises(NotALogError) as caught:
        load_log(path)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith(str(path))
    for word in words:
        assert word in str(caught.value)


def test_a_parquet_file_that_is_not_a_log(tmp_path):
    pd.DataFrame({"epoch": [0, 1], "loss": [1.0, 0.5]}).to_parquet(tmp_path / "x.parquet")
    with pytest.raises(NotALogError, match="lacks the column.*step"):
        load_log(tmp_path / "x.parquet")


def test_a_log_header_with_garbage_values(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes(",".join(C.COLUMNS).encode() + b"\n" + b"x," * 21 + b"y\n")
    with pytest.raises(NotALogError, match="values that are not a MemWatch log's"):
        load_log(path)


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one log path"):
        load_log([])
    with pytest.raises(TypeError, match="Expected `path`"):
        load_log(7)
