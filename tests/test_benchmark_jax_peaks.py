"""The GPU check of JAX's peaks (`benchmarks/gpu/jax_peaks.py`) runs small on
the CPU: there only its check of Keras's batch logs applies, and its peak
checks are tried on a fake GPU whose readings catch steps in flight."""

import json
import sys
from pathlib import Path

import keras
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu.jax_peaks import main, run  # noqa: E402
from test_workflows import IN_FLIGHT, InFlightGPU  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "jax",
                                reason="a check of JAX's fit")


def test_on_the_cpu_it_checks_the_batch_logs_and_says_the_rest_needs_a_gpu(capsys):
    assert main(["--epochs", "1", "--workers", "2"]) == 0
    printed = capsys.readouterr().out
    out = json.loads(printed.splitlines()[-1])
    assert out["device"] == "host"
    assert out["checks"] == {"batch logs are their row's or named prior": True}
    assert out["logs_own"] + out["logs_prior_batch"] == 26 and out["logs_wrong"] == 0
    assert out["oversized"] == [[0, 12], [0, 25]]
    assert "not applicable (no device whose peaks come from XLA's plan" in printed
    assert "PASS: batch logs are their row's or named prior" in printed


def test_its_peak_checks_pass_where_readings_catch_steps_in_flight(monkeypatch):
    # The fake GPU is the device the step runs on, as on a JAX GPU; between
    # steps it holds nothing but the state (a few KiB here).
    monkeypatch.setattr("keras_memwatch.record.probes.jax.local_gpu_names",
                        lambda: ("GPU:0",))
    out = run(gpu=False, epochs=1, probes=[InFlightGPU(in_use=0)])
    assert out["device"] == "GPU:0"
    assert all(out["checks"].values()) and len(out["checks"]) == 4
    assert out["ordinary_peak_over_neighbours"] == 1.0
    assert out["summary_peak_mib"] < IN_FLIGHT / 2**20
