"""A watched call's end: a step that ran out of memory is never silent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import keras
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = textwrap.dedent("""
    import json, logging, resource
    import numpy as np
    import keras
    from keras_memwatch import MemWatch

    errors = []

    class Errors(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.ERROR:
                errors.append(record.getMessage())

    logging.getLogger("keras_memwatch").addHandler(Errors())
    model = keras.Sequential([
        keras.Input((64, 64, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((8, 64, 64, 1), "float32"), np.ones((8, 1), "float32"),
              verbose=0, callbacks=[MemWatch(probes="host", verbose=0)])
    fitted = len(errors)

    def vm():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize"):
                    return int(line.split()[1]) * 1024

    # a step of 2000 samples needs about 5 GiB of activations
    big = (np.ones((2000, 64, 64, 1), "float32"), np.ones((2000, 1), "float32"))
    resource.setrlimit(resource.RLIMIT_AS, (vm() + 768 * 2**20, resource.RLIM_INFINITY))
    try:
        model.fit(*big, batch_size=2000, verbose=0,
                  callbacks=[MemWatch(probes="host", verbose=0)])
        raised = None
    except Exception as e:
        raised = type(e).__name__
    print(json.dumps({"raised": raised, "errors": errors, "after_fit_that_ran": fitted}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")
@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="JAX alone defers a step's failure to its results")
def test_a_step_out_of_memory_that_fit_does_not_raise_is_logged_as_an_error(tmp_path):
    """Keras's `fit` on JAX returns normally when a step runs out of memory
    and nothing awaits its results (it drops the logs it cannot read); the
    watch says so at train end, once, and only then."""
    (tmp_path / "child.py").write_text(CHILD)
    env = dict(os.environ, KERAS_BACKEND="jax",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(tmp_path / "child.py")], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["raised"] is None, result  # Keras's own behaviour
    assert result["after_fit_that_ran"] == 0
    assert len(result["errors"]) == 1, result
    assert "ran out of memory, and `fit` returned without raising it" in \
        result["errors"][0]
    assert "RESOURCE_EXHAUSTED" in result["errors"][0]
