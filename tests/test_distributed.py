"""Beyond one process (issue 17): each process writes its own log, a taken
name gives the next free one (never an exception inside `fit`), MemWatch adds
no collective, and a real two-process JAX run (`jax.distributed` on the CPU,
gloo collectives, `keras.distribution.DataParallel`) ends in two complete
rank-tagged logs that `report` reads as one."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import keras
import pytest

from conftest import tiny_data, tiny_model
from keras_memwatch import MemWatch, load_log

ROOT = Path(__file__).resolve().parents[1]
BACKEND = keras.backend.backend()


def fit(watch, epochs=1):
    x, y = tiny_data(64)
    tiny_model().fit(x, y, epochs=epochs, batch_size=16, callbacks=[watch], verbose=0)


@pytest.fixture
def second_of_two(monkeypatch):
    """This process is process 1 of 2, as `ranks` would find it under
    `jax.distributed`, `TF_CONFIG` or `torch.distributed`."""
    monkeypatch.setattr("keras_memwatch.configure.ranks.process_index_and_count", lambda: (1, 2))
    monkeypatch.setattr("keras_memwatch.record.csvlog.process_index_and_count",
                        lambda: (1, 2))
    monkeypatch.setattr("keras_memwatch.session.call.process_index_and_count",
                        lambda: (1, 2))


def test_each_process_writes_its_own_log(tmp_path, second_of_two, memwatch_logs):
    (tmp_path / "mem.csv").write_text("an earlier single-process run's")
    watch = MemWatch(probes="host", log_path=tmp_path / "mem.csv", verbose=0)
    fit(watch)
    fit(watch)
    assert watch.log_paths == [str(tmp_path / "mem.rank1.csv"),
                               str(tmp_path / "mem.rank1.1.csv")]
    assert (tmp_path / "mem.csv").read_text() == "an earlier single-process run's"
    frame = load_log(watch.log_paths[0])
    assert set(frame["process"]) == {1} and set(frame["hostname"]) == {watch.hostname}
    assert watch.process == 1 and watch.process_count == 2
    assert "exists" not in memwatch_logs.text  # its own earlier file: no warning


def test_rank_in_the_path_is_replaced(tmp_path, second_of_two):
    watch = MemWatch(probes="host", log_path=tmp_path / "run-{rank}.csv", verbose=0)
    fit(watch)
    assert watch.log_paths == [str(tmp_path / "run-1.csv")]


def test_rank_in_the_path_of_a_single_process_and_a_taken_name(tmp_path, memwatch_logs):
    (tmp_path / "run-0.csv").write_text("another job's")
    watch = MemWatch(probes="host", log_path=tmp_path / "run-{rank}.csv", verbose=0)
    fit(watch)  # no FileExistsError, before or inside fit
    assert watch.log_paths == [str(tmp_path / "run-0.1.csv")]
    assert "run-0.csv exists" in memwatch_logs.text


def test_a_sweep_of_jobs_started_at_once_in_one_folder(tmp_path, memwatch_logs):
    """Both jobs checked `mem.csv` before either created it."""
    first = MemWatch(probes="host", log_path=tmp_path / "mem.csv", verbose=0)
    second = MemWatch(probes="host", log_path=tmp_path / "mem.csv", verbose=0)
    fit(first)
    fit(second)
    assert first.log_paths == [str(tmp_path / "mem.csv")]
    assert second.log_paths == [str(tmp_path / "mem.1.csv")]
    assert f"{tmp_path / 'mem.csv'} exists" in memwatch_logs.text
    assert len(load_log(second.log_paths[0])) == len(second.to_dataframe())


def test_a_tf_config_task_index_names_the_log(tmp_path, monkeypatch):
    """`MultiWorkerMirroredStrategy`'s workers are told apart by TF_CONFIG."""
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 1}}))
    watch = MemWatch(probes="host", log_path=tmp_path / "mem.csv", verbose=0)
    fit(watch)
    assert watch.log_paths == [str(tmp_path / "mem.rank1.csv")]
    assert set(load_log(watch.log_paths[0])["process"]) == {1}


def test_a_single_process_still_refuses_an_existing_log(tmp_path):
    (tmp_path / "mem.csv").write_text("x")
    with pytest.raises(FileExistsError, match="log_path"):
        MemWatch(probes="host", log_path=tmp_path / "mem.csv")


