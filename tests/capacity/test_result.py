"""CapacityEstimate: a frozen result, its text, dict and frame."""

from __future__ import annotations

import dataclasses
import json

import pytest

from keras_memwatch.capacity import LIMIT_ALLOCATOR, CapacityEstimate, sizes_text

MIB = 2**20
GIB = 2**30


def test_result_object():
    estimate = CapacityEstimate(
        predicted_batch_size=1000, static_bytes=GIB, per_sample_bytes=8 * MIB,
        limit_bytes=10 * GIB, limit_source=LIMIT_ALLOCATOR,
        measurements=((2, 16 * MIB), (4, 32 * MIB), (8, 64 * MIB)), residual=0.0,
        explanation="one line", headroom=0.1, in_use_bytes=GIB, step_static_bytes=0,
        r_squared=1.0, fit_batch_sizes=(2, 4, 8), device="GPU:0", backend="jax",
        method="xla", measured_by="XLA memory plan")
    with pytest.raises(dataclasses.FrozenInstanceError):
        estimate.predicted_batch_size = 3
    assert estimate.batch_size_for(0.0) == (10 * GIB - GIB) // (8 * MIB)
    with pytest.raises(ValueError):
        estimate.batch_size_for(1.0)
    text = str(estimate)
    assert "Largest batch that fits: 1000" in text
    assert "GPU allocator limit" in text and "8.0 MiB" in text and "one line" in text
    as_dict = estimate.to_dict()
    assert as_dict["measurements"] == [[2, 16 * MIB], [4, 32 * MIB], [8, 64 * MIB]]
    assert json.loads(json.dumps(as_dict)) == as_dict
    frame = estimate.to_dataframe()
    assert frame["batch_size"].tolist() == [2, 4, 8]
    assert frame["fitted_bytes"].tolist() == [16 * MIB, 32 * MIB, 64 * MIB]
    assert frame["in_fit"].all()


def test_sizes_text():
    assert sizes_text([2, 4, 8]) == "2, 4, 8"
    assert sizes_text(()) == "none"
