"""`python -m keras_memwatch report`, run as a user would: several logs (one
per process) read as one, and bad input (a missing file, a file that is not
a MemWatch log, a --plot path that cannot be written) met with one line that
names the argument and the fix, exit status 2, never a traceback, and no
file replaced or written where the user did not ask (issues 16 and 17)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GIB, record, steady, tiny_data, tiny_model

ROOT = Path(__file__).resolve().parents[2]
WORKING = [40] * 6 + [400] + [40] * 6 + [420] + [40] * 6  # spikes at 6 and 13


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "keras_memwatch", "report", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def refused(done, *words):
    """Exit status 2, one short line on stderr with `words`, no traceback."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr
    assert done.stdout == ""
    return done.stderr


def write_rank(folder: Path, process: int, host: str, frame) -> Path:
    frame = frame.copy()
    frame["process"], frame["hostname"] = process, host
    path = folder / f"mem.rank{process}.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.fixture
def ranks(tmp_path):
    """The logs of two processes: 0 with two spikes on 16 GiB, 1 steady and
    close to its 2 GiB limit."""
    zero, _ = record(steady(WORKING))
    one, _ = record(steady([40] * 20, in_use=1500), limit=2 * GIB)
    return write_rank(tmp_path, 0, "node-a", zero), write_rank(tmp_path, 1, "node-b", one)


def test_several_logs_one_section_per_process_and_a_comparison(ranks, tmp_path):
    for args in ([str(p) for p in ranks], [str(tmp_path / "mem.rank*.csv")]):
        done = run(*args)
        assert done.returncode == 0, done.stderr
        text = done.stdout
        assert text.startswith("keras_memwatch report: 2 process(es) on 2 host(s), "
                               "2 log(s)")
        assert f"== process 0 on node-a ({ranks[0]}) ==" in text
        assert f"== process 1 on node-b ({ranks[1]}) ==" in text
        assert "    process 0 on node-a: 2 (GPU:0: 2); worst 920 MiB on GPU:0" in text
        assert "Imbalance between processes: 1.67x" in text
        assert "Closest to its limit: process 1 on node-b, GPU:0" in text


def test_plot_of_several_processes(ranks, tmp_path):
    png = tmp_path / "both.png"
    done = run(str(tmp_path / "mem.rank*.csv"), "--plot", str(png))
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(f"\nWrote {png}.\n")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_parquet_that_to_parquet_writes(tmp_path):
    from keras_memwatch import MemWatch

    watch = MemWatch(probes="host", verbose=0)
    x, y = tiny_data(64)
    tiny_model().fit(x, y, epochs=1, batch_size=16, callbacks=[watch], verbose=0)
    watch.to_parquet(tmp_path / "mem.parquet")
    done = run(str(tmp_path / "mem.parquet"))
    assert done.returncode == 0, done.stderr
    assert "keras_memwatch summary: 4 training steps sampled over 1 epoch(s)" in done.stdout
    assert "host: peak" in done.stdout


def test_a_keras_csvlogger_file_is_not_a_log(tmp_path):
    import keras

    x, y = tiny_data(32)
    tiny_model().fit(x, y, epochs=2, batch_size=16, verbose=0,
                     callbacks=[keras.callbacks.CSVLogger(str(tmp_path / "train.csv"))])
    refused(run(str(tmp_path / "train.csv")), f"{tmp_path / 'train.csv'} is not a "
            "MemWatch log: it lacks the column(s) step, batch, phase, device, time_s, "
            "peak_bytes, current_bytes, baseline_bytes, spike (its columns: epoch, loss",
            "Give a file written by MemWatch(log_path=...)")


@pytest.mark.parametrize("content, words", [
    (b"", ["is empty, not a MemWatch log"]),
    (b"some notes\nof mine\n", ["is not a MemWatch log", "lacks the column(s) step"]),
])
def test_text_and_empty_files_are_not_logs(tmp_path, content, words):
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    refused(run(str(path)), str(path), *words)


def test_missing_files_globs_and_folders(tmp_path):
    refused(run(str(tmp_path / "nope.csv")), f"LOG {tmp_path / 'nope.csv'}",
            "No such file or directory", "give a log written by")
    refused(run(str(tmp_path / "mem.rank*.csv")), "no file matches this pattern")
    refused(run(str(tmp_path)), f"LOG {tmp_path} is a folder", "*.csv")


def test_one_good_log_and_one_missing_is_refused(ranks, tmp_path):
    refused(run(str(ranks[0]), str(tmp_path / "nope.csv")), "nope.csv")


@pytest.mark.parametrize("target, words", [
    ("nodir/x.png", ["--plot {d}/nodir/x.png: the folder {d}/nodir does not exist",
                     "create it first"]),
    ("rep.txt", ["--plot {d}/rep.txt: matplotlib cannot write .txt files",
                 "e.g. --plot {d}/rep.png"]),
    ("noext", ["--plot {d}/noext has no extension", "e.g. --plot {d}/noext.png"]),
    (".", ["is a folder: give a file name"]),
])
def test_bad_plot_paths_are_refused_before_anything_is_drawn(ranks, tmp_path, target,
                                                             words):
    before = sorted(p.name for p in tmp_path.iterdir())
    refused(run(str(ranks[0]), "--plot", str(tmp_path / target)),
            *[w.format(d=tmp_path) for w in words])
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_an_existing_plot_is_replaced_only_with_force(ranks, tmp_path):
    png = tmp_path / "mine.png"
    png.write_bytes(b"a picture of my own")
    refused(run(str(ranks[0]), "--plot", str(png)),
            f"--plot {png} exists: pass --force to replace it")
    assert png.read_bytes() == b"a picture of my own"
    done = run(str(ranks[0]), "--plot", str(png), "--force")
    assert done.returncode == 0, done.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_plot_is_written_at_exactly_the_path_given(ranks, tmp_path):
    done = run(str(ranks[0]), "--plot", str(tmp_path / "m.svg"))
    assert done.returncode == 0, done.stderr
    assert f"Wrote {tmp_path / 'm.svg'}." in done.stdout
    assert (tmp_path / "m.svg").read_bytes()[:5] == b"<?xml"


def test_a_log_without_samples_says_so(tmp_path):
    from keras_memwatch.record.csvlog import CsvLog

    CsvLog(tmp_path / "mem.csv").close()  # a fit that died before its first sample
    done = run(str(tmp_path / "mem.csv"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "keras_memwatch: no samples recorded."

