"""Where a compilation of `fit`'s step goes, on JAX on a GPU: XLA's HLO
passes, which end in the memory plan, against the kernels after it.

Compiles `fit`'s train step of one model under a cap at one size, each set
of options from a fresh lowering (none is found in a cache), in a child
process whose XLA logs each pass's time. Prints, for each set, the
seconds of the compilation, when the buffer assignment (the plan
`memory_analysis` reads) was written, the plan, and the passes that took
longest:

    KERAS_BACKEND=jax python3 -m benchmarks.gpu.compile_phases gpt2 \\
        --limit-mb 8192 --size 30

Sets: `aim` (`keras_memwatch.capacity.xla.AIM_OPTIONS`, the quick plans)
and `fit` (no options, as `fit` compiles it).
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

PASS_TIME = re.compile(r"HLO pass: (\S+) time: ([\d.]+) (us|ms|s|min)\b")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}
SHOWN = 6
SETS = ("aim", "fit")


def reported_set(line: str) -> str:
    """The set a line of the child reports (`SET batch ...`), or `""`."""
    name = line.split(" ", 1)[0]
    return name if name in SETS and " batch " in line else ""


def pass_seconds(lines: list[str]) -> dict[str, dict[str, float]]:
    """Each set's seconds by HLO pass, from the child's merged output: the
    passes logged before the line that reports the set (`SET batch ...`)."""
    out: dict[str, dict[str, float]] = {}
    seconds: dict[str, float] = collections.defaultdict(float)
    for line in lines:
        found = PASS_TIME.search(line)
        if found:
            seconds[found.group(1)] += float(found.group(2)) * UNITS[found.group(3)]
        elif reported_set(line):
            out[reported_set(line)] = dict(seconds)
            seconds.clear()
    return out


def _first_seen(folder: str, pattern: str, began: float, done: threading.Event,
                seen: dict[str, float]) -> None:
    while not done.is_set():
        if glob.glob(os.path.join(folder, pattern)):
            seen[pattern] = time.perf_counter() - began
            return
        time.sleep(0.02)


def compile_sets(model_name: str, limit_mb: float, size: int, sets: list[str]) -> None:
    """In the child: each set compiled from a fresh lowering, with XLA's dump
    on, reported in one line."""
    from keras_memwatch import configure_memory

    configure_memory(memory_limit_mb=limit_mb)
    from benchmarks.models import build, data
    from keras_memwatch.capacity.xla import AIM_OPTIONS
    from keras_memwatch.judge import xla_plan

    model = build(model_name)
    x, y = data(model_name, 8)
    model.optimizer.build(model.trainable_variables)
    options = {"aim": dict(AIM_OPTIONS), "fit": {}}
    for name in sets:
        lowered, _, _ = xla_plan.lower_step(model, (x, y), size, batches_ahead=0)
        folder = tempfile.mkdtemp(prefix=f"dump-{name}-")
        seen: dict[str, float] = {}
        done = threading.Event()
        began = time.perf_counter()
        watcher = threading.Thread(target=_first_seen, daemon=True, args=(
            folder, "*buffer-assignment.txt", began, done, seen))
        watcher.start()
        compiled = lowered.compile(compiler_options={**options[name],
                                                     "xla_dump_to": folder})
        total = time.perf_counter() - began
        done.set()
        plan = xla_plan.planned_bytes(compiled)
        assigned = seen.get("*buffer-assignment.txt")
        print(f"{name} batch {size}: compiled in {total:.1f} s, buffers assigned at "
              f"{assigned:.1f} s, plan {plan / 2**20:.0f} MiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--limit-mb", type=float, default=8192)
    parser.add_argument("--size", type=int, default=30)
    parser.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        compile_sets(args.model, args.limit_mb, args.size, args.sets)
        return
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0",
               TF_CPP_VMODULE="hlo_pass_pipeline=1")
    child = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.compile_phases", args.model,
         "--limit-mb", str(args.limit_mb), "--size", str(args.size), "--sets",
         *args.sets, "--child"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, check=False)
    lines = child.stdout.splitlines()
    reports = [line for line in lines if reported_set(line)]
    if child.returncode or not reports:
        print("\n".join(lines[-20:]))
        sys.exit(child.returncode or 1)
    passes = pass_seconds(lines)
    for line in reports:
        seconds = passes[reported_set(line)]
        print(line)
        print(f"  HLO passes {sum(seconds.values()):.1f} s; longest: " + ", ".join(
            f"{n} {s:.2f} s" for n, s in sorted(seconds.items(),
                                                 key=lambda kv: -kv[1])[:SHOWN]))


if __name__ == "__main__":
    main()
