"""An estimate's record kept beside JAX's compilation cache: a second
estimate of the same step under the same limit starts from it and asks
nothing again; another step, another limit or a damaged file is never
read as this one."""

from __future__ import annotations

import json
import logging

import keras
import numpy as np
import pytest

from capacity_helpers import BACKEND
from keras_memwatch.capacity import stored_record
from keras_memwatch.capacity.evidence import AIMED, PLAN, Observation

RECORD = [Observation(1, 100, AIMED, ladder=True, seconds=0.5),
          Observation(2, 180, AIMED, ladder=True),
          Observation(40, None, PLAN, ran=False)]


def test_a_fingerprint_names_the_program_the_limit_and_what_else_decides():
    key = stored_record.fingerprint("module @step", 8 << 30, jax="0.11")
    assert key == stored_record.fingerprint("module @step", 8 << 30, jax="0.11")
    assert key != stored_record.fingerprint("module @other", 8 << 30, jax="0.11")
    assert key != stored_record.fingerprint("module @step", 6 << 30, jax="0.11")
    assert key != stored_record.fingerprint("module @step", 8 << 30, jax="0.12")


def test_a_record_is_read_back_as_it_was_written(tmp_path):
    path = stored_record.save(str(tmp_path), "k", RECORD, "batch 40 ran out of memory")
    assert path is not None and path.startswith(str(tmp_path / stored_record.FOLDER))
    assert stored_record.load(str(tmp_path), "k") == (RECORD, "batch 40 ran out of memory")
    assert stored_record.load(str(tmp_path), "another").observations == []
    assert stored_record.load(None, "k").observations == []


@pytest.mark.parametrize("text", ["{not json", json.dumps({"rows": []}),
                                  json.dumps({"observations": [
                                      {"batch_size": 1, "need_bytes": 1,
                                       "how": "guess"}]})])
def test_a_damaged_record_is_skipped_with_a_warning(tmp_path, caplog, text):
    folder = tmp_path / stored_record.FOLDER
    folder.mkdir()
    (folder / "k.json").write_text(text)
    with caplog.at_level(logging.WARNING, "keras_memwatch"):
        assert stored_record.load(str(tmp_path), "k").observations == []
    assert "cannot be read" in caplog.text


def test_a_record_that_cannot_be_written_warns_and_returns_none(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING, "keras_memwatch"):
        assert stored_record.save(str(blocked), "k", RECORD) is None
    assert "cannot be stored" in caplog.text


def _model(optimizer="adam"):
    model = keras.Sequential([keras.Input((16,)),
                              keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's plans: JAX")
def test_a_second_estimate_starts_from_the_first_and_asks_nothing(jax_config, tmp_path):
    from keras_memwatch.capacity import estimate_max_batch_size

    x, y = np.zeros((8, 16), "float32"), np.zeros((8, 1), "float32")
    cache = str(tmp_path / "cache")

    def estimate(model):
        lines = []
        est = estimate_max_batch_size(model, x, y, method="xla",
                                      compilation_cache=cache, verbose=0,
                                      progress=lines.append)
        return est, lines

    first, _ = estimate(_model())
    assert first.stored == 0
    assert list((tmp_path / "cache" / stored_record.FOLDER).glob("*.json"))
    second, lines = estimate(_model())
    assert second.stored == len(first.evidence.observations)
    assert second.evidence.observations == first.evidence.observations
    assert second.stopped == first.stopped  # why the ladder stopped, kept
    assert not any("compiled the step" in line for line in lines)
    assert "from an earlier estimate" in second.explanation
    # another optimizer is another step: measured afresh
    third, _ = estimate(_model(optimizer="sgd"))
    assert third.stored == 0
