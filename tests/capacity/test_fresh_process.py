"""The job a fresh process trains for a check: a size that runs out of
memory is reported so, on every backend."""

from __future__ import annotations

import sys

import keras
import pytest

from conftest import run_out_of_memory_child


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")
@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="JAX alone defers a step's failure to its results")
def test_a_job_whose_steps_run_out_of_memory_exits_as_out_of_memory(tmp_path):
    """`fit` on JAX returns over a step that ran out of memory; the job
    awaits its steps, so the check reads the size as failed."""
    result = run_out_of_memory_child(tmp_path, """
        from keras_memwatch.capacity import fresh_process

        model.save("model.keras")
        fresh_process.save_batch(".", *small)
        status, report = fresh_process.train_fresh(".", 8, 2**30)
        cap_address_space()
        failed, failed_report = fresh_process.train_fresh(".", 2000, 2**30)
        print(json.dumps({"ran": [status, report],
                          "out": [failed, failed_report],
                          "oom": fresh_process.EXIT_OOM}))
    """)
    assert result["ran"] == [0, {}], result
    assert result["out"][0] == result["oom"], result


# -- the parent: jobs side by side -------------------------------------------

FAKE_CHILD = """
import argparse, atexit, json, os, sys, time
from keras_memwatch.capacity import fresh_process

parser = argparse.ArgumentParser()
parser.add_argument("--extra")
args = fresh_process.child_arguments(sys.argv[1:], parser)
sys.stderr.write("a framework's logs " * 20000)  # more than a pipe holds
sys.stderr.flush()
with open(f"{args.directory}/args-{args.size}", "w") as f:
    json.dump(vars(args), f)
# every job of the round has begun before any ends, or the round was not
# side by side
open(f"{args.directory}/began-{args.size}", "w").close()
deadline = time.time() + 120
while not all(os.path.exists(f"{args.directory}/began-{b}")
              for b in os.environ["ROUND"].split(",")):
    if time.time() > deadline:
        sys.exit("the other jobs of the round never began")
    time.sleep(0.05)
if args.size > 100:
    print(json.dumps({"error": "OutOfMemoryError"}))
    sys.exit(fresh_process.EXIT_OOM)
if args.size == 99:
    sys.exit("a child that cannot load its model")
jobs_before = len([f for f in os.listdir(args.directory)
                   if f.startswith(f"job-{args.size}-")])
open(f"{args.directory}/job-{args.size}-{jobs_before}", "w").close()
running = [f for f in os.listdir(args.directory) if f.startswith("running-")]
with open(f"{args.directory}/beside-{args.size}-{jobs_before}", "w") as f:
    f.write(str(len(running)))  # jobs training beside this one
mine = f"{args.directory}/running-{os.getpid()}"
open(mine, "w").close()
atexit.register(os.remove, mine)
time.sleep(0.2)
if args.size == 61 or (args.size == 60 and not jobs_before):  # others hold the GPU
    print(json.dumps({"error": "OutOfMemoryError", "device_full": True}))
    sys.exit(fresh_process.EXIT_OOM)
if args.size == 50 and jobs_before:  # near the limit: trains once in two
    print(json.dumps({"error": "OutOfMemoryError"}))
    sys.exit(fresh_process.EXIT_OOM)
print(json.dumps({"allocated": 1000 * args.size}))
"""


class FakeSteps:
    """What `Jobs` reads of the ladder's strategy."""

    above_limit = True
    in_use, limit, limit_words = 500, 10**9, "a cap"
    words = "steps"
    build_left = (0, 0)
    device = type("Device", (), {"backend": "cpu", "gpu_index": None,
                                 "on_gpu": False, "name": "the host"})()
    model = object()

    def __init__(self):
        self.lines = []
        self.progress = self.lines.append


