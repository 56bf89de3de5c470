"""Real estimates on the CPU, under the active backend: the model comes back
exactly, and nothing printed or stored is a negative figure."""

from __future__ import annotations

import re

from capacity_helpers import BACKEND, assert_same_state, conv_data, conv_model, state_of
from keras_memwatch.capacity import estimate_max_batch_size

NEGATIVE = re.compile(r"(?<![\w.])-\s?\d")  # "-23.0 MiB", "- 23 MiB"


def no_negative_figures(estimate):
    text = str(estimate)
    assert not NEGATIVE.search(text.replace("batch sizes 2-", "")), text
    assert "- " not in text.replace(" - ", "|"), text
    for key, value in estimate.to_dict().items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert value >= 0, (key, value)
    for batch, working in estimate.measurements:
        assert batch > 0 and working >= 0


def test_a_real_estimate_on_the_cpu_restores_the_model_and_explains_itself():
    model = conv_model()
    x, y = conv_data()
    model.train_on_batch(x[:8], y[:8])  # a model with a history to keep
    before = state_of(model)
    lines = []
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(8, 32, 128, 256),
                                       progress=lines.append)
    assert_same_state(before, state_of(model))
    assert estimate.device == "host" and estimate.backend == BACKEND
    assert lines, "progress was shown"
    no_negative_figures(estimate)
    assert "trial batches repeat the 32 samples given" in estimate.explanation
    if BACKEND == "jax" and estimate.predicted_batch_size is not None:
        # two methods on the CPU: the output says which one and why
        assert "Method:" in estimate.explanation
        assert estimate.alternatives and estimate.alternatives[0].reason


def test_a_line_through_zero_above_batch_0_prints_no_negative_constant():
    from keras_memwatch.capacity.fit import fit_linear

    # What TensorFlow's host RSS gave in issue 15: small sizes under-measured.
    mib = 2**20
    points = [(4096, int(4096 * 211.8 * 1024 - 23 * mib)),
              (8192, int(8192 * 211.8 * 1024 - 23 * mib)),
              (16384, int(16384 * 211.8 * 1024 - 23 * mib))]
    fit = fit_linear(points)
    assert fit.linear and fit.static_bytes < 0 and fit.constant_bytes == 0
    far = [(b, w - 400 * mib) for b, w in points]
    refused = fit_linear(far)
    assert not refused.linear and "reaches zero only at batch" in refused.reason
