"""keras_memwatch.capacity as a package: its public names, and no framework
imported until a function runs. Its modules are tested in tests/capacity/."""

from __future__ import annotations

import os
import subprocess
import sys

from keras_memwatch import capacity
from keras_memwatch.capacity import CapacityEstimate, estimate_max_batch_size

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_module_imports_no_framework():
    code = ("import sys, keras_memwatch.capacity, keras_memwatch.cli.fit_check, "
            "keras_memwatch.explain.guard; "
            "print(sorted(m for m in ('keras', 'jax', 'torch', 'tensorflow') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


def test_package_exports_the_estimator():
    import keras_memwatch

    assert "estimate_max_batch_size" in keras_memwatch.__all__
    assert keras_memwatch.estimate_max_batch_size is estimate_max_batch_size
    assert keras_memwatch.CapacityEstimate is CapacityEstimate


def test_public_names():
    assert set(capacity.__all__) >= {"estimate_max_batch_size", "CapacityEstimate"}
