"""oom_guard: recognising out-of-memory errors, the report, and real failures
inside `fit` (the active backend's own OOM class, and real allocation
failures under an address-space limit in a child process)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pandas as pd
import pytest

from keras_memwatch import MemWatch, load_log
from keras_memwatch.explain.guard import OomGuard, oom_guard, write_oom_report

from conftest import framework_oom, run_out_of_memory_child

BACKEND = keras.backend.backend()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

class Raiser(keras.callbacks.Callback):
    """Raises `error` at the end of training batch `at`, as a failed step would."""

    def __init__(self, error, at=3):
        super().__init__()
        self.error, self.at = error, at

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.at:
            raise self.error


def tiny_fit(watch, error, at=3):
    model = keras.Sequential([keras.Input((8,)),
                              keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(128, 8)), rng.normal(size=(128, 1))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[watch, Raiser(error, at)])


# -- the guard around a real fit -------------------------------------------


def test_guard_writes_the_report_and_reraises_the_same_object(tmp_path, memwatch_logs):
    watch = MemWatch(probes="host", log_path=tmp_path / "mem.csv", verbose=0)
    error = framework_oom()
    guard = oom_guard(watch)
    with pytest.raises(type(error)) as caught:
        with guard:
            tiny_fit(watch, error, at=3)
    assert caught.value is error
    assert guard.error is error and not guard.deferred
    txt, csv = str(tmp_path / "mem.oom.txt"), str(tmp_path / "mem.oom.csv")
    assert guard.report_paths == (txt, csv)
    assert guard.html_path == str(tmp_path / "mem.oom.html")
    page = open(guard.html_path, encoding="utf-8").read()
    assert 'id="timeline-0"' in page and f"backend</td><td>{BACKEND}" in page
    text = open(txt).read()
    assert text.startswith("keras_memwatch: training ran out of memory\n")
    assert f"exception: {type(error).__module__}." in text
    assert "What the framework says it tried to allocate, and where:" in text
    if BACKEND == "torch":
        assert "Tried to allocate 2.00 GiB." in text and "requested: 2.00 GiB" in text
    elif BACKEND == "jax":
        assert "Out of memory while trying to allocate 4294967296 bytes" in text
    else:
        assert "OOM when allocating tensor with shape[4096,262144]" in text
        assert "requested: 4.00 GiB" in text
    assert "Memory at the failure (sampled now):\n  host: in use" in text
    assert "Where: after epoch 0 batch 3 (train), the last sample" in text
    assert "Last 20 samples:" in text and "Spikes:\n  none" in text
    assert "Where the memory went:" in text and "weights:" in text
    assert "optimizer state:" in text  # the breakdown knew the model
    record = load_log(csv)
    assert record["batch"].dropna().tolist() == [0, 1, 2, 3]
    pd.testing.assert_frame_equal(record, watch.to_dataframe())
    errors = [r.getMessage() for r in memwatch_logs.records
              if r.levelno == logging.ERROR]
    assert errors == [f"training ran out of memory ({type(error).__name__}); report "
                      f"written to {txt} and {csv}"]


def test_other_exceptions_pass_through_untouched(tmp_path):
    watch = MemWatch(probes="host", log_path=tmp_path / "mem.csv", verbose=0)
    error = ValueError("a bug in the user's code")
    with pytest.raises(ValueError) as caught:
        with oom_guard(watch) as guard:
            tiny_fit(watch, error)
    assert caught.value is error
    assert guard.report_paths == () and guard.error is None
    assert sorted(os.listdir(tmp_path)) == ["mem.csv"]


def test_guard_without_a_log_writes_to_report_dir_and_never_overwrites(tmp_path):
    watch = MemWatch(probes="host", verbose=0)
    for _ in range(2):
        with pytest.raises(MemoryError):
            with oom_guard(watch, report_dir=tmp_path, last_n=3):
                tiny_fit(watch, MemoryError("Tried to allocate 1.00 GiB"), at=5)
    assert sorted(os.listdir(tmp_path)) == [
        "memwatch.oom.1.csv", "memwatch.oom.1.html", "memwatch.oom.1.txt",
        "memwatch.oom.csv", "memwatch.oom.html", "memwatch.oom.txt"]
    text = (tmp_path / "memwatch.oom.txt").read_text()
    table = text.split("Last 3 samples:\n")[1].split("\n\n")[0].splitlines()
    assert len(table) == 4  # header and three samples
    assert table[-1].split()[:3] == ["6", "0", "5"]


def test_guard_is_a_decorator_and_a_clean_block_writes_nothing(tmp_path):
    watch = MemWatch(probes="host", verbose=0)
    guard = oom_guard(watch, report_dir=tmp_path)

    @guard
    def train():
        tiny_fit(watch, None, at=-1)

    train()
    assert os.listdir(tmp_path) == [] and guard.report_paths == ()


def test_report_for_a_watch_that_recorded_nothing(tmp_path):
    watch = MemWatch(probes="host", verbose=0)
    txt, csv = write_oom_report(watch, MemoryError("Tried to allocate 8.00 GiB"),
                                report_dir=tmp_path)
    text = open(txt).read()
    assert "requested: 8.00 GiB" in text
    assert "No samples were recorded before the failure." in text
    assert load_log(csv).empty


def test_a_report_that_cannot_be_written_never_hides_the_error(tmp_path, memwatch_logs):
    watch = MemWatch(probes="host", verbose=0)
    error = MemoryError("Tried to allocate 1.00 GiB")
    with pytest.raises(MemoryError) as caught:
        with oom_guard(watch, report_dir=tmp_path / "missing" / "\0bad"):
            raise error
    assert caught.value is error
    assert "the report could not be written" in memwatch_logs.text


def test_memwatch_guard_method(tmp_path):
    watch = MemWatch(probes="host", log_path=tmp_path / "mem.csv", verbose=0)
    error = framework_oom()
    with pytest.raises(type(error)) as caught:
        with watch.guard(last_n=5) as guard:
            tiny_fit(watch, error)
    assert caught.value is error and isinstance(guard, OomGuard)
    assert (tmp_path / "mem.oom.txt").exists() and (tmp_path / "mem.oom.csv").exists()


def test_bad_last_n():
    with pytest.raises(ValueError, match="last_n"):
        OomGuard(MemWatch(probes="host"), last_n=0)



# -- per process, and never into the working directory ---------------------


def test_the_report_names_the_process_and_host(tmp_path):
    watch = MemWatch(probes="host", log_path=tmp_path / "mem.csv", verbose=0)
    with pytest.raises(MemoryError):
        with oom_guard(watch):
            tiny_fit(watch, MemoryError("Tried to allocate 1.00 GiB"))
    lines = (tmp_path / "mem.oom.txt").read_text().splitlines()
    assert lines[2] == f"process: 0 of 1, on {watch.hostname}" and watch.hostname


def test_each_process_reports_next_to_its_own_log(tmp_path, monkeypatch, memwatch_logs):
    monkeypatch.setattr("keras_memwatch.configure.ranks.process_index_and_count", lambda: (1, 2))
    monkeypatch.setattr("keras_memwatch.record.csvlog.process_index_and_count",
                        lambda: (1, 2))
    monkeypatch.setattr("keras_memwatch.session.call.process_index_and_count",
                        lambda: (1, 2))
    watch = MemWatch(probes="host", log_path=tmp_path / "mem.csv", verbose=0)
    error = framework_oom()
    with pytest.raises(type(error)):
        with oom_guard(watch) as guard:
            tiny_fit(watch, error)
    txt, csv = str(tmp_path / "mem.rank1.oom.txt"), str(tmp_path / "mem.rank1.oom.csv")
    assert guard.report_paths == (txt, csv)
    assert sorted(os.listdir(tmp_path)) == ["mem.rank1.csv", "mem.rank1.oom.csv",
                                           "mem.rank1.oom.html", "mem.rank1.oom.txt"]
    assert guard.html_path == str(tmp_path / "mem.rank1.oom.html")
    assert f"process: 1 of 2, on {watch.hostname}" in open(txt).read()
    assert set(load_log(csv)["process"]) == {1}
    errors = [r.getMessage() for r in memwatch_logs.records if r.levelno == logging.ERROR]
    assert errors == [f"process 1 on {watch.hostname}: training ran out of memory "
                      f"({type(error).__name__}); report written to {txt} and {csv}"]


def test_without_a_log_or_report_dir_the_report_goes_to_a_temporary_folder(
        tmp_path, monkeypatch, memwatch_logs):
    import tempfile

    work, temp = tmp_path / "work", tmp_path / "temp"
    work.mkdir()
    temp.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    watch = MemWatch(probes="host", verbose=0)
    with pytest.raises(MemoryError):
        with watch.guard() as guard:
            tiny_fit(watch, MemoryError("Tried to allocate 1.00 GiB"))
    assert os.listdir(work) == []  # nothing where the user did not ask
    (folder,) = os.listdir(temp)
    assert folder.startswith("keras_memwatch-oom-")
    assert guard.report_paths == (str(temp / folder / "memwatch.oom.txt"),
                                  str(temp / folder / "memwatch.oom.csv"))
    assert str(temp / folder / "memwatch.oom.txt") in memwatch_logs.text


def test_reports_written_at_once_into_one_folder_never_collide(tmp_path):
    import threading

    watch = MemWatch(probes="host", verbose=0)
    start, written = threading.Barrier(6), []

    def write():
        start.wait()
        written.append(write_oom_report(watch, MemoryError("Tried to allocate 1 GiB"),
                                        report_dir=tmp_path))

    threads = [threading.Thread(target=write) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({txt for txt, _ in written}) == 6
    assert len(os.listdir(tmp_path)) == 12


# -- real allocation failures, in a child process ----------------------------

GUARDED_FIT = """
    from keras_memwatch import MemWatch
    from keras_memwatch.explain.guard import oom_guard

    model.fit(*small, batch_size=8, epochs=1, verbose=0)

    def batches():
        for _ in range(6):
            yield small
        yield big

    watch = MemWatch(probes="host", log_path="mem.csv", verbose=0)
    cap_address_space()
    guard = oom_guard(watch)
    try:
        with guard:
            model.fit(batches(), steps_per_epoch=7, epochs=1, verbose=0,
                      callbacks=[watch])
        result = {"raised": None}
    except BaseException as e:
        result = {"raised": type(e).__name__, "same": e is guard.error,
                  "deferred": guard.deferred, "paths": list(guard.report_paths)}
    print(json.dumps(result))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")
