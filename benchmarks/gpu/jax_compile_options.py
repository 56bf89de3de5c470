"""What XLA's compiler options cost and change, on JAX on a GPU.

Compiles `fit`'s train step of one model under a cap, one compilation at a
time (each from a fresh lowering, so none is found in JAX's cache), with:

- `fit`: no options, as `fit` compiles it (autotuned);
- `no autotuning`: autotuning and Triton GEMMs off;
- `aim`: `keras_memwatch.capacity.xla.AIM_OPTIONS` (also cheaper code
  generation: ptxas and LLVM without their expensive passes).

Prints the seconds and the working bytes of each plan:

    KERAS_BACKEND=jax python3 -m benchmarks.gpu.jax_compile_options gpt2 --limit-mb 8192 --sizes 16 28
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--limit-mb", type=float, default=8192)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 28])
    args = parser.parse_args()

    from keras_memwatch import configure_memory

    configure_memory(memory_limit_mb=args.limit_mb)
    from benchmarks.models import build, data
    from keras_memwatch.capacity.xla import AIM_OPTIONS
    from keras_memwatch.judge import xla_plan

    model = build(args.model)
    x, y = data(args.model, 8)
    model.optimizer.build(model.trainable_variables)
    options = {"fit": None,
               "no autotuning": {"xla_gpu_autotune_level": 0,
                                 "xla_gpu_enable_triton_gemm": False},
               "aim": AIM_OPTIONS}
    for size in args.sizes:
        began = time.perf_counter()
        xla_plan.lower_step(model, (x, y), size, batches_ahead=0)
        print(f"batch {size}: tracing and lowering {time.perf_counter() - began:.1f} s")
        for name, chosen in options.items():
            lowered = xla_plan.lower_step(model, (x, y), size, batches_ahead=0)
            began = time.perf_counter()
            need = xla_plan.compiled_working_bytes(*lowered, chosen)
            print(f"batch {size} {name}: {time.perf_counter() - began:.1f} s, "
                  f"{need / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
