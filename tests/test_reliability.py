"""MemWatch never takes training down, never loses a row, and refuses bad
input before training starts."""

import ast
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import keras
import pytest

from conftest import FakeProbe, tiny_data, tiny_model
from keras_memwatch import MemWatch, load_log
from keras_memwatch.record.probes.base import Probe

PACKAGE = pathlib.Path(__file__).parent.parent / "keras_memwatch"


# -- bad input -------------------------------------------------------------

# Every option's wrong type and value: tests/test_arguments_everywhere.py.
BAD_OPTIONS = [
    ({"probes": "gpu-magic"}, ValueError, "probes"),
    ({"probes": [42]}, TypeError, "probes"),
    ({"log_path": "/no/such/folder/mem.csv"}, ValueError, "log_path"),
    ({"log_path": "{tmp}/exists.csv"}, FileExistsError, "log_path"),
]


@pytest.mark.parametrize("options, error, name", BAD_OPTIONS,
                         ids=[f"{k}={v!r}" for (o, _, _) in BAD_OPTIONS for k, v in o.items()])
def test_bad_options_are_refused_naming_the_argument(options, error, name, tmp_path):
    (tmp_path / "exists.csv").write_text("keep me")
    options = {k: v.format(tmp=tmp_path) if isinstance(v, str) and "{tmp}" in v else v
               for k, v in options.items()}
    with pytest.raises(error) as caught:
        MemWatch(**options)
    message = str(caught.value)
    assert f"`{name}`" in message and "Received" in message, message
    assert (tmp_path / "exists.csv").read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_log_folder_is_refused(tmp_path):
    tmp_path.chmod(0o500)
    with pytest.raises(ValueError, match="writable"):
        MemWatch(log_path=tmp_path / "mem.csv")


# -- faults during training --------------------------------------------------

class EveryKth(FakeProbe):
    """Raises on every k-th read."""

    def __init__(self, k):
        super().__init__([(100, 200)])
        self.k = k

    def read(self):
        self.calls += 1
        if self.calls % self.k == 0:
            raise OSError("NVML_ERROR_GPU_IS_LOST")
        return ((100, 200, None),)


def fit(watch, epochs=2, n=64, extra=()):
    x, y = tiny_data(n)
    return tiny_model().fit(x, y, epochs=epochs, batch_size=16, verbose=0,
                            callbacks=[watch, *extra])


def test_a_probe_failing_every_kth_read_leaves_gaps_not_crashes(memwatch_logs):
    watch = MemWatch(probes=[EveryKth(3), "host"])
    fit(watch)
    gpu = watch.to_dataframe().query("device == 'GPU:0'")
    assert len(gpu) == 9
    assert gpu["current_bytes"].isna().tolist() == [(i + 1) % 3 == 0 for i in range(9)]
    assert memwatch_logs.text.count("NVML_ERROR_GPU_IS_LOST") == 1


@pytest.mark.parametrize("garbage", [None, -1, float("nan"), "lots"])
def test_garbage_readings_become_missing_values(garbage):
    watch = MemWatch(probes=[FakeProbe([(garbage, garbage)]), "host"])
    fit(watch, epochs=1)
    gpu = watch.to_dataframe().query("device == 'GPU:0'")
    assert len(gpu) == 5 and gpu["peak_bytes"].isna().all()


def test_a_probe_that_always_fails_is_switched_off_once(memwatch_logs):
    probe = FakeProbe([RuntimeError("driver reset")])
    watch = MemWatch(probes=[probe, "host"])
    fit(watch, epochs=4)  # 17 samples
    assert probe.calls == 10
    warnings = [r.getMessage() for r in memwatch_logs.records if r.levelname == "WARNING"]
    assert sum("switched off" in w for w in warnings) == 1
    assert "switched off" in watch.summary()


def test_a_slow_probe_is_treated_as_failed(memwatch_logs):
    class Slow(FakeProbe):
        def read(self):
            import time
            time.sleep(0.6)
            return super().read()

    watch = MemWatch(probes=[Slow([(1, 2)]), "host"])
    fit(watch, epochs=1, n=32)
    gpu = watch.to_dataframe().query("device == 'GPU:0'")
    assert gpu["current_bytes"].isna().all()
    assert "took" in memwatch_logs.text


def test_a_probe_that_cannot_start_is_skipped():
    class Broken(Probe):
        name = "broken"
        columns = ("allocator_current_bytes",)

        def start(self):
            raise KeyError("framework API changed")

        def read(self):
            return ()

    watch = MemWatch(probes=[Broken(), "host"])
    fit(watch, epochs=1)
    assert watch.to_dataframe()["device"].unique().tolist() == ["host"]


# -- nothing lost -------------------------------------------------------------