@pytest.mark.skipif(BACKEND not in ("jax", "torch"),
                    reason="TensorFlow crashes under RLIMIT_AS instead of raising")
def test_a_real_allocation_failure_under_an_address_space_limit(tmp_path):
    """A step that needs more memory than the process may map: JAX raises
    RESOURCE_EXHAUSTED (when the step's results are awaited), PyTorch's CPU
    allocator a RuntimeError; the guard reports both."""
    result = run_out_of_memory_child(tmp_path, GUARDED_FIT, BACKEND)
    expected = {"jax": "JaxRuntimeError", "torch": "RuntimeError"}[BACKEND]
    assert result["raised"] == expected and result["same"], result
    text = (tmp_path / "mem.oom.txt").read_text()
    if BACKEND == "jax":
        assert result["deferred"]
        assert "RESOURCE_EXHAUSTED: Out of memory" in text
        assert "JAX reported the error only when" in text
    else:
        assert not result["deferred"]
        assert "DefaultCPUAllocator: can't allocate memory" in text
        assert "Where: after epoch 0 batch 5 (train)" in text
    assert "requested: " in text
    assert load_log(tmp_path / "mem.oom.csv")["batch"].notna().sum() >= 6


GPU_CHILD = textwrap.dedent("""
    import json, os, sys
    from keras_memwatch import MemWatch, configure_memory
    configure_memory(memory_limit_mb=1024)
    import numpy as np
    import keras
    from keras_memwatch.explain.guard import oom_guard

    model = keras.Sequential([
        keras.Input((128, 128, 3)),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer="adam", loss="mse")
    x = np.ones((1024, 128, 128, 3), np.float32)
    y = np.ones((1024, 1), np.float32)
    watch = MemWatch(log_path=os.path.join(sys.argv[1], "mem.csv"), verbose=0)
    guard = oom_guard(watch)
    try:
        with guard:
            model.fit(x, y, batch_size=512, epochs=1, verbose=0, callbacks=[watch])
        result = {"raised": None}
    except BaseException as e:
        result = {"raised": type(e).__name__, "same": e is guard.error,
                  "deferred": guard.deferred, "paths": list(guard.report_paths)}
    print(json.dumps(result))
""")


