"""`repeated`: a job's epoch of one batch, as `fit` takes it; `fit_steps`:
steps trained as `fit` trains them, awaited."""

from __future__ import annotations

import sys

import keras
import numpy as np
import pytest

from keras_memwatch.measure.batches import repeated

from conftest import run_out_of_memory_child


def test_an_epoch_is_the_same_batch_steps_times():
    x, y = np.ones((4, 3), "float32"), np.zeros((4,), "int32")
    epoch = repeated(x, y, steps=5)
    assert len(epoch) == 5
    assert all(epoch[i][0] is x and epoch[i][1] is y for i in range(5))


def test_without_targets_each_step_is_the_inputs_alone_packed_as_keras_packs_them():
    x = np.ones((4, 3), "float32")
    epoch = repeated(x, None, steps=2)
    assert epoch[0] == (x,) and epoch[1][0] is x



@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")
@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="JAX alone defers a step's failure to its results")
def test_a_step_out_of_memory_raises_from_fit_steps_though_jax_defers_it(tmp_path):
    """JAX reports an allocation that fails inside a step only when the
    step's results are awaited; `fit` returns without awaiting them, and
    `fit_steps` awaits them, so a size that does not fit never reads as
    one that ran."""
    result = run_out_of_memory_child(tmp_path, """
        from keras_memwatch.measure.batches import fit_steps

        fit_steps(model, small, 1)
        cap_address_space()
        try:
            fit_steps(model, big, 1)
            print(json.dumps({"raised": None}))
        except Exception as e:
            print(json.dumps({"raised": type(e).__name__, "text": str(e)[:200]}))
    """)
    assert result["raised"] == "JaxRuntimeError", result
    assert "RESOURCE_EXHAUSTED" in result["text"]