def _jobs(tmp_path, monkeypatch, round_sizes, **child):
    from keras_memwatch.capacity import fresh_process

    monkeypatch.setenv("ROUND", ",".join(map(str, round_sizes)))

    (tmp_path / "fake_child.py").write_text(FAKE_CHILD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    steps = FakeSteps()
    return fresh_process.Jobs(steps, str(tmp_path),
                              fresh_process.Child("fake_child", **child), width=3,
                              own=False), steps


def test_a_rounds_jobs_train_side_by_side_and_report_each_size(tmp_path, monkeypatch):
    jobs, steps = _jobs(tmp_path, monkeypatch, [8, 200, 4], base_bytes=200)
    ran, big, small = jobs.check([8, 200, 4])  # each waits until all began
    assert (ran.ran, ran.need_bytes, ran.how) == (True, 8000 - 200, "job")
    assert (big.ran, big.need_bytes) == (False, None)
    assert small.need_bytes == 4000 - 200
    assert len(steps.lines) == 3 and "out of memory" in steps.lines[1]
    assert "batch 8, 2 jobs in new processes" in steps.lines[0]
    assert steps.lines[0].endswith("ran in each")
    jobs.close()  # not its own directory: kept
    assert (tmp_path / "fake_child.py").exists()


def test_a_size_fits_only_where_each_of_its_jobs_trained(tmp_path, monkeypatch):
    """Near the limit a size trains in one new process and not in the
    next: a size that trained trains again before it counts."""
    from keras_memwatch.capacity import fresh_process

    jobs, steps = _jobs(tmp_path, monkeypatch, [50, 8, 200])
    flaky, steady, big = jobs.check([50, 8, 200])
    assert (flaky.ran, flaky.need_bytes) == (False, None)
    assert (steady.ran, big.ran) == (True, False)
    jobs_of = {b: len(list(tmp_path.glob(f"job-{b}-*"))) for b in (50, 8)}
    assert jobs_of == {50: fresh_process.JOBS_TO_FIT, 8: fresh_process.JOBS_TO_FIT}
    assert "batch 50, 2 jobs in new processes" in steps.lines[0]
    assert steps.lines[0].endswith("ran, then out of memory")
    assert "batch 200, a job in a new process" in steps.lines[2]


def test_a_job_that_found_the_device_full_counts_for_nothing(tmp_path, monkeypatch,
                                                             caplog):
    """Another process held the device, so the job ran out of memory before
    its cap: it trains again, and the jobs after it train one at a time."""
    from keras_memwatch.capacity import fresh_process

    jobs, steps = _jobs(tmp_path, monkeypatch, [60, 8])
    with caplog.at_level("WARNING", logger="keras_memwatch"):
        full_once, steady = jobs.check([60, 8])
    assert full_once.ran and steady.ran
    assert len(list(tmp_path.glob("job-60-*"))) == 1 + fresh_process.JOBS_TO_FIT
    assert "batch 60, 3 jobs in new processes" in steps.lines[0]
    assert steps.lines[0].endswith(": the device was full, then ran, then ran")
    later = [(tmp_path / f"beside-{b}-{n}").read_text()
             for b, n in ((60, 1), (60, 2), (8, 1))]
    assert later == ["0", "0", "0"]
    assert "other processes hold the device" in caplog.text


def test_a_device_that_stays_full_is_an_error_naming_it(tmp_path, monkeypatch):
    from keras_memwatch.capacity.fresh_process import (DEVICE_FULL_RETRIES,
                                                       FreshProcessError)

    jobs, _ = _jobs(tmp_path, monkeypatch, [61])
    with pytest.raises(FreshProcessError, match=(
            f"the host ran out of memory before the job's cap, in "
            f"{DEVICE_FULL_RETRIES + 1} jobs: other processes hold it")):
        jobs.check([61])


def test_a_job_says_when_the_device_ran_out_before_its_cap(monkeypatch):
    import numpy as np

    from conftest import TORCH_MESSAGE
    from keras_memwatch.capacity import fresh_process

    def full(*args, **kwargs):
        raise MemoryError(TORCH_MESSAGE)  # 1.06 GiB free, 2.00 GiB asked

    monkeypatch.setattr(keras.Model, "fit", full)
    x, y = np.zeros((2, 3), "float32"), np.zeros((2, 1), "float32")
    status, report = fresh_process.train_job(None, x, y, 4)
    assert status == fresh_process.EXIT_OOM
    assert report == {"error": "MemoryError", "device_full": True}


def test_the_child_gets_the_cap_and_the_arguments_of_its_kind(tmp_path, monkeypatch):
    import json

    jobs, _ = _jobs(tmp_path, monkeypatch, [8], arguments=("--extra", "row"),
                    limit_bytes=123)
    assert jobs.check([8])[0].need_bytes == 8000 - FakeSteps.in_use
    args = json.loads((tmp_path / "args-8").read_text())
    assert (args["size"], args["limit_bytes"], args["extra"]) == (8, 123, "row")
    assert args["break_cycles"] is False  # the steps' backend is not PyTorch


def test_a_childs_arguments_name_the_module_and_the_cycles_fix():
    from keras_memwatch.capacity import fresh_process

    args = fresh_process.child_arguments(
        ["d", "8", "123", "keras_hub", "--break-tree-cycles"])
    assert (args.size, args.limit_bytes, args.model_module, args.break_cycles) == (
        8, 123, "keras_hub", True)
    assert fresh_process.child_arguments(["d", "8", "123"]).model_module == ""


def test_a_job_that_fails_for_another_reason_than_memory_is_an_error(
        tmp_path, monkeypatch):
    from keras_memwatch.capacity.fresh_process import FreshProcessError

    jobs, _ = _jobs(tmp_path, monkeypatch, [99, 8])
    with pytest.raises(FreshProcessError, match="batch 99: the process exited 1"):
        jobs.check([99, 8])


def test_jobs_check_only_for_pytorch_on_a_gpu_under_a_cap():
    from keras_memwatch.capacity.fresh_process import Jobs

    why, width = Jobs.refusal(FakeSteps(), 10**9)
    assert "only PyTorch on a GPU under an allocator cap" in why and width == 1
