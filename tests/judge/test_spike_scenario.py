"""End to end on the CPU: oversized batches are flagged, the others are not.

The scenario (tests/scenarios/oversized_batches.py) runs in a fresh process
so that TensorFlow can be started with oneDNN off: its CPU allocator keeps
freed memory, so with oneDNN on only the first oversized batch would show.
"""

import json
import os
import subprocess
import sys

import keras

SCENARIO = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scenarios", "oversized_batches.py")


def test_default_memwatch_flags_exactly_the_oversized_batches():
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend(),
               TF_ENABLE_ONEDNN_OPTS="0", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, SCENARIO], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["oversized"] == [14, 29, 44]
    assert result["flagged"] == result["oversized"], result["working_mib"]
