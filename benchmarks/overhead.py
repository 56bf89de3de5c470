"""Overhead on training: step time of `fit` with each arm's callbacks over
step time without any, in the same process, on the same model and data.

Each round runs every arm once, in an order that rotates from round to
round, and divides each arm's step time by the no-callback step time of
the same round. A fit's step time is the median wall time of its epochs
2..N (timed with epoch hooks only, which never force a sync; the first
epoch of every fit is left out), divided by the steps of an epoch. The
ratio reported is the median over rounds, with its min and max; `none_b`
against `none` is the A/A noise floor. Arms in `SLOW_ARMS` (nvidia-smi, 10
to 20 ms a batch) run in the first `slow_reps` rounds only: their ratio is
far from 1 and needs no precision.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from benchmarks import arms as A
import statistics

from benchmarks.common import epoch_timer_class, log, spread
from benchmarks.models import build_model, make_data, workload


SLOW_ARMS = frozenset({"nvidia_smi"})


def run_overhead(model_name: str, arm_names: list[str], gpu: bool, reps: int,
                 steps: int, epochs: int, slow_reps: int = 3) -> dict[str, Any]:
    if epochs < 2:
        raise ValueError("epochs must be >= 2 (the first one is left out)")
    w = workload(model_name, gpu)
    model = build_model(w, gpu)
    x, y = make_data(w, steps)
    EpochTimer = epoch_timer_class()

    def fit(callbacks: list, n_epochs: int) -> tuple[float, float, float, float]:
        """Step wall time, fit wall time, and CPU time per step of the
        training thread and of the whole process."""
        timer = EpochTimer()
        gc.collect()
        t, train_cpu, cpu = time.perf_counter(), time.thread_time(), time.process_time()
        model.fit(x, y, batch_size=w.batch_size, epochs=n_epochs, verbose=0,
                  shuffle=False, callbacks=[*callbacks, timer])
        n = steps * n_epochs
        train_cpu = (time.thread_time() - train_cpu) / n
        cpu = (time.process_time() - cpu) / n
        wall = time.perf_counter() - t
        return statistics.median(timer.epochs[1:]) / steps, wall, train_cpu, cpu

    # Warm-up: compile, and let every arm do its first-time work once.
    fit([], 2)
    for name in arm_names:
        fit(A.make_arm(name, gpu), 2)

    step_s: dict[str, list[float]] = {a: [] for a in arm_names}
    fit_s: dict[str, list[float]] = {a: [] for a in arm_names}
    ratios: dict[str, list[float]] = {a: [] for a in arm_names}
    train_cpu: dict[str, list[float]] = {a: [] for a in arm_names}
    cpu: dict[str, list[float]] = {a: [] for a in arm_names}
    extra: dict[str, Any] = {}
    for r in range(reps):
        names = [a for a in arm_names if a not in SLOW_ARMS or r < slow_reps]
        k = r % len(names)
        order = names[k:] + names[:k]
        this_round = {}
        for name in order:
            callbacks = A.make_arm(name, gpu)
            s, wall, thread_s, process_s = fit(callbacks, epochs)
            this_round[name] = s
            train_cpu[name].append(thread_s)
            cpu[name].append(process_s)
            step_s[name].append(s)
            fit_s[name].append(wall)
            if name == "stormlog" and callbacks:
                extra["stormlog_kind"] = callbacks[0].kind
                extra.setdefault("stormlog_samples", []).append(
                    len(callbacks[0].samples))
        for name in names:
            ratios[name].append(this_round[name] / this_round["none"])
        log(f"  {model_name} round {r + 1}/{reps}: " + ", ".join(
            f"{n} {this_round[n] * 1e3:.2f} ms" for n in names))

    out: dict[str, Any] = {
        "model": model_name,
        "workload": w.description,
        "steps_per_epoch": steps,
        "epochs": epochs,
        "timed_steps_per_fit": steps * (epochs - 1),
        "rounds": reps,
        "arms": {},
        **extra,
    }
    for name in arm_names:
        out["arms"][name] = {
            "step_ms": spread([s * 1e3 for s in step_s[name]]),
            "fit_s": spread(fit_s[name]),
            "ratio": spread(ratios[name]),
            "train_thread_cpu_us": spread([c * 1e6 for c in train_cpu[name]]),
            "process_cpu_us": spread([c * 1e6 for c in cpu[name]]),
            "ratios": ratios[name],
        }
    return out
