"""Which layer holds a step's memory, on the seed model (issue 40).

Builds a convnet of 1024-channel layers (input 64x64x3, batch 32: the seed
model; `--gpu`) or a small one (32 channels, 32x32, batch 8: runs on a CPU),
splits a training step's working memory over its layers with
`keras_memwatch.memory_by_layer`, and prints the top layers, the layers'
sum against the step's working memory, and a reference measured apart:

- PyTorch: one more `fit` step after a warm-up, `torch.cuda.max_memory_allocated`
  during it less `torch.cuda.memory_allocated` before (on a CUDA device);
- JAX: `keras_memwatch.judge.xla_plan.working_bytes` (XLA's plan of `fit`'s
  step, with the batches a fit holds ahead on an accelerator).

    KERAS_BACKEND=torch python -m benchmarks.gpu.by_layer_check --gpu
    KERAS_BACKEND=jax python -m benchmarks.gpu.by_layer_check --gpu --json out.json

The last line printed is the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Optional

SEED = {"channels": 1024, "side": 64, "batch": 32}
SMALL = {"channels": 32, "side": 32, "batch": 8}


def seed_model(channels: int, side: int) -> Any:
    import keras

    layers = keras.layers
    model = keras.Sequential([
        keras.Input((side, side, 3)),
        layers.Conv2D(channels, 3, padding="same", activation="relu", name="conv1"),
        layers.Conv2D(channels, 3, padding="same", activation="relu", name="conv2"),
        layers.MaxPooling2D(name="pool1"),
        layers.Conv2D(channels, 3, padding="same", activation="relu", name="conv3"),
        layers.MaxPooling2D(name="pool2"),
        layers.GlobalAveragePooling2D(name="gap"),
        layers.Dense(10, name="logits"),
    ])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def reference(model: Any, x: Any, y: Any, batch: int) -> tuple[Optional[int], str]:
    """The step's working memory measured without keras_memwatch's split."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        from keras_memwatch.judge import xla_plan

        return (xla_plan.working_bytes(model, (x, y), batch),
                "xla_plan.working_bytes (with the batches a fit holds ahead)")
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return None, "no CUDA device: no allocator peak"
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)  # warm
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before,
                "torch.cuda.max_memory_allocated during a warm fit step less "
                "memory_allocated before")
    return None, f"no reference on {backend}"


def _plain(value: Any) -> Any:
    """A table cell as JSON: text, an int, or None where missing."""
    import pandas as pd

    if isinstance(value, str):
        return value
    return None if pd.isna(value) else int(value)


def check(gpu: bool, top: int = 5, batch: Optional[int] = None) -> dict[str, Any]:
    import keras
    import numpy as np

    from keras_memwatch import memory_by_layer
    from keras_memwatch.explain.layers import LOSS, REST, STEP_ROWS, format_by_layer

    size = dict(SEED if gpu else SMALL)
    if batch is not None:
        size["batch"] = batch
    model = seed_model(size["channels"], size["side"])
    rng = np.random.default_rng(0)
    n = size["batch"]
    x = rng.random((n, size["side"], size["side"], 3), dtype="float32")
    y = rng.integers(0, 10, n).astype("int32")
    began = time.perf_counter()
    table = memory_by_layer(model, x, y)
    seconds = time.perf_counter() - began
    print(format_by_layer(table, top=top), file=sys.stderr)
    layers = table[~table["layer"].isin(STEP_ROWS)]
    layers_sum = int(layers["working_bytes"].sum())
    by_name = table.set_index("layer")["working_bytes"]
    rows_sum = int(table[table["layer"] != REST]["working_bytes"].sum())
    working = table.attrs["working_bytes"]
    ref, ref_words = reference(model, x, y, n)
    head = layers.sort_values("working_bytes", ascending=False, kind="stable").head(top)
    columns = ["layer", "class", "output_shape", "activation_bytes", "grad_bytes",
               "working_bytes", "measured_forward_bytes", "measured_backward_bytes",
               "source"]
    rows = [{k: _plain(v) for k, v in row.items()}
            for row in head[columns].to_dict("records")]
    return {
        "backend": keras.backend.backend(), "gpu": gpu, **size,
        "top_layers": rows,
        "layers_sum_bytes": layers_sum,
        "working_bytes": working,
        "working_source": table.attrs["working_source"],
        "layers_share_of_working": (None if not working
                                    else round(layers_sum / working, 3)),
        "loss_bytes": _plain(by_name[LOSS]),
        "rest_bytes": _plain(by_name[REST]),
        "rows_share_of_working": (None if not working
                                  else round(rows_sum / working, 3)),
        "saved_bytes": table.attrs.get("saved_bytes"),
        "held_at_backward_bytes": table.attrs.get("held_at_backward_bytes"),
        "reference_bytes": ref, "reference_source": ref_words,
        "layers_share_of_reference": None if not ref else round(layers_sum / ref, 3),
        "seconds": round(seconds, 2),
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true",
                        help="the seed model (1024 channels, 64x64, batch 32)")
    parser.add_argument("--batch", type=int, default=None, help="override the batch")
    parser.add_argument("--top", type=int, default=5, help="layers listed")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = check(args.gpu, args.top, args.batch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
