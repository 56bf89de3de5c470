"""The README's first screen holds for a new user (issue 16): its first
command picks a backend that it installs, a user's own script with MemWatch
then runs in that shell, and the memory-settings example shows what it did."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import pytest

from conftest import hidden_framework

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def first_command() -> str:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return block.splitlines()[0]


def test_the_first_screen_says_what_it_is_before_any_command():
    before = README.split("```bash", 1)[0]
    assert "is a Keras 3 callback" in before


def test_the_first_command_sets_the_backend_it_installs():
    command = first_command()
    backend = re.match(r"export KERAS_BACKEND=(\w+) && ", command).group(1)
    assert f'pip install ".[{backend},' in command


def test_a_users_script_runs_after_the_first_command(tmp_path):
    backend = re.match(r"export KERAS_BACKEND=(\w+)", first_command()).group(1)
    if keras.backend.backend() != backend:
        pytest.skip(f"runs once, under KERAS_BACKEND={backend}")
    # What `pip install ".[jax,plot]"` leaves: no TensorFlow, no PyTorch.
    others = [hidden_framework(tmp_path / b, b) for b in ("tensorflow", "jax", "torch")
              if b != backend]
    script = tmp_path / "mine.py"
    script.write_text(textwrap.dedent("""
        import keras
        import numpy as np
        from keras_memwatch import MemWatch

        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        model.compile(optimizer="adam", loss="mse")
        watch = MemWatch()
        model.fit(np.zeros((64, 8)), np.zeros((64, 4)), batch_size=16,
                  callbacks=[watch], verbose=0)
        print(keras.backend.backend(), len(watch.to_dataframe()))
    """))
    env = dict(os.environ, KERAS_BACKEND=backend,
               PYTHONPATH=os.pathsep.join([*others, str(ROOT)]))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [backend, "5"]  # train begin + 4 batches


def test_the_memory_settings_example_shows_what_it_did():
    block = README.split("## Memory settings", 1)[1]
    code = re.search(r"```python\n(.*?)```", block, re.S).group(1)
    lines = code.strip().splitlines()
    assert all(line.startswith("print(keras_memwatch.configure_memory(")
               for line in lines[1:])
    # A script's first thing: the import and the first call (on this CPU
    # machine there is nothing to apply, and it says so).
    done = subprocess.run([sys.executable, "-c", "\n".join(lines[:2])], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(
        f"keras_memwatch memory configuration (backend: {keras.backend.backend()})")
