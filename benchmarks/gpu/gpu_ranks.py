"""MemWatch across ranks on GPUs (JAX): `proc I PORT OUT` runs one of two
processes joined by jax.distributed, one GPU each; `single OUT` runs one
process with DataParallel over every local GPU. Each writes its log under
OUT and prints one JSON line. Process 1 holds 2 GiB more from epoch 1
batch 3, so the merged report has an imbalance to find.

    python3 benchmarks/gpu/gpu_ranks.py proc 0 PORT OUT & python3 benchmarks/gpu/gpu_ranks.py proc 1 PORT OUT
"""
import json
import os
import sys
import time

t0 = time.time()
mode = sys.argv[1]
import jax  # noqa: E402

if mode == "proc":
    i, port, out = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    kw = {} if os.environ.get("JAX_PLATFORMS") == "cpu" or os.environ.get("VISIBLE") else {"local_device_ids": [i]}
    if os.environ.get("JAX_PLATFORMS") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=2, process_id=i, **kw)
else:
    out = sys.argv[2]
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_memwatch import MemWatch  # noqa: E402


class Extra(keras.callbacks.Callback):
    """Process 1 alone takes 2 GiB more on its device at epoch 1 batch 3."""
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
    def on_train_batch_begin(self, batch, logs=None):
        if mode == "proc" and jax.process_index() == 1 and (self.epoch, batch) == (1, 3):
            self.held = jax.device_put(jnp.ones((2**29,), jnp.float32), jax.local_devices()[0])
            self.held.block_until_ready()

keras.utils.set_random_seed(0)
dist = keras.distribution.DataParallel(devices=jax.devices())
if mode == "proc":
    dist.auto_shard_dataset = False
keras.distribution.set_distribution(dist)
width = int(os.environ.get("WIDTH", "4096"))
model = keras.Sequential([keras.Input((width,))] + [keras.layers.Dense(width, activation="relu") for _ in range(4)] + [keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
rng = np.random.default_rng(0)
n = int(os.environ.get("N", "8192"))
x = rng.normal(size=(n, width)).astype("float32")
y = rng.normal(size=(n, 1)).astype("float32")
watch = MemWatch(log_path=os.path.join(out, "mem.csv"), verbose=1)
model.fit(x, y, batch_size=int(os.environ.get("BATCH", "512")), epochs=2, verbose=0, callbacks=[Extra(), watch])
frame = watch.to_dataframe()
peaks = {d: int(r["peak_bytes"].max()) if r["peak_bytes"].notna().any() else None
         for d, r in frame.groupby(frame["device"].astype(str))}
print(json.dumps({"mode": mode, "log_paths": watch.log_paths, "process": watch.process,
                  "process_count": watch.process_count, "hostname": watch.hostname,
                  "devices": sorted(peaks), "peaks": peaks, "sources": watch.sources,
                  "jax_devices": [str(d) for d in jax.devices()],
                  "local_devices": [str(d) for d in jax.local_devices()],
                  "seconds": round(time.time() - t0, 1)}), flush=True)
