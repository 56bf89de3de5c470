"""`python -m keras_memwatch demo` and `... report LOG`, run as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from conftest import record, steady

ROOT = Path(__file__).resolve().parents[2]
WORKING = [40] * 6 + [400] + [40] * 6 + [420] + [40] * 6  # spikes at 6 and 13


def run(*args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "keras_memwatch", *args],
                          cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture
def log(tmp_path):
    """A log as MemWatch(log_path=...) or MemWatch.to_csv writes it."""
    frame, _ = record(steady(WORKING))
    path = tmp_path / "memwatch.csv"
    frame.to_csv(path, index=False)
    return path


def test_demo_trains_flags_the_oversized_batch_and_writes_its_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "memwatch.png").write_text("an earlier run's")  # --force replaces it
    (out / "notes.txt").write_text("mine")  # and touches nothing else
    # One epoch of 16 batches: batch 14 is oversized (96 samples, not 8).
    done = run("demo", "--backend", keras.backend.backend(), "--epochs", "1",
               "--steps", "16", "--out", str(out), "--force")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "notes.txt").read_text() == "mine"
    text = done.stdout
    assert f"keras_memwatch demo on {keras.backend.backend()}" in text
    assert "WARNING: memory spike at epoch 0 batch 14 on host" in text
    assert "Oversized batches flagged: 1 of 1" in text
    assert "keras_memwatch summary" in text and "host: peak" in text
    assert (out / "memwatch.csv").stat().st_size > 1000
    assert (out / "memwatch.png").read_bytes()[:4] == b"\x89PNG"
    assert f"Wrote {out / 'memwatch.csv'}" in text
    page = (out / "memwatch.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and 'id="timeline-0"' in page
    assert f"and {out / 'memwatch.html'} (open it in a browser)" in text


def test_report_summarizes_a_log_without_the_model(log, tmp_path):
    png = tmp_path / "plot.png"
    done = run("report", str(log), "--plot", str(png), timeout=120)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "weights, optimizer state: unknown without the model" in text
    assert "step working memory:  40.0 MiB typical on GPU:0, 420 MiB at most" in text
    assert "GPU:0: peak 920 MiB" in text
    assert ("2 spike(s); worst 920 MiB at epoch 0 batch 13 (it needed 420 MiB, "
            "10.5x the usual 40.0 MiB)") in text
    assert "columns with values: allocator_current_bytes" in text
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert f"Wrote {png}" in text


def test_report_needs_no_keras(log):
    code = ("import sys\n"
            "from keras_memwatch.cli import main\n"
            f"assert main(['report', {str(log)!r}]) == 0\n"
            "assert 'keras' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_report_of_a_missing_log_fails_clearly(tmp_path):
    done = run("report", str(tmp_path / "nope.csv"), timeout=120)
    assert done.returncode == 2  # a usage error (issue 16)
    assert "cannot read" in done.stderr


def test_bad_arguments_are_refused():
    assert run("demo", "--epochs", "0", timeout=60).returncode == 2
    assert run("demo", "--backend", "numpy", timeout=60).returncode == 2
    assert run(timeout=60).returncode == 2


def test_the_console_script_is_installed(log):
    script = shutil.which("keras-memwatch",
                          path=os.path.dirname(sys.executable) + os.pathsep
                          + os.environ.get("PATH", ""))
    if script is None:
        pytest.skip("keras-memwatch is not installed (pip install -e .)")
    done = subprocess.run([script, "report", str(log)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "keras_memwatch summary" in done.stdout
