"""A row's checks as jobs in new processes: the job builds the row's change
from the model's config, as the user would; where jobs cannot check, one
warning says so and the checks train in the measuring process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import keras
import numpy as np

from conftest import tiny_gpt2
from keras_memwatch.measure.batches import Batches
from keras_memwatch.ways import ways_to_fit
from keras_memwatch.ways.fresh_job import FreshJobs, variant_for_job
from keras_memwatch.ways.variant import Setting

REMAT = (("mode", "full"),)


def saved():
    model, x, y = tiny_gpt2()
    fresh = FreshJobs(model, Batches(x, y))
    assert fresh._save() == ""
    return model, fresh


def test_a_job_builds_the_rows_change_from_the_models_config():
    model, fresh = saved()
    try:
        setting = Setting(policy="mixed_bfloat16", optimizer="sgd", accumulation=2,
                          remat=REMAT, sequence=8)
        job, data = variant_for_job(fresh.directory, setting)
        assert job is not model and type(job) is type(model)
        assert job.dtype_policy.name == "mixed_bfloat16"
        assert isinstance(job.optimizer, keras.optimizers.SGD)
        assert job.optimizer.gradient_accumulation_steps == 2
        assert not job.optimizer.built  # built by `fit`, as in a user's job
        assert data.x["token_ids"].shape == (4, 8) and data.y.shape == (4, 8)
        layers = list(job._flatten_layers(include_self=True, recursive=True))
        assert all(layer._remat_mode is not None for layer in layers)
        plain, _ = variant_for_job(fresh.directory, Setting())
        assert type(plain.optimizer) is type(model.optimizer)
        assert plain.dtype_policy.name == model.dtype_policy.name
    finally:
        fresh.close()
    assert fresh.directory is None


def test_a_job_trains_its_size_in_a_new_process_and_reports(tmp_path):
    _, fresh = saved()
    try:
        setting = json.dumps({"optimizer": "adafactor", "sequence": 8})
        done = subprocess.run(
            [sys.executable, "-m", "keras_memwatch.ways.fresh_job", fresh.directory,
             "4", str(2**30), "keras_hub", "--setting", setting],
            capture_output=True, text=True, timeout=600,
            env=dict(os.environ, KERAS_BACKEND=keras.backend.backend()))
    finally:
        fresh.close()
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}  # no GPU peak


def test_a_model_that_cannot_be_rebuilt_is_not_checked_by_jobs():
    class Subclassed(keras.Model):
        def __init__(self, width):
            super().__init__()
            self.dense = keras.layers.Dense(width)

        def call(self, x):
            return self.dense(x)

    model = Subclassed(4)
    model.compile(optimizer="adam", loss="mse")
    fresh = FreshJobs(model, Batches(np.ones((4, 3), "float32"),
                                     np.ones((4, 4), "float32")))
    assert "to be rebuilt" in fresh._save()
    assert fresh.directory is None


def test_on_the_host_one_warning_says_the_checks_train_here(caplog):
    model, x, y = tiny_gpt2()
    caplog.set_level(logging.WARNING, logger="keras_memwatch")
    table = ways_to_fit(model, x, y, batch_size=4, levers=["sgd_momentum"],
                        combinations=False, device="host", verbose=0,
                        fresh_process=True)
    said = [r.getMessage() for r in caplog.records if "fresh_process" in r.getMessage()]
    assert said == ["ways_to_fit: fresh_process=True, but only PyTorch on a GPU "
                    "under an allocator cap trains checks as jobs; the checks train "
                    "in this process"]
    assert table["lever"].tolist() == ["as is", "sgd_momentum"]
    assert table["need_bytes"].notna().all()


def test_each_rows_jobs_run_its_setting_under_the_cap_before_it_was_widened(
        monkeypatch):
    """Where jobs can check, a row's checks are jobs of its setting: the
    cap and the memory their peaks are read above are the variant alone's
    (the measuring process's, less what the cap was widened by for the
    user's state held beside it), and the files are written once a table."""
    from keras_memwatch.capacity.fresh_process import Jobs

    class GpuSteps:
        above_limit, limit, in_use = True, 8 * 2**30, 3 * 2**30
        limit_words = "a cap"
        device = type("Device", (), {"backend": "cpu", "gpu_index": 0})()

    asked = []
    monkeypatch.setattr(Jobs, "refusal", staticmethod(
        lambda steps, limit: asked.append(limit) or ("", 2)))
    model, x, y = tiny_gpt2()
    fresh = FreshJobs(model, Batches(x, y))
    try:
        sgd = fresh.around(GpuSteps(), Setting(optimizer="sgd"), widened=2**30)
        saved_in = fresh.directory
        plain = fresh.around(GpuSteps(), Setting(), widened=0)
        assert isinstance(sgd, Jobs) and isinstance(plain, Jobs)
        assert fresh.directory == saved_in and sorted(os.listdir(saved_in)) == [
            "batch.json", "batch.npz", "model.json"]
        assert asked == [7 * 2**30, 8 * 2**30]
        assert (sgd.job_limit, sgd.base, sgd.check_width) == (
            7 * 2**30, 2 * 2**30, 2)
        flag, setting = sgd.child.arguments
        assert flag == "--setting" and json.loads(setting)["optimizer"] == "sgd"
        assert sgd.child.module == "keras_memwatch.ways.fresh_job"
        sgd.close()  # a row's jobs leave the table's files
        assert os.path.isdir(saved_in)
    finally:
        fresh.close()
    assert not os.path.exists(saved_in)
