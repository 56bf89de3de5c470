"""The job a fresh process trains for a check: a size that runs out of
memory is reported so, on every backend."""

from __future__ import annotations

import sys

import keras
import pytest

from conftest import run_out_of_memory_child


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")
@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="JAX alone defers a step's failure to its results")
def test_a_job_whose_steps_run_out_of_memory_exits_as_out_of_memory(tmp_path):
    """`fit` on JAX returns over a step that ran out of memory; the job
    awaits its steps, so the check reads the size as failed."""
    result = run_out_of_memory_child(tmp_path, """
        from keras_memwatch.capacity import fresh_process

        model.save("model.keras")
        fresh_process.save_batch(".", *small)
        status, report = fresh_process.train_fresh(".", 8, 2**30)
        cap_address_space()
        failed, failed_report = fresh_process.train_fresh(".", 2000, 2**30)
        print(json.dumps({"ran": [status, report],
                          "out": [failed, failed_report],
                          "oom": fresh_process.EXIT_OOM}))
    """)
    assert result["ran"] == [0, {}], result
    assert result["out"][0] == result["oom"], result
