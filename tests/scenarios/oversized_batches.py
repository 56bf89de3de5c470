"""The spike scenario: mostly small batches, an oversized one every 15th.

Run as a script under the chosen KERAS_BACKEND; prints one JSON line with
what MemWatch flagged. A few 64-channel convolutions on 64x64x3 inputs make
activations dominate, so each oversized batch raises the step's peak host
RSS several times above the usual working memory.
"""

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # oneDNN keeps freed memory

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_memwatch import MemWatch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
from benchmarks.models import spike_model, spike_scenario  # noqa: E402

# CPU: judged on host peak RSS. GPU (--gpu): the H200 scenario, judged on
# the allocator, or on XLA's plan of each step with JAX (4 x Conv2D(128) on
# 128x128x3, batches of 8, 128 every 20th). --epochs N runs N epochs;
# --uniform makes every batch small (nothing to flag); --data-parallel (JAX)
# spreads each batch over every GPU with keras.distribution.DataParallel.
GPU = "--gpu" in sys.argv
UNIFORM = "--uniform" in sys.argv
EPOCHS = int(sys.argv[sys.argv.index("--epochs") + 1]) if "--epochs" in sys.argv else 1
SCENARIO = spike_scenario(GPU)  # the benchmarks' scenario, from their registry
SMALL, LARGE, EVERY, BATCHES = (SCENARIO.small, SCENARIO.large, SCENARIO.every,
                                SCENARIO.batches)
SIDE = SCENARIO.side


def oversized(index):
    return not UNIFORM and (index + 1) % EVERY == 0


class Oversized(keras.utils.PyDataset):
    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return BATCHES

    def __getitem__(self, index):
        n = LARGE if oversized(index) else SMALL
        x = self.rng.normal(size=(n, SIDE, SIDE, 3)).astype("float32")
        y = self.rng.integers(0, 10, size=(n,))
        return x, y


def main():
    if "--data-parallel" in sys.argv:
        import jax

        distribution = keras.distribution.DataParallel(devices=jax.devices())
        keras.distribution.set_distribution(distribution)
    model = spike_model(SCENARIO)
    watch = MemWatch(verbose=int(os.environ.get("MEMWATCH_VERBOSE", "0")))
    began = time.perf_counter()
    model.fit(Oversized(), epochs=EPOCHS, shuffle=False, callbacks=[watch], verbose=0)
    seconds = time.perf_counter() - began
    spikes, frame = watch.spikes, watch.to_dataframe()
    device = "GPU:0" if GPU else "host"
    rows = frame[(frame["device"] == device) & frame["batch"].notna()]
    steps = frame[frame["batch"].notna() & (frame["phase"] == "train")]
    print(json.dumps({
        "flagged": spikes.loc[spikes["device"] == device, "batch"].tolist(),
        "flagged_at": spikes.loc[spikes["device"] == device, ["epoch", "batch"]]
        .values.tolist(),
        "flagged_by_device": {d: g[["epoch", "batch"]].values.tolist()
                              for d, g in spikes.groupby("device", observed=True)},
        "oversized": [i for i in range(BATCHES) if oversized(i)],
        "oversized_at": [[e, i] for e in range(EPOCHS) for i in range(BATCHES)
                         if oversized(i)],
        "peak_mib": (rows["peak_bytes"] / 2**20).round(1).fillna(-1).tolist(),
        "working_mib": ((rows["peak_bytes"] - rows["current_bytes"].shift(1))
                        / 2**20).round(1).fillna(-1).tolist(),
        "plan_mib_by_device": {
            d: sorted({round(v / 2**20, 1) for v in g["plan_bytes"].dropna()})
            for d, g in steps.groupby("device", observed=True)},
        "plan_source": watch.sources.get("xla plan"),
        "fit_s": round(seconds, 2),
    }))


if __name__ == "__main__":
    sys.exit(main())
