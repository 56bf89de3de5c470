"""What XLA's compiler options cost and change, on JAX on a GPU.

Compiles `fit`'s train step of one model under a cap, one compilation at a
time, each a new one (JAX keeps a size's lowering, and the executable of
one compiled without options, so no size is compiled as `fit` compiles
it twice in one process), with:

- `fit`: no options, as `fit` compiles it (autotuned);
- `untuned`: autotuning off, Triton GEMMs as `fit` has them;
- `untuned-cheap`: the same, with cheaper code generation (ptxas and LLVM
  without their expensive passes);
- `no-triton`: autotuning and Triton GEMMs off;
- `aim`: `keras_memwatch.capacity.xla.AIM_OPTIONS`.

Prints the seconds and the working bytes of each plan; `--together`
also compiles the sizes side by side with each named set, one round for
each `--together-sizes` group (sizes of no other group: a size compiled
again in one process is found in JAX's cache);
`--hold-mb` keeps that many MiB on the device while compiling (whether the
memory in use moves XLA's plans):

    KERAS_BACKEND=jax python3 -m benchmarks.gpu.jax_compile_options gpt2 --limit-mb 8192 \
        --sizes 16 30 --sets fit untuned untuned-cheap \
        --together untuned-cheap --together-sizes 20 24 28 32 36 40 44 48
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time

UNTUNED = {"xla_gpu_autotune_level": 0}
CHEAP = {"xla_gpu_disable_gpuasm_optimizations": True,
         "xla_backend_optimization_level": 0,
         "xla_llvm_disable_expensive_passes": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--limit-mb", type=float, default=8192)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 28])
    parser.add_argument("--sets", nargs="+", default=["fit", "no-triton", "aim"])
    parser.add_argument("--together", nargs="*", default=[])
    parser.add_argument("--together-sizes", type=int, nargs="+", action="append",
                        default=None)
    parser.add_argument("--hold-mb", type=int, default=0)
    args = parser.parse_args()

    from keras_memwatch import configure_memory

    configure_memory(memory_limit_mb=args.limit_mb)
    from benchmarks.models import build, data
    from keras_memwatch.capacity.xla import AIM_OPTIONS
    from keras_memwatch.judge import xla_plan

    model = build(args.model)
    x, y = data(args.model, 8)
    model.optimizer.build(model.trainable_variables)
    if args.hold_mb:
        import jax.numpy as jnp

        held = jnp.ones((args.hold_mb, 2**18), "float32").block_until_ready()
        print(f"holding {held.nbytes / 2**20:.0f} MiB on the device", flush=True)
    options = {"fit": None, "untuned": UNTUNED,
               "untuned-cheap": {**UNTUNED, **CHEAP},
               "no-triton": {**UNTUNED, "xla_gpu_enable_triton_gemm": False},
               "aim": AIM_OPTIONS}
    for size in args.sizes:
        began = time.perf_counter()
        xla_plan.lower_step(model, (x, y), size, batches_ahead=0)
        print(f"batch {size}: tracing and lowering {time.perf_counter() - began:.1f} s")
        for name in args.sets:
            lowered = xla_plan.lower_step(model, (x, y), size, batches_ahead=0)
            began = time.perf_counter()
            need = xla_plan.compiled_working_bytes(*lowered, options[name])
            print(f"batch {size} {name}: {time.perf_counter() - began:.1f} s, "
                  f"{need / 2**20:.0f} MiB", flush=True)
    groups = args.together_sizes or [[b + 1 for b in args.sizes]]
    for name, together in ((n, g) for n in args.together for g in groups):
        lowered = [xla_plan.lower_step(model, (x, y), size, batches_ahead=0)
                   for size in together]
        began = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(lowered)) as pool:
            needs = list(pool.map(
                lambda low: xla_plan.compiled_working_bytes(*low, options[name]),
                lowered))
        print(f"side by side {name}, batches {together}: "
              f"{time.perf_counter() - began:.1f} s, "
              + ", ".join(f"{n / 2**20:.0f}" for n in needs) + " MiB", flush=True)


if __name__ == "__main__":
    main()
