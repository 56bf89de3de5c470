"""Real estimates on the CPU put the model's training state back bit for bit."""

from __future__ import annotations

import keras

from capacity_helpers import (
    BACKEND,
    MIB,
    assert_same_state,
    conv_data,
    conv_model,
    state_of,
)
from keras_memwatch.capacity import LIMIT_HOST, estimate_max_batch_size


def test_real_estimate_on_the_cpu_keeps_the_model_bit_for_bit():
    model = conv_model()
    x, y = conv_data()
    model.train_on_batch(x[:8], y[:8])  # a model already trained a little
    before = state_of(model)
    grads = [getattr(v.value, "grad", None) for v in model.trainable_variables]
    iterations = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(16, 32, 64, 128))
    assert_same_state(before, state_of(model))
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == iterations
    assert estimate.device == "host" and estimate.limit_source == LIMIT_HOST
    assert [b for b, _ in estimate.measurements] == [16, 32, 64, 128]
    assert estimate.in_use_bytes > 50 * MIB
    assert "host available memory" in estimate.explanation
    assert "a CPU has no allocator limit" in estimate.explanation
    if estimate.predicted_batch_size is None:  # host RSS can be noisy
        assert "No prediction" in estimate.explanation
    else:
        # activations of two 32x32x16 conv layers: at least 100 KiB a sample
        assert estimate.per_sample_bytes > 100 * 1024
        assert estimate.predicted_batch_size > 128
    if BACKEND == "torch":  # the .grad tensors a step leaves are the user's again
        assert all(getattr(v.value, "grad", None) is g
                   for v, g in zip(model.trainable_variables, grads))


def test_training_after_an_estimate_equals_training_without():
    x, y = conv_data()
    estimated, untouched = conv_model(), conv_model()
    untouched.set_weights(estimated.get_weights())
    estimate_max_batch_size(estimated, x, y, trial_sizes=(4, 8, 16))
    for model in (estimated, untouched):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert_same_state(state_of(untouched), state_of(estimated), paths=False)
