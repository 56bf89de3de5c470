"""The rooms whose contracts other rooms lean on pass a type checker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["keras_memwatch/record", "keras_memwatch/session", "keras_memwatch/capacity"]


@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="the types do not depend on the backend: checked once, "
                           "under KERAS_BACKEND=jax")
def test_mypy_passes_on_the_typed_rooms():
    pytest.importorskip("mypy", reason="mypy is in the test extra")
    done = subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent",
                           *CHECKED], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-4000:]
