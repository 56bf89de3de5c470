"""Investigation: can XLA's memory plan show JAX's per-step peaks?

JAX's allocator cannot reset its peak, so a recurring spike leaves no trace
in `memory_stats()`. XLA plans every compiled program's memory ahead of
time: `jax.jit(f).lower(...).compile().memory_analysis()` gives the
temporary, argument and output bytes per input shape, at no cost per step.
This script compiles a training step of the oversized-batch scenario's
convnet (the same ops as Keras's train step: forward, loss, gradients,
Adam update) for the small and the oversized batch, prints the plan, and
trains a few real steps of each size to compare with the allocator's
high-water mark. Run with KERAS_BACKEND=jax on a GPU.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.models import conv_stack  # noqa: E402

MIB = 2**20
SIDE = int(os.environ.get("PLAN_SIDE", "128"))


def build():
    return conv_stack(SIDE, 128, 4)


def plan(model, batch):
    """XLA's memory plan of one stateless training step at `batch`."""
    model.optimizer.build(model.trainable_variables)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    opt_vars = [v.value for v in model.optimizer.variables]
    loss_fn = model.loss

    def step(trainable, non_trainable, opt_vars, x, y):
        def loss(t):
            y_pred, nt = model.stateless_call(t, non_trainable, x, training=True)
            return loss_fn(y, y_pred), nt

        (value, nt), grads = jax.value_and_grad(loss, has_aux=True)(trainable)
        t, o = model.optimizer.stateless_apply(opt_vars, grads, trainable)
        return value, t, nt, o

    x = jax.ShapeDtypeStruct((batch, SIDE, SIDE, 3), "float32")
    y = jax.ShapeDtypeStruct((batch,), "int32")
    compiled = jax.jit(step, donate_argnums=(0, 2)).lower(
        trainable, non_trainable, opt_vars, x, y).compile()
    analysis = compiled.memory_analysis()
    return {k: getattr(analysis, k) // MIB for k in (
        "temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
        "generated_code_size_in_bytes") if hasattr(analysis, k)}


def measured(model, batch, device):
    x = np.random.default_rng(0).normal(size=(batch, SIDE, SIDE, 3)).astype("float32")
    y = np.zeros((batch,), "int32")
    model.train_on_batch(x, y)
    model.train_on_batch(x, y)
    return device.memory_stats()["peak_bytes_in_use"] // MIB


def main():
    device = jax.local_devices()[0]
    model = build()
    out = {"device": str(device)}
    for batch in (8, 128):
        out[f"plan_mib_batch_{batch}"] = plan(model, batch)
    for batch in (8, 128, 8, 128):
        out.setdefault("high_water_mib_after", []).append(
            [batch, measured(model, batch, device)])
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
