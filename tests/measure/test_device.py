"""The device an estimate measures: a step's need, read where it is true."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_memwatch.measure import device as D
from keras_memwatch.measure.batches import Batches, fit_steps


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="TensorFlow's CPU allocator")
def test_on_the_host_a_pooling_tensorflow_allocator_gives_each_steps_need():
    """TensorFlow's CPU allocator (oneDNN builds) keeps what it frees, so
    the resident set stays where the largest step left it; its own peak
    still follows each step, a large one after a smaller one and again."""
    if not D.tensorflow_cpu_pool():
        pytest.skip("this TensorFlow's CPU allocator keeps no statistics")
    # activations (16 KiB a sample) far above the weights (1 MiB)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(4096),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    data = Batches(rng.normal(size=(8, 64)).astype("float32"),
                   rng.normal(size=(8, 1)).astype("float32"))
    device = D.Device("tensorflow", "host")
    try:
        assert device.peak_words == "TensorFlow's CPU allocator's peak"
        in_use = device.in_use()
        needs = []
        for size in (2048, 128, 2048):
            batch = data.take(size)
            fit_steps(model, batch, 1)  # traces at this shape
            device.read()
            fit_steps(model, batch, 1)
            needs.append(device.need(in_use))
    finally:
        device.close()
    hidden = 2048 * 4096 * 4  # the hidden layer's output, float32
    first, small, again = needs
    # The order TensorFlow's threads run the backward ops in decides whether
    # the hidden output is freed before its gradient is made: a step needs
    # one or two of them (about 34.5 or 65 MiB), and which can change from
    # one step to the next (docs/capacity.md).
    # A pooled allocator read by the resident set would give the second
    # large step next to nothing.
    assert hidden <= first < 3 * hidden
    assert hidden <= again < 3 * hidden
    assert small < hidden / 2
