"""fit-check: what fits, asked from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import keras

BACKEND = keras.backend.backend()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODEL_MODULE = textwrap.dedent("""
    import keras
    import numpy as np

    def build():
        model = keras.Sequential([
            keras.Input((16, 16, 1)),
            keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
        ])
        model.compile(optimizer="adam", loss="mse")
        rng = np.random.default_rng(0)
        return model, (rng.random((8, 16, 16, 1), dtype=np.float32),
                       rng.random((8, 4), dtype=np.float32))
""")


def run_cli(tmp_path, *args, module="-m keras_memwatch.cli.fit_check"):
    (tmp_path / "tiny_model_mod.py").write_text(MODEL_MODULE)
    env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *module.split(), *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


def test_fit_check_command_prints_breakdown_and_prediction(tmp_path):
    done = run_cli(tmp_path, "--model", "tiny_model_mod:build",
                   "--trial-sizes", "64,128,256,512")
    assert done.returncode in (0, 3), done.stderr
    out = done.stdout
    assert f"fit-check: tiny_model_mod:build (backend {BACKEND}, host)" in out
    assert "Where the memory went:" in out and "optimizer state:" in out
    assert "in use before a step:" in out
    assert "Predicted largest batch:" in out
    assert ("host memory: MemAvailable" in out) or ("No answer" in out)


def test_fit_check_json(tmp_path):
    done = run_cli(tmp_path, "--model", "tiny_model_mod:build", "--json",
                   "--trial-sizes", "8,16,32")
    assert done.returncode in (0, 3), done.stderr
    result = json.loads(done.stdout)
    assert [o["batch_size"] for o in result["observations"]] == [8, 16, 32]
    assert result["device"] == "host" and result["backend"] == BACKEND
    assert result["limit_detail"].startswith("host memory")


def test_fit_check_rejects_a_bad_model_spec(tmp_path):
    done = run_cli(tmp_path, "--model", "tiny_model_mod")
    assert done.returncode == 2 and "MODULE:FUNCTION" in done.stderr
    done = run_cli(tmp_path, "--model", "tiny_model_mod:nothing")
    assert done.returncode == 2 and "no function" in done.stderr


def test_fit_check_subcommand_of_the_package(tmp_path):
    done = run_cli(tmp_path, "fit-check", "--model", "tiny_model_mod:build",
                   "--trial-sizes", "8,16,32", module="-m keras_memwatch")
    assert done.returncode in (0, 3), done.stderr
    assert "Predicted largest batch:" in done.stdout


def test_fit_check_ways_prints_what_each_lever_saves(tmp_path):
    done = run_cli(tmp_path, "--model", "tiny_model_mod:build", "--trial-sizes",
                   "8,16", "--ways", "--batch-size", "16", "--levers",
                   "sgd_momentum,shorter_sequence")
    assert done.returncode in (0, 3), done.stderr
    out = done.stdout.split("Ways to fit a batch of 16 (under 10% headroom):")[1]
    lines = out.strip().splitlines()
    assert lines[1].split()[:2] == ["as", "is"]
    assert lines[2].split()[0] == "sgd_momentum" and "iB" in lines[2]
    assert "not applied: the inputs hold no token ids" in lines[3]
    assert "  sgd_momentum: model.compile(optimizer=keras.optimizers.SGD(" in out


def test_fit_check_refuses_an_unknown_lever(tmp_path):
    done = run_cli(tmp_path, "--model", "tiny_model_mod:build", "--ways",
                   "--levers", "warp_drive")
    assert done.returncode == 2
    assert "argument --levers: Expected `levers` to be" in done.stderr


def test_fit_check_takes_a_time_budget_and_a_compilation_cache(tmp_path):
    # sizes whose steps every backend sees grow (TensorFlow's CPU allocator
    # does not count arrays under 256 KiB, all this model has at 1 and 8)
    done = run_cli(tmp_path, "--model", "tiny_model_mod:build", "--json",
                   "--trial-sizes", "64,512", "--max-seconds", "0.001",
                   "--compilation-cache", "jax_cache")
    assert done.returncode in (0, 3), done.stderr
    result = json.loads(done.stdout)  # no progress lines mixed in
    assert result["max_seconds"] == 0.001
    assert len(result["observations"]) == 2  # out of time after two sizes
    assert (tmp_path / "jax_cache").is_dir() == (BACKEND == "jax")


def test_fit_check_passes_fresh_process_to_the_estimate_and_the_table(tmp_path):
    done = run_cli(tmp_path, "--model", "tiny_model_mod:build", "--trial-sizes",
                   "8,16", "--ways", "--batch-size", "16", "--levers",
                   "sgd_momentum", "--fresh-process")
    assert done.returncode in (0, 3), done.stderr
    for caller in ("estimate_max_batch_size", "ways_to_fit"):
        assert (f"{caller}: fresh_process=True, but only PyTorch on a GPU under an "
                "allocator cap") in done.stderr
    assert "Ways to fit a batch of 16" in done.stdout


def test_compilation_cache_alone_means_the_default_directory():
    import argparse

    from keras_memwatch.cli.fit_check import add_fit_check_arguments

    parser = add_fit_check_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--model", "m:f", "--compilation-cache"])
    assert args.compilation_cache is True
    assert parser.parse_args(["--model", "m:f"]).compilation_cache is None
