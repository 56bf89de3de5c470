"""`repeated`: a job's epoch of one batch, as `fit` takes it; `fit_steps`:
steps trained as `fit` trains them, awaited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_memwatch.measure.batches import repeated

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_an_epoch_is_the_same_batch_steps_times():
    x, y = np.ones((4, 3), "float32"), np.zeros((4,), "int32")
    epoch = repeated(x, y, steps=5)
    assert len(epoch) == 5
    assert all(epoch[i][0] is x and epoch[i][1] is y for i in range(5))


def test_without_targets_each_step_is_the_inputs_alone_packed_as_keras_packs_them():
    x = np.ones((4, 3), "float32")
    epoch = repeated(x, None, steps=2)
    assert epoch[0] == (x,) and epoch[1][0] is x


FIT_STEPS_CHILD = textwrap.dedent("""
    import json, resource
    import numpy as np
    import keras
    from keras_memwatch.measure.batches import fit_steps

    model = keras.Sequential([
        keras.Input((64, 64, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer="adam", loss="mse")
    fit_steps(model, (np.ones((8, 64, 64, 1), "float32"), np.ones((8, 1), "float32")), 1)

    def vm():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize"):
                    return int(line.split()[1]) * 1024

    # a step of 2000 samples needs about 5 GiB of activations
    big = (np.ones((2000, 64, 64, 1), "float32"), np.ones((2000, 1), "float32"))
    resource.setrlimit(resource.RLIMIT_AS, (vm() + 768 * 2**20, resource.RLIM_INFINITY))
    try:
        fit_steps(model, big, 1)
        print(json.dumps({"raised": None}))
    except Exception as e:
        print(json.dumps({"raised": type(e).__name__, "text": str(e)[:200]}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")
@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="JAX alone defers a step's failure to its results")
def test_a_step_out_of_memory_raises_from_fit_steps_though_jax_defers_it(tmp_path):
    """JAX reports an allocation that fails inside a step only when the
    step's results are awaited; `fit` returns without awaiting them, and
    `fit_steps` awaits them, so a size that does not fit never reads as
    one that ran."""
    (tmp_path / "child.py").write_text(FIT_STEPS_CHILD)
    env = dict(os.environ, KERAS_BACKEND="jax",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(tmp_path / "child.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["raised"] == "JaxRuntimeError", result
    assert "RESOURCE_EXHAUSTED" in result["text"]
