"""A watched call's end: a step that ran out of memory is never silent."""

from __future__ import annotations

import sys

import keras
import pytest

from conftest import run_out_of_memory_child


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc")
@pytest.mark.skipif(keras.backend.backend() != "jax",
                    reason="JAX alone defers a step's failure to its results")
def test_a_step_out_of_memory_that_fit_does_not_raise_is_logged_as_an_error(tmp_path):
    """Keras's `fit` on JAX returns normally when a step runs out of memory
    and nothing awaits its results (it drops the logs it cannot read); the
    watch says so at train end, once, and only then."""
    result = run_out_of_memory_child(tmp_path, """
        from keras_memwatch import MemWatch

        errors = []

        class Errors(logging.Handler):
            def emit(self, record):
                if record.levelno >= logging.ERROR:
                    errors.append(record.getMessage())

        logging.getLogger("keras_memwatch").addHandler(Errors())
        model.fit(*small, verbose=0, callbacks=[MemWatch(probes="host", verbose=0)])
        fitted = len(errors)
        cap_address_space()
        try:
            model.fit(*big, batch_size=2000, verbose=0,
                      callbacks=[MemWatch(probes="host", verbose=0)])
            raised = None
        except Exception as e:
            raised = type(e).__name__
        print(json.dumps({"raised": raised, "errors": errors,
                          "after_fit_that_ran": fitted}))
    """)
    assert result["raised"] is None, result  # Keras's own behaviour
    assert result["after_fit_that_ran"] == 0
    assert len(result["errors"]) == 1, result
    assert "ran out of memory, and `fit` returned without raising it" in \
        result["errors"][0]
    assert "RESOURCE_EXHAUSTED" in result["errors"][0]
