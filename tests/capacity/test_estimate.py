"""estimate_max_batch_size on scripted GPU readings, and its argument checks."""

from __future__ import annotations

import functools

import keras
import pytest

from capacity_helpers import BACKEND, GIB, MIB, simulate_gpu, tiny
from keras_memwatch.capacity import LIMIT_ALLOCATOR, estimate_max_batch_size


@pytest.fixture
def simulated(monkeypatch):
    """Puts a simulated GPU under a model (see `simulate_gpu`)."""
    return functools.partial(simulate_gpu, monkeypatch)


def test_prediction_from_simulated_gpu_readings(simulated):
    model, x, y = tiny()
    gpu = simulated(model, name=BACKEND)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8, 16),
                                       method="probes")
    assert estimate.device == "GPU:0"
    assert estimate.limit_bytes == 16 * GIB and estimate.limit_source == LIMIT_ALLOCATOR
    assert estimate.measurements == tuple(
        (b, 64 * MIB + 10 * MIB * b) for b in (2, 4, 8, 16))
    assert estimate.in_use_bytes == GIB
    assert estimate.static_bytes == GIB + 64 * MIB
    assert estimate.per_sample_bytes == pytest.approx(10 * MIB)
    expected = int((16 * GIB * 0.9 - GIB - 64 * MIB) // (10 * MIB))
    assert estimate.predicted_batch_size == expected
    assert estimate.batch_size_for(0.0) == int((15 * GIB - 64 * MIB) // (10 * MIB))
    assert "GPU allocator limit" in estimate.explanation
    assert f"Largest batch {expected}" in estimate.explanation
    # two steps per size, then the confirmation on the device, two steps a
    # size: the largest batch under the whole limit (1529 ran, 1545 and 1537
    # did not), and the answer
    ceiling = int((15 * GIB - 64 * MIB) // (10 * MIB))
    assert gpu.batches == [2, 2, 4, 4, 8, 8, 16, 16, ceiling, ceiling, expected,
                           expected]
    assert gpu.ooms == [1545, 1537]
    assert estimate.ceiling_batch_size == ceiling
    assert [(t.batch_size, t.ran, t.purpose) for t in estimate.trials] == [
        (ceiling, True, "boundary"), (1545, False, "boundary"),
        (1537, False, "boundary"), (expected, True, "recommended")]
    assert f"batch {ceiling} ran, 1537 ran out of memory" in estimate.explanation
    assert (f"Recommended batch {expected} (under 10% headroom) trained 2 real "
            "steps" in estimate.explanation)
    assert estimate.seconds > 0


def test_bad_arguments():
    model, x, y = tiny()
    with pytest.raises(ValueError, match="headroom"):
        estimate_max_batch_size(model, x, y, headroom=1.0)
    with pytest.raises(ValueError, match="trial_sizes"):
        estimate_max_batch_size(model, x, y, trial_sizes=(4, 4, 8))
    with pytest.raises(ValueError, match="method"):
        estimate_max_batch_size(model, x, y, method="guess")
    with pytest.raises(ValueError, match="device"):
        estimate_max_batch_size(model, x, y, device="tpu:0", trial_sizes=(2, 4, 8))
    with pytest.raises(ValueError, match="same"):
        estimate_max_batch_size(model, x, y[:3], trial_sizes=(2, 4, 8))
    uncompiled = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="compiled"):
        estimate_max_batch_size(uncompiled, x, y)