@pytest.mark.gpu
@pytest.mark.skipif(BACKEND == "tensorflow",
                    reason="the TensorFlow build here has no GPU support")
def test_gpu_out_of_memory_under_a_configured_limit(tmp_path):
    (tmp_path / "child.py").write_text(GPU_CHILD)
    env = dict(os.environ, KERAS_BACKEND=BACKEND,
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["raised"] in ("OutOfMemoryError", "JaxRuntimeError",
                                "XlaRuntimeError"), result
    assert result["same"] and len(result["paths"]) == 2
    text = (tmp_path / "mem.oom.txt").read_text()
    assert "requested: " in text and "GPU:0" in text


def test_the_report_shows_what_the_allocator_reserved_but_did_not_hand_out(
        tmp_path, fake_probe_cls):
    """An out-of-memory error with free-looking memory: the report shows the
    allocator's reserve beside what it allocated, at the failure and in the
    last samples."""
    from keras_memwatch import columns as C

    mib = 2**20

    class Reserving(fake_probe_cls):
        columns = fake_probe_cls.columns + (C.ALLOCATOR_RESERVED,)

        def read(self):
            ((current, peak, limit),) = super().read()
            return ((current, peak, limit, current + 1536 * mib),)

    probe = Reserving([(6000 * mib, 6100 * mib)], limit=8192 * mib)
    watch = MemWatch(probes=[probe], log_path=tmp_path / "mem.csv", verbose=0)
    with pytest.raises(type(framework_oom())):
        with oom_guard(watch):
            tiny_fit(watch, framework_oom(), at=2)
    text = open(tmp_path / "mem.oom.txt").read()
    assert ("  GPU:0: in use 5.86 GiB, peak since the last sample 5.96 GiB, "
            "limit 8.00 GiB, reserved but unallocated 1.50 GiB") in text
    table = text.split("Last 20 samples:", 1)[1]
    assert "reserved but unallocated MiB" in table and "1536.0" in table