def test_memwatch_adds_no_collective_or_barrier():
    """No distributed call anywhere in the package: a slow or dead process
    never blocks another's training because of MemWatch."""
    banned = re.compile(
        r"multihost_utils|sync_global_devices|process_allgather|broadcast_one_to_all"
        r"|\bpsum\b|all_reduce|allreduce|all_gather|\bbarrier\(|torch\.distributed\.("
        r"?!is_available|is_initialized|get_rank|get_world_size)"
        r"|experimental_run|strategy\.reduce|CollectiveOps|collective_ops")
    found = []
    for path in (ROOT / "keras_memwatch").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if banned.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


# -- a real two-process JAX run -------------------------------------------------

WORKER = textwrap.dedent("""
    import json, os, sys, time
    started = time.time()
    process_id, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=2, process_id=process_id)
    import keras
    import numpy as np
    from keras_memwatch import MemWatch

    keras.utils.set_random_seed(0)
    distribution = keras.distribution.DataParallel(devices=jax.devices())
    distribution.auto_shard_dataset = False
    keras.distribution.set_distribution(distribution)
    model = keras.Sequential([keras.Input((8,)),
                              keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = rng.normal(size=(256, 1)).astype("float32")
    watch = MemWatch(log_path=os.path.join(out, "mem.csv"), verbose=0)
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[watch])
    frame = watch.to_dataframe()
    print(json.dumps({
        "log_paths": watch.log_paths, "process": watch.process,
        "process_count": watch.process_count, "hostname": watch.hostname,
        "devices": sorted(set(frame["device"].astype(str))),
        "global_devices": len(jax.devices()), "local_devices": len(jax.local_devices()),
        "seconds": round(time.time() - started, 1)}))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two(script: Path, out: Path, timeout: float = 240) -> list[dict]:
    """Runs process 0 and 1; kills both if either hangs (a dead process
    leaves the other waiting in a collective)."""
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("XLA_FLAGS", None)
    port = free_port()
    children = [subprocess.Popen([sys.executable, str(script), str(i), str(port),
                                  str(out)], env=env, cwd=out, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for child in children:
            outputs.append(child.communicate(timeout=max(deadline - time.monotonic(), 1)))
    except subprocess.TimeoutExpired:
        for child in children:
            child.kill()
        tails = [child.communicate()[1][-2000:] for child in children]
        pytest.fail(f"the two processes did not finish in {timeout} s: {tails}")
    for child, (stdout, stderr) in zip(children, outputs):
        assert child.returncode == 0, stderr[-4000:]
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]


@pytest.mark.skipif(BACKEND != "jax", reason="jax.distributed needs the JAX backend")
def test_two_jax_processes_write_two_complete_logs_and_one_report(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "run"
    out.mkdir()
    (out / "mem.csv").write_text("an earlier single-process run's")
    results = run_two(script, out)
    for rank, result in enumerate(results):
        assert result["process"] == rank and result["process_count"] == 2
        assert result["log_paths"] == [str(out / f"mem.rank{rank}.csv")]
        # Its own devices only: JAX sees both processes' CPUs, MemWatch one host.
        assert result["global_devices"] == 2 and result["local_devices"] == 1
        assert result["devices"] == ["host"]
        frame = load_log(result["log_paths"][0])
        assert set(frame["process"]) == {rank}
        assert set(frame["hostname"]) == {result["hostname"]}
        # Complete: train begin, then 2 epochs of 8 batches, in order.
        steps = frame[frame["batch"].notna()]
        assert len(frame) == 17 and frame["step"].tolist() == list(range(17))
        assert steps[["epoch", "batch"]].values.tolist() == [
            [e, b] for e in range(2) for b in range(8)]
    assert sorted(os.listdir(out)) == ["mem.csv", "mem.rank0.csv", "mem.rank1.csv"]
    merged = load_log(str(out / "mem.rank*.csv"))
    assert merged["process"].tolist() == [0] * 17 + [1] * 17
    done = subprocess.run([sys.executable, "-m", "keras_memwatch", "report",
                           str(out / "mem.rank*.csv"), "--plot", str(out / "both.png")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    host = results[0]["hostname"]
    text = done.stdout
    assert text.startswith("keras_memwatch report: 2 process(es) on 1 host(s), 2 log(s)")
    assert f"== process 0 on {host} ({out / 'mem.rank0.csv'}) ==" in text
    assert f"== process 1 on {host} ({out / 'mem.rank1.csv'}) ==" in text
    assert "Across processes:" in text and "Imbalance between processes:" in text
    assert (out / "both.png").read_bytes()[:4] == b"\x89PNG"