class RaiseAt(keras.callbacks.Callback):
    """Raises from on_train_batch_end at a batch (not async-safe: keeps the
    loop synchronous, so which rows exist is exact)."""

    def __init__(self, epoch, batch, error):
        super().__init__()
        self.at, self.error, self.epoch = (epoch, batch), error, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            raise self.error


@pytest.mark.parametrize("error", [RuntimeError("data pipeline broke"), KeyboardInterrupt()])
def test_rows_survive_an_exception_mid_fit(error, tmp_path):
    watch = MemWatch(probes="host", log_path=tmp_path / "m.csv")
    with pytest.raises(type(error)):
        fit(watch, epochs=3, extra=[RaiseAt(1, 2, error)])
    # train begin, epoch 0 (4 batches), epoch 1 batches 0-2
    expected = [(0, None)] + [(0, b) for b in range(4)] + [(1, b) for b in range(3)]
    for frame in (watch.to_dataframe(), load_log(tmp_path / "m.csv")):
        got = [(e, None if b is pd_na(b) else b) for e, b in zip(frame["epoch"], frame["batch"])]
        assert got == expected
        assert frame["step"].tolist() == list(range(8))
    # The instance is usable again after the crash.
    fit(watch, epochs=1)
    assert len(watch.to_dataframe()) == 5


def pd_na(value):
    import pandas as pd

    return value if value is pd.NA else object()


KILLED = textwrap.dedent("""
    import os, signal, sys, time
    import keras, numpy as np
    from keras_memwatch import MemWatch

    class Kill(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 6:
                time.sleep(0.3)  # rows older than 0.1 s are on disk
                os.kill(os.getpid(), signal.SIGKILL)

    x = np.zeros((160, 8), "float32"); y = np.zeros((160, 1), "float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[MemWatch(probes="host", log_path=sys.argv[1]), Kill()])
""")


def test_a_killed_process_leaves_every_row_older_than_a_tenth_of_a_second(tmp_path):
    log = tmp_path / "m.csv"
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", KILLED, str(log)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    frame = load_log(log)
    assert frame["step"].tolist() == list(range(8))  # train begin + batches 0-6
    assert frame["batch"].tolist()[1:] == list(range(7))


# -- concurrency -------------------------------------------------------------

def test_hooks_on_many_threads_lose_reorder_or_duplicate_nothing():
    """10,000 steps with batch-end hooks on 8 worker threads, as Keras's
    async dispatch runs them."""
    watch = MemWatch(probes=[FakeProbe([(100, 200)]), "host"], verbose=0)
    watch.async_safe = True  # Keras dispatches only async-safe hooks so
    watch.set_model(tiny_model())
    watch.on_train_begin()
    steps = 10_000
    with ThreadPoolExecutor(8) as pool:
        for epoch in range(2):
            watch.on_epoch_begin(epoch)
            futures = []
            for batch in range(steps // 2):
                watch.on_train_batch_begin(batch)
                futures.append(pool.submit(watch.on_train_batch_end, batch, {}))
            for f in futures:
                f.result()
            watch.on_epoch_end(epoch, {})
    watch.on_train_end()
    frame = watch.to_dataframe()
    gpu = frame.query("device == 'GPU:0'")
    assert len(gpu) == steps + 1
    assert gpu["step"].tolist() == list(range(steps + 1))
    assert gpu["batch"].tolist()[1:] == list(range(steps // 2)) * 2
    assert gpu["time_s"].is_monotonic_increasing  # sampled in batch order too


def test_async_fit_with_many_steps_keeps_every_row():
    watch = MemWatch(probes="host", verbose=0)
    fit(watch, epochs=2, n=16 * 500)
    frame = watch.to_dataframe()
    assert frame["step"].tolist() == list(range(1001))
    assert frame["batch"].tolist()[1:] == list(range(500)) * 2


# -- long runs ---------------------------------------------------------------

def test_max_rows_bounds_memory_while_the_log_stays_complete(tmp_path):
    watch = MemWatch(probes="host", max_rows=5, log_path=tmp_path / "m.csv")
    fit(watch, epochs=3)
    frame = watch.to_dataframe()
    assert frame["step"].tolist() == list(range(8, 13))
    assert len(load_log(tmp_path / "m.csv")) == 13


# -- hygiene -----------------------------------------------------------------

def test_the_package_runs_no_subprocess_network_or_pickle():
    forbidden = {"subprocess", "socket", "pickle", "urllib", "http", "requests",
                 "shelve", "marshal"}
    # The one exception: the capacity estimate's trials in new processes
    # (`sys.executable -m keras_memwatch.capacity.fresh_process`, no shell).
    allowed = {"fresh_process.py": {"subprocess"}}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__main__.py" or path.name == "demo.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            bad = forbidden - allowed.get(path.name, set())
            assert not bad & set(names), f"{path.name} imports {names}"
            if isinstance(node, ast.Attribute) and node.attr in ("system", "popen"):
                pytest.fail(f"{path.name} calls os.{node.attr}")
