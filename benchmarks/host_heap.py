"""How far apart the host's measurements of the same steps fall, process by
process (`ways_to_fit` on the CPU, where a need is the host's peak resident
memory of real steps).

Each trial is a new process that builds a model from the registry, trains
it once, optionally trains other models first (`--late`: a process that has
worked, as late in a test suite), and measures three levers. The table
gives each row's need per trial and the spread between them:

    KERAS_BACKEND=torch python -m benchmarks.host_heap --trials 3
    KERAS_BACKEND=torch python -m benchmarks.host_heap --trials 3 --late
    KERAS_BACKEND=torch python -m benchmarks.host_heap --trials 3 --from-start

`--from-start` fixes glibc's mmap threshold from the process's start
(`MALLOC_MMAP_THRESHOLD_=65536`), where keras_memwatch fixes it only while
it measures (`keras_memwatch.measure.host_heap`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

MIB = 2**20
MODELS = ("block_tiny", "transformer_tiny")
LEVERS = ["mixed_precision", "sgd_momentum", "gradient_accumulation"]
BATCH = 16


def child(name: str, late: bool) -> None:
    import keras
    import numpy as np

    from benchmarks.models import build, data
    from keras_memwatch.ways import ways_to_fit

    if late:
        for units in (512, 3000, 1500, 4096):
            other = keras.Sequential([keras.Input((256,)), keras.layers.Dense(units),
                                      keras.layers.Dense(4)])
            other.compile("adam", "mse")
            other.fit(np.ones((64, 256)), np.zeros((64, 4)), epochs=2, verbose=0)
    model = build(name)
    x, y = data(name, BATCH)
    model.fit(x, y, batch_size=BATCH, verbose=0)
    table = ways_to_fit(model, x, y, batch_size=BATCH, levers=LEVERS,
                        combinations=False, verbose=0)
    print(json.dumps({row.lever: int(row.need_bytes) for row in table.itertuples()}))


def trial(name: str, late: bool, from_start: bool) -> dict[str, int]:
    env = dict(os.environ)
    if from_start:
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    command = [sys.executable, "-m", "benchmarks.host_heap", "--child", name]
    done = subprocess.run(command + (["--late"] if late else []), env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--late", action="store_true",
                        help="train other models first in each process")
    parser.add_argument("--from-start", action="store_true",
                        help="fix glibc's mmap threshold from the process's start")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.late)
    print(f"backend {os.environ.get('KERAS_BACKEND', 'tensorflow')}, batch {BATCH}, "
          f"{args.trials} new processes each, late={args.late}, "
          f"from_start={args.from_start}\n")
    print("| model | row | need per process (MiB) | spread (MiB) |")
    print("| --- | --- | --- | --- |")
    for name in MODELS:
        runs = [trial(name, args.late, args.from_start) for _ in range(args.trials)]
        for lever in runs[0]:
            needs = [run[lever] / MIB for run in runs if lever in run]
            print(f"| {name} | {lever} | {', '.join(f'{n:.1f}' for n in needs)} | "
                  f"{max(needs) - min(needs):.1f} |")


if __name__ == "__main__":
    main()
