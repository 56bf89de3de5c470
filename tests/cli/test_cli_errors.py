"""The command line meets bad input with one clear line: the argument, the
fix, exit status 2, never a traceback (issue 16). Run as a user would, in a
subprocess; arguments are refused before Keras is imported, so most of
these take a fraction of a second."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import pytest

from conftest import hidden_framework

ROOT = Path(__file__).resolve().parents[2]
BACKEND = keras.backend.backend()
INTERNAL_NAMES = ("parse_and_check", "_sizes", "_device", "positive_int",
                  "fraction", "batch_sizes", "choice")

TINY_MODEL = textwrap.dedent("""
    import keras
    import numpy as np

    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss="mse")
        return model, (np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32"))

    def broken():
        raise ValueError("the user's own bug")
""")


def run(*args, cwd=ROOT, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "keras_memwatch", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def refused(done, *words):
    """Exit status 2, one short message with `words`, no traceback."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr
    for name in INTERNAL_NAMES:
        assert f"invalid {name} value" not in done.stderr
    return done.stderr


def env_with(**changes):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def test_version():
    from keras_memwatch import __version__

    done = run("--version", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"keras-memwatch {__version__}"


@pytest.mark.parametrize("args, words", [
    (["demo", "--epochs", "abc"],
     ["argument --epochs: Expected `epochs` to be a positive integer. "
      "Received: epochs='abc'"]),
    (["demo", "--steps", "0"],
     ["argument --steps: Expected `steps` to be a positive integer. "
      "Received: steps=0"]),
    (["fit-check", "--model", "m:build", "--headroom", "abc"],
     ["argument --headroom: Expected `headroom` to be a number in [0, 1)",
      "Received: headroom='abc'"]),
    (["fit-check", "--model", "m:build", "--device", "banana"],
     ["argument --device: Expected `device` to be 'GPU:<i>' or 'host'. "
      "Received: device='banana'"]),
    (["fit-check", "--model", "m:build", "--trial-sizes", "a,b"],
     ["argument --trial-sizes: Expected `trial_sizes`", "trial_sizes='a,b'"]),
    (["fit-check", "--model", "m:build", "--method", "fast"],
     ["argument --method: Expected `method` to be one of ('auto', 'xla', "
      "'steps'). Received: method='fast'"]),
])
def test_bad_arguments_name_the_argument_not_a_function(args, words):
    refused(run(*args, timeout=60), *words)


def test_demo_refuses_a_file_as_its_folder(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    refused(run("demo", "--out", str(afile), timeout=60),
            f"--out {afile} is a file, not a folder")
    refused(run("demo", "--out", str(afile / "sub"), timeout=60),
            f"--out {afile / 'sub'}: cannot create the folder", "--out DIR")
    assert afile.read_text() == "mine"


def test_demo_never_replaces_an_earlier_run_without_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "memwatch.csv").write_text("an earlier run")
    message = refused(run("demo", "--out", str(out), timeout=60),
                      "memwatch.csv", "--force", "--out DIR")
    assert message.count("\n") == 1  # one line
    assert (out / "memwatch.csv").read_text() == "an earlier run"
    assert sorted(p.name for p in out.iterdir()) == ["memwatch.csv"]
    help_text = run("demo", "--help", timeout=60).stdout
    assert "--force" in help_text and "refuses" in help_text


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_a_missing_backend_framework_is_named_with_the_fix(tmp_path, backend):
    (tmp_path / "mymodule.py").write_text(TINY_MODEL)
    env = env_with(KERAS_BACKEND=backend, PYTHONPATH=hidden_framework(tmp_path, backend)
                   + os.pathsep + str(ROOT))
    message = refused(run("fit-check", "--model", "mymodule:build", cwd=tmp_path,
                          env=env),
                      f"Keras is set to the {backend} backend "
                      f"(KERAS_BACKEND={backend})",
                      f"{backend} is not installed: pip install {backend}",
                      "KERAS_BACKEND=")
    assert "cannot load --model" not in message
    refused(run("demo", "--backend", backend, "--out", str(tmp_path / "out"),
                env=env),
            f"Keras is set to the {backend} backend (--backend {backend})",
            f"pip install {backend}")
    assert not (tmp_path / "out").exists()


def test_the_backend_of_keras_json_is_named_when_keras_backend_is_unset(tmp_path):
    home = tmp_path / "keras_home"
    home.mkdir()
    (home / "keras.json").write_text('{"backend": "tensorflow"}')
    (tmp_path / "mymodule.py").write_text(TINY_MODEL)
    env = env_with(KERAS_BACKEND=None, KERAS_HOME=str(home),
                   PYTHONPATH=hidden_framework(tmp_path, "tensorflow") + os.pathsep + str(ROOT))
    refused(run("fit-check", "--model", "mymodule:build", cwd=tmp_path, env=env),
            f"tensorflow backend (from {home / 'keras.json'}, as KERAS_BACKEND is "
            "not set)", "tensorflow is not installed", "export KERAS_BACKEND=jax")


def test_fit_check_says_its_backend_and_refuses_a_device_it_cannot_see(tmp_path):
    (tmp_path / "mymodule.py").write_text(TINY_MODEL)
    env = env_with(KERAS_BACKEND=BACKEND, PYTHONPATH=str(ROOT))
    done = run("fit-check", "--model", "mymodule:build", "--device", "GPU:7",
               cwd=tmp_path, env=env)
    assert f"Keras backend: {BACKEND} (KERAS_BACKEND={BACKEND})" in done.stdout
    refused(done, "--device GPU:7", "host")


def test_fit_check_exit_1_is_the_model_function_failing(tmp_path):
    (tmp_path / "mymodule.py").write_text(TINY_MODEL)
    env = env_with(KERAS_BACKEND=BACKEND, PYTHONPATH=str(ROOT))
    done = run("fit-check", "--model", "mymodule:broken", cwd=tmp_path, env=env)
    assert done.returncode == 1, done.stderr
    assert "the user's own bug" in done.stderr  # its traceback is the user's
    assert "error: mymodule:broken raised" in done.stderr
