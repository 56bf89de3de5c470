"""Training a size in a new process, as a job started at it would."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from capacity_helpers import BACKEND, GIB, OutOfMemoryError, tiny
from keras_memwatch.capacity import fresh_process
from keras_memwatch.capacity.batches import Batches
from keras_memwatch.capacity.fresh_process import (
    EXIT_OOM,
    JOB_EPOCHS,
    JOB_STEPS,
    FreshProcessError,
    FreshProcessSteps,
    train_fresh,
)


def prepared(model, x, y, lines=None, limit=4 * GIB):
    trials = []
    steps, why = FreshProcessSteps.prepare(
        model, Batches(x, y), limit, 0, trials,
        (lines if lines is not None else []).append)
    assert why == "" and steps is not None
    return steps, trials


def test_a_new_process_loads_the_model_and_trains_the_size():
    model, x, y = tiny()
    lines = []
    steps, trials = prepared(model, x, y, lines)
    try:
        assert sorted(os.listdir(steps.directory)) == [
            "batch.json", "batch.npz", "model.keras"]
        assert steps.run(24, "boundary") is True  # the batch repeated to 24
    finally:
        steps.close()
    assert not os.path.exists(steps.directory)
    trial, = trials
    assert (trial.batch_size, trial.ran, trial.purpose, trial.fresh_process) == (
        24, True, "boundary", True)
    assert trial.seconds > 0
    assert "trained batch 24 in a new process (boundary" in lines[0]


def fake_child(monkeypatch, returncode, stdout="", stderr=""):
    def run(args, **kwargs):
        assert args[1:3] == ["-m", "keras_memwatch.capacity.fresh_process"]
        assert kwargs["env"]["KERAS_BACKEND"] == BACKEND
        return subprocess.CompletedProcess(args, returncode, stdout, stderr)

    monkeypatch.setattr(fresh_process.subprocess, "run", run)


def test_the_batch_goes_to_the_child_as_arrays_and_their_nesting(tmp_path):
    x = {"tokens": np.arange(12).reshape(4, 3), "mask": np.ones((4, 3), bool)}
    y = (np.zeros(4, "int32"), np.ones((4, 2), "float32"))
    fresh_process.save_batch(str(tmp_path), x, y)
    x2, y2 = fresh_process.load_batch(str(tmp_path))
    assert set(x2) == {"tokens", "mask"}
    np.testing.assert_array_equal(x2["tokens"], x["tokens"])
    assert x2["mask"].dtype == bool
    assert [a.dtype for a in y2] == [np.int32, np.float32]
    fresh_process.save_batch(str(tmp_path), x["tokens"], None)
    assert fresh_process.load_batch(str(tmp_path))[1] is None


def test_a_child_out_of_memory_is_a_size_that_did_not_run(monkeypatch):
    model, x, y = tiny()
    steps, trials = prepared(model, x, y)
    fake_child(monkeypatch, EXIT_OOM, '{"error": "OutOfMemoryError"}\n')
    try:
        assert steps.run(900, "boundary") is False
    finally:
        steps.close()
    assert (trials[0].ran, trials[0].error) == (False, "OutOfMemoryError")


def test_a_child_that_fails_otherwise_says_why(monkeypatch):
    model, x, y = tiny()
    steps, trials = prepared(model, x, y)
    fake_child(monkeypatch, 1, "", "Traceback ...\nTypeError: Could not locate "
               "class 'MyLayer'\n")
    try:
        with pytest.raises(FreshProcessError, match="exited 1 .*MyLayer"):
            steps.run(64, "boundary")
    finally:
        steps.close()
    assert trials == []


def test_the_child_reports_out_of_memory_and_raises_anything_else(
        tmp_path, monkeypatch):
    _, x, y = tiny()
    fresh_process.save_batch(str(tmp_path), x, y)

    class Model:
        error = OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        def fit(self, steps, epochs, **kwargs):
            # as a job trains: epochs of many steps of the batch
            assert (len(steps), epochs) == (JOB_STEPS, JOB_EPOCHS)
            x, y = steps[JOB_STEPS - 1]
            assert len(x) == len(y) == 16
            raise self.error

    import keras

    monkeypatch.setattr(keras.saving, "load_model", lambda path: Model())
    assert train_fresh(str(tmp_path), 16, 4 * GIB) == (
        EXIT_OOM, {"error": "OutOfMemoryError"})
    Model.error = ValueError("a bug")
    with pytest.raises(ValueError, match="a bug"):
        train_fresh(str(tmp_path), 16, 4 * GIB)


def test_a_model_keras_cannot_save_starts_no_process(monkeypatch, tmp_path):
    model, x, y = tiny()
    monkeypatch.setattr(fresh_process.tempfile, "mkdtemp",
                        lambda prefix: str(tmp_path / "saved"))
    os.mkdir(tmp_path / "saved")

    def refuse(path):
        raise TypeError("cannot serialize a lambda")

    monkeypatch.setattr(model, "save", refuse)
    steps, why = FreshProcessSteps.prepare(model, Batches(x, y), 4 * GIB, 0, [],
                                           print)
    assert steps is None
    assert why.startswith("the model could not be saved for a new process")
    assert not os.path.exists(tmp_path / "saved")


def test_the_child_sees_the_measured_device_as_its_first(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert fresh_process._child_env(1)["CUDA_VISIBLE_DEVICES"] == "5"
    assert fresh_process._child_env(0)["CUDA_VISIBLE_DEVICES"] == "4,5"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert fresh_process._child_env(2)["CUDA_VISIBLE_DEVICES"] == "2"
