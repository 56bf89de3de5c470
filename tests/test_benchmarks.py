"""Smoke test of the benchmark suite: it runs with tiny sizes, in this
process (the active backend) and through `python -m benchmarks.run` for one
backend. Structure only: benchmarks are never timed here."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import arms as A  # noqa: E402
from benchmarks.hook import run_hook_cost  # noqa: E402
from benchmarks.overhead import run_overhead  # noqa: E402
from benchmarks.report import render, targets  # noqa: E402
from benchmarks.scale import run_scale  # noqa: E402
from benchmarks.spikes import run_spike_scenario  # noqa: E402


def positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_overhead_runs_every_available_arm():
    available = A.available_arms(gpu=False)
    names = [a for a, why_not in available.items() if why_not is None]
    assert set(A.ABLATIONS) <= set(names)  # each ablation runs on the CPU
    out = run_overhead("mlp", names, gpu=False, reps=1, steps=3, epochs=2)
    assert set(out["arms"]) == set(names)
    for arm in out["arms"].values():
        assert positive(arm["step_ms"]["median"])
        assert positive(arm["ratio"]["median"])
        assert len(arm["ratios"]) == 1
    assert out["arms"]["none"]["ratio"]["median"] == 1.0


def test_hook_cost_has_memwatch_minimal_and_each_probe():
    out = run_hook_cost(gpu=False, reps=2, steps=3, epochs=2)
    assert "host" in out["probes"]
    for key in ("memwatch_us", "minimal_us", "ratio", "memwatch_begin_us",
                "memwatch_end_us", "minimal_called_us", "ratio_called"):
        assert positive(out[key]), key
    probe = out["per_probe"]["host"]
    assert positive(probe["hot_loop_us"])
    assert positive(probe["in_memwatch_us"]["median"])
    assert positive(probe["in_minimal_us"]["median"])
    assert out["batches_timed"] > 0
    profile = out["profile_us"]
    for part in ("begin_hook", "end_hook", "probe_reads", "end_hook_uninstrumented"):
        assert positive(profile[part]), part
    # the parts of the end hook add up to it
    assert profile["end_hook"] == pytest.approx(
        profile["probe_reads"] + profile["sampler_guard"] + profile["logs_figures"]
        + profile["hand_over_and_checks"], rel=0.2)


def test_spike_scenario_reports_each_tool():
    out = run_spike_scenario(gpu=False, batches=16)
    assert out["oversized"] == [14]
    tools = {t["tool"].split()[0]: t for t in out["tools"]}
    memwatch = tools["MemWatch()"]
    assert memwatch["tied_to_batch"] is True
    assert memwatch["samples"] > 0
    assert set(memwatch["caught"]) <= set(out["oversized"])
    stormlog = next(t for t in out["tools"] if "tormlog" in t["tool"])
    assert "skipped" in stormlog or stormlog["tied"] == []


def test_scale_figures():
    out = run_scale(samples=3000, csv_samples=500, ring=1000, detector_n=500,
                    repeats=1)
    assert [m["device"] for m in out["memory"]] == ["host", "GPU:0"]
    for m in out["memory"]:
        assert positive(m["allocated_bytes_per_row"])
        assert m["rows"] == 3000
    assert [m["rows"] for m in out["ring"]["memory"]] == [1000, 1000]
    assert out["to_dataframe_host_only"]["rows"] == 3000
    assert out["to_dataframe_host_and_gpu"]["rows"] == 6000
    assert positive(out["csv"]["rows_per_s"])
    assert positive(out["detector"]["window=1000"]["us_per_update"])


@pytest.mark.skipif(not any(
    __import__("importlib").util.find_spec(b) for b in ("jax", "torch")),
    reason="needs jax or torch")
def test_runner_quick_prints_a_table_and_writes_json(tmp_path):
    import importlib.util

    backend = "jax" if importlib.util.find_spec("jax") else "torch"
    out = tmp_path / "bench.json"
    overrides = {"overhead": {"reps": 1, "steps": 3}, "hook": {"steps": 3},
                 "scale": {"samples": 2000, "csv_samples": 200, "ring": 500,
                           "detector_n": 200}}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--backend", backend,
         "--only", "overhead,hook,scale", "--models", "mlp", "--json", str(out),
         "--overrides", json.dumps(overrides)],
        cwd=str(ROOT), capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "### Overhead on training" in proc.stdout
    assert "### Batch hook CPU time" in proc.stdout
    assert "Where MemWatch's hook time goes" in proc.stdout
    assert "### Targets" in proc.stdout
    results = json.loads(out.read_text())
    assert results["machine"]["versions"]["keras"]
    entry = results["backends"][backend]
    assert entry["status"] == "ok"
    assert {"none", "none_b", "memwatch"} <= set(entry["overhead"]["mlp"]["arms"])
    assert positive(entry["hook"]["ratio"])
    assert results["scale"]["scale"]["samples"] == 2000
    assert results["targets"]
    assert render(results) == proc.stdout.rstrip("\n") + "\n"
    assert {t["target"] for t in targets(results)} >= {
        "hook <= 1.5x minimal", "detector update < 5 us"}

    from benchmarks.run import merge

    merged = merge([str(out), str(out)])
    assert list(merged["backends"]) == [f"{backend}/cpu"]
    assert "### Overhead on training" in render(merged)


def test_overhead_runs_only_the_arms_asked_for_beside_no_callback():
    from benchmarks.child import run_parts

    out = run_parts(["overhead"], True, ["mlp"], {"overhead": {"arms": ["reads"]}})
    assert set(out["overhead"]["mlp"]["arms"]) == {"none", "reads"}


def test_capacity_check_estimates_and_trains_a_tiny_model_as_jobs():
    """The GPU check of issue 37, its pieces on the CPU: an estimate with
    every answer, and a job that trains."""
    backend = os.environ.get("KERAS_BACKEND")
    if backend != "torch":
        pytest.skip("one backend is enough for the benchmark's plumbing")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}

    def run(*args):
        proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu.capacity_check", *args],
                              cwd=str(ROOT), capture_output=True, text=True,
                              timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    estimate = run("estimate", "gpt2_tiny")
    assert estimate["answers"]["0.0"] >= estimate["answers"]["0.1"] > 0
    assert estimate["observations"][0][0] == 1
    job = run("trial", "resconv_tiny", "8", "--steps", "2", "--epochs", "2")
    assert job["result"] == "ran" and job["step_ms"] > 0


def test_in_flight_says_it_needs_a_gpu_where_jax_gives_no_memory_statistics():
    """The run-ahead count of issue 15 reads the device's memory in use; on
    a CPU there is none to read, and it says so rather than print zeros."""
    if os.environ.get("KERAS_BACKEND") != "jax":
        pytest.skip("in_flight runs on JAX")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.in_flight", "conv_tiny", "4", "--steps", "3"],
        cwd=str(ROOT), capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})
    assert proc.returncode != 0
    assert "gives no memory statistics; run it on a GPU" in proc.stderr


def test_compile_phases_adds_up_each_sets_pass_times_from_xla_log():
    """XLA logs each HLO pass's time; the lines before a set's report are
    that set's compilation."""
    from benchmarks.gpu.compile_phases import pass_seconds

    lines = ["I1205 hlo_pass_pipeline.cc:1] HLO pass: priority-fusion time: 7.5 s (x)",
             "I1205 hlo_pass_pipeline.cc:1] HLO pass: algsimp time: 120 ms (x)",
             "I1205 hlo_pass_pipeline.cc:1] HLO pass: algsimp time: 80 ms (x)",
             "aim batch 30: compiled in 16.9 s, buffers assigned at 13.5 s, plan 1 MiB",
             "I1205 hlo_pass_pipeline.cc:1] HLO pass: config-assigner time: 8.49 s (x)",
             "fit batch 30: compiled in 26.0 s, buffers assigned at 20.6 s, plan 1 MiB"]
    out = pass_seconds(lines)
    assert out["aim"] == pytest.approx({"priority-fusion": 7.5, "algsimp": 0.2})
    assert out["fit"] == pytest.approx({"config-assigner": 8.49})


