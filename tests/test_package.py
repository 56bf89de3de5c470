"""Importing the package does nothing heavy."""

import json
import os
import subprocess
import sys

CHECK = """
import json, sys
before = set(sys.modules)
import keras_memwatch
after_package = sorted(set(sys.modules) - before)
import keras
with_keras = set(sys.modules)
from keras_memwatch import MemWatch
print(json.dumps({"package": after_package,
                  "beyond_keras": sorted(set(sys.modules) - with_keras)}))
"""

HEAVY = ("keras", "tensorflow", "jax", "torch", "pynvml", "matplotlib", "pandas")


def test_import_initialises_nothing_and_memwatch_adds_no_framework():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [m for m in result["package"] if m.split(".")[0] in HEAVY] == []
    assert [m for m in result["beyond_keras"]
            if m.split(".")[0] in ("tensorflow", "jax", "torch", "pynvml", "matplotlib")] == []
