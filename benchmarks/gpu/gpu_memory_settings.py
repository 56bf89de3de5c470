"""GPU check of configure_memory: a limit binds, and growth starts small.

Run on a CUDA machine: `python benchmarks/gpu/gpu_memory_settings.py`. Each case
runs in a fresh process (the settings are process-global) under
KERAS_BACKEND=jax and torch, and prints one JSON line per case:

- limit: `configure_memory(memory_limit_mb=4096)`, then training steps whose
  batch needs more than 4 GiB: it must fail with an out-of-memory error near
  4 GiB, not near the card's 141 GB.
- growth: `configure_memory(allow_growth=True)` versus the default, NVML's
  per-process memory at train begin and at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CASE = r"""
import json, os, sys
case = sys.argv[1]
import keras_memwatch
if case == "limit":
    config = keras_memwatch.configure_memory(memory_limit_mb=4096)
elif case == "growth":
    config = keras_memwatch.configure_memory(allow_growth=True)
else:
    config = None
import keras, numpy as np
from keras_memwatch import MemWatch
from benchmarks.models import conv_stack

model = lambda: conv_stack(128, 128, 4)

watch = MemWatch(verbose=0)
out = {"case": case, "backend": keras.backend.backend(),
       "applied": None if config is None else str(config)}
batch = 256 if case == "limit" else 8
x = np.random.default_rng(0).normal(size=(batch * 4, 128, 128, 3)).astype("float32")
y = np.zeros((batch * 4,), "int64")
try:
    model().fit(x, y, batch_size=batch, epochs=1, callbacks=[watch], verbose=0)
    out["error"] = None
except Exception as e:
    out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
frame = watch.to_dataframe().query("device == 'GPU:0'")
mib = lambda v: None if v is None or v != v else round(float(v) / 2**20)
out["rows"] = len(frame)
for col in ("allocator_limit_bytes", "allocator_peak_bytes", "process_bytes", "nvml_total_bytes"):
    s = frame[col].dropna()
    out[col.replace("_bytes", "_mib")] = {
        "first": mib(s.iloc[0]) if len(s) else None,
        "max": mib(s.max()) if len(s) else None}
print("RESULT " + json.dumps(out))
"""


def main() -> None:
    for backend in ("jax", "torch"):
        for case in ("limit", "growth", "default"):
            env = dict(os.environ, KERAS_BACKEND=backend)
            done = subprocess.run([sys.executable, "-c", CASE, case], env=env,
                                  capture_output=True, text=True, timeout=300)
            lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
            if lines:
                print(lines[-1][7:], flush=True)
            else:
                print(json.dumps({"case": case, "backend": backend,
                                  "failed": done.stderr[-1500:]}), flush=True)


if __name__ == "__main__":
    main()
