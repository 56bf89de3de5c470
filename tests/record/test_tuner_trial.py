"""The KerasTuner trial a fit runs in is found among its callers."""

import pytest

from keras_memwatch.record.tuner_trial import tuner_trial_id


def test_outside_a_trial_there_is_none():
    assert tuner_trial_id() is None


def test_a_trial_held_by_a_caller_names_it():
    keras_tuner = pytest.importorskip("keras_tuner")

    def run_trial(trial):  # as KerasTuner's Tuner.run_trial calls fit
        return fit()

    def fit():
        return tuner_trial_id()

    assert run_trial(keras_tuner.engine.trial.Trial(
        keras_tuner.HyperParameters(), trial_id="07")) == "07"
    assert fit() is None