def test_ways_check_calls_an_answer_that_trains_in_some_processes_at_the_edge():
    """A row's answer is right when every job at it ran and none 3% above
    did; where some of the repeated jobs at a size ran, the verdict says
    so rather than calling it right or above."""
    from benchmarks.gpu.ways_check import _ran, _verdict

    ran, oom, lost = {"ran": True}, {"ran": False}, {"ran": None}
    assert _verdict([ran], [oom]) == "right"
    assert _verdict([oom], [oom]) == "ABOVE the limit"
    assert _verdict([ran], [ran]) == "more than 3% low"
    assert _verdict([ran], [lost]) == "no result"
    full = {"ran": False, "device_full": True}  # other processes held the card
    assert _verdict([ran], [full]).startswith("no result (a job found the device full")
    assert _verdict([ran, oom, ran], [oom] * 3) == (
        "at the edge (the answer ran 2 of 3 times)")
    assert _verdict([ran] * 3, [oom, ran, oom]).startswith("right, at the edge")
    assert (_ran([ran]), _ran([ran, oom, ran])) == ("ran=True", "ran 2 of 3")


def test_peak_owners_replays_an_allocator_record_to_its_peak_or_its_failure():
    """The live bytes at the record's peak, by the innermost Keras frame
    that allocated them; blocks from before the record count as such, and
    a failed allocation ends the replay with the asked bytes."""
    from benchmarks.gpu.peak_owners import owner, replay

    conv = [{"filename": "/k/keras/src/layers/conv.py", "name": "call"},
            {"filename": "/k/keras/src/trainers/trainer.py", "name": "fit"}]
    sgd = [{"filename": "/k/keras/src/optimizers/sgd.py", "name": "update_step"}]
    assert owner(conv) == "layer: conv.py:call"
    assert owner(conv[::-1]) == "trainer: trainer.py:fit"
    assert owner([{"filename": "x.py", "name": "<module>"}] + conv[::-1]) == (
        "layer: conv.py:call")
    assert owner([]).startswith("no Keras frame")
    trace = [{"action": "alloc", "addr": 1, "size": 100, "frames": conv},
             {"action": "alloc", "addr": 2, "size": 50, "frames": sgd},
             {"action": "free_completed", "addr": 1, "size": 100},
             {"action": "free_completed", "addr": 9, "size": 30},
             {"action": "alloc", "addr": 3, "size": 60, "frames": sgd}]
    peak = replay(trace, before=40)
    assert peak["peak"] == 190 and not peak["oom"]
    assert peak["owners"]["layer: conv.py:call"] == 100
    assert peak["owners"]["allocated before the record"] == 40
    failed = replay(trace + [{"action": "oom", "size": 500}], before=40)
    assert failed["oom"] and failed["peak"] == 10 + 50 + 60 + 500
    assert failed["largest"][0] == (60, "optimizer: sgd.py:update_step")


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="the cycles are Keras's PyTorch backend's")
def test_tree_cycles_counts_what_steps_leave_before_and_after_the_fix(
        tree_functions_restored, capsys):
    from benchmarks import tree_cycles
    from keras_memwatch.configure.tree_cycles import tree_holds_cycles

    held = tree_holds_cycles()
    assert tree_cycles.main(["--models", "conv_tiny", "--batch", "4", "--steps", "2",
                             "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    before, after = (line for line in lines if "in cycles" in line)
    assert ("leave 0 tensors" not in before) is held
    assert "leave 0 tensors (0.00 MiB)" in after
    assert lines[-1].startswith("conv_tiny: a step's time after the fix x")


def test_by_layer_check_splits_the_small_convnet_on_the_cpu():
    """The GPU check of issue 40, on the CPU: the small convnet's top layers,
    the layers' sum against the step's working memory, as JSON."""
    backend = os.environ.get("KERAS_BACKEND")
    if backend not in ("jax", "torch"):
        pytest.skip("the check is for JAX and PyTorch")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.by_layer_check", "--top", "3"],
        cwd=str(ROOT), capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["backend"] == backend and result["channels"] == 32
    assert result["top_layers"][0]["layer"] in ("conv1", "conv2")
    assert 0 < result["layers_sum_bytes"] < result["working_bytes"]
    assert "Where a step's working memory goes" in proc.stderr


def test_each_ablation_switches_its_part_off():
    from conftest import tiny_data, tiny_model

    Ablated = A.ablated_memwatch_class()
    x, y = tiny_data(64)

    def fit(ablation):
        watch = Ablated(ablation)
        history = tiny_model().fit(x, y, batch_size=16, epochs=1, verbose=0,
                                   callbacks=[watch])
        return watch, history.history

    watch, _ = fit("memwatch_noproc")
    assert watch.to_dataframe().empty  # reads taken, never processed
    watch, history = fit("memwatch_nologs")
    assert not watch.to_dataframe().empty and "mem_peak_mib" not in history
    watch, _ = fit("memwatch_noplan")
    assert "ablated" in watch.sources.get("xla plan", "ablated")
    watch, _ = fit("memwatch_nothread")
    assert len(watch.to_dataframe()["step"].unique()) == 5  # drained at the end


def test_html_report_benchmark_builds_a_record_and_writes_its_page(tmp_path):
    """`benchmarks.html_report` on a tiny record: the record has the
    columns of a real one and a spike every 500 steps; the page is written."""
    pytest.importorskip("plotly", reason="the HTML report needs plotly")
    from benchmarks.html_report import long_record, write_seconds
    from keras_memwatch import columns as C

    frame = long_record(1000)
    assert list(frame.columns) == list(C.COLUMNS) and len(frame) == 2002
    assert frame.loc[(frame["device"] == "GPU:0") & frame["spike"], "step"].tolist() == [
        499, 999]
    assert positive(write_seconds(frame, tmp_path / "long.html", 1))
    assert (tmp_path / "long.html").stat().st_size > 1_000_000
