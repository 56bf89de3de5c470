"""The line through (batch size, working memory), and its prediction."""

from __future__ import annotations

import pytest

from keras_memwatch.capacity import fit_linear, predict_batch_size

MIB = 2**20
GIB = 2**30


def test_fit_recovers_static_and_per_sample_exactly():
    points = [(b, 300 * MIB + 7 * MIB * b) for b in (2, 4, 8, 16, 32)]
    fit = fit_linear(points)
    assert fit.linear and fit.reason is None
    assert fit.static_bytes == pytest.approx(300 * MIB, abs=1)
    assert fit.per_sample_bytes == pytest.approx(7 * MIB, rel=1e-12)
    assert fit.residual == pytest.approx(0, abs=1e-9)
    assert fit.r_squared == pytest.approx(1.0)
    assert fit.batch_sizes == (2, 4, 8, 16, 32)


def test_fit_refuses_quadratic_memory():
    points = [(b, MIB * b * b) for b in (2, 4, 8, 16, 32)]
    fit = fit_linear(points)
    assert not fit.linear
    assert "not linear" in fit.reason


def test_fit_drops_small_sizes_dominated_by_a_constant():
    # Gradients of the weights (20 MiB) hide the activations at small sizes.
    points = [(b, max(20 * MIB, 33_000 * b)) for b in (2, 16, 128, 1024, 2048, 4096)]
    fit = fit_linear(points)
    assert fit.linear
    assert fit.batch_sizes[0] >= 1024
    assert fit.per_sample_bytes == pytest.approx(33_000, rel=1e-6)


def test_fit_needs_three_sizes_and_growth():
    fit = fit_linear([(2, MIB), (4, 2 * MIB)])
    assert not fit.linear and "three" in fit.reason
    flat = fit_linear([(2, 50 * MIB), (4, 50 * MIB), (8, 50 * MIB)])
    assert not flat.linear and "does not grow" in flat.reason


def test_fit_averages_repeated_sizes():
    fit = fit_linear([(2, 10), (2, 14), (4, 22), (8, 42)])
    assert fit.batch_sizes == (2, 4, 8)
    assert fit.per_sample_bytes == pytest.approx(5.0)


def test_predict_batch_size_arithmetic():
    expected = (9 * GIB - GIB) // (8 * MIB)
    assert predict_batch_size(10 * GIB, 0.1, 1 * GIB, 8 * MIB) == expected
    assert predict_batch_size(GIB, 0.0, 2 * GIB, MIB) == 0
    with pytest.raises(ValueError):
        predict_batch_size(GIB, 0.0, 0, 0)
