"""What an estimate shows while it runs: `verbose` as `fit` has it, and
`progress=` receiving every line per size whatever `verbose` says."""

from __future__ import annotations

import sys

import keras
import numpy as np
import pytest

from keras_memwatch.capacity import estimate_max_batch_size
from keras_memwatch.capacity.progress import Progress, display_mode


def dense_model():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def data():
    return np.zeros((8, 16), "float32"), np.zeros((8, 1), "float32")


def test_auto_draws_a_bar_on_a_terminal_or_a_notebook_and_lines_elsewhere(monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert display_mode("auto") == 2
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert display_mode("auto") == 1
    assert display_mode(0) == 0 and display_mode(2) == 2


def test_silent_shows_nothing_and_hands_every_line_to_progress(capsys):
    lines = []
    estimate = estimate_max_batch_size(dense_model(), *data(), trial_sizes=(64, 512, 4096),
                                       verbose=0, progress=lines.append)
    assert capsys.readouterr().out == ""
    assert len(lines) == len(estimate.evidence.observations) == 3


def test_line_mode_prints_one_line_per_round(capsys):
    lines = []
    estimate = estimate_max_batch_size(dense_model(), *data(), trial_sizes=(64, 512, 4096),
                                       verbose=2, progress=lines.append)
    out = capsys.readouterr().out.splitlines()
    rounds = [line for line in out if line.startswith("estimate_max_batch_size: round")]
    assert len(rounds) == 3 == len(out)  # one size a round on the host
    assert "round 3 (ladder): batch 4096" in rounds[-1]
    best = estimate.predicted_batch_size
    assert f"best answer so far {'-' if best is None else best}" in rounds[-1]
    assert len(lines) == 3  # progress= still gets every line per size


def test_the_bar_shows_rounds_sizes_and_the_best_answer(capsys):
    shown = Progress(1, None)
    shown.round("ladder", [1, 2, 4, 8], None)
    shown.round("check", [30, 31], 30)
    shown.done(30)
    out = capsys.readouterr().out
    assert "sizes: 6" in out and "best: 30" in out


def test_verbose_zero_with_no_callback_logs_at_info(caplog, capsys):
    with caplog.at_level("INFO", logger="keras_memwatch"):
        estimate_max_batch_size(dense_model(), *data(), trial_sizes=(2, 4), verbose=0)
    assert "estimate_max_batch_size: batch 2" in caplog.text
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("value, error", [(3, ValueError), ("loud", ValueError),
                                          (1.5, TypeError), (None, TypeError)])
def test_a_bad_verbose_is_refused(value, error):
    with pytest.raises(error, match="Expected `verbose` to be"):
        estimate_max_batch_size(dense_model(), *data(), verbose=value)

