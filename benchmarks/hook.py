"""Cost per sample of MemWatch's own work, in thread CPU time.

MemWatch's batch hooks (`on_train_batch_begin` on the training thread and
`on_train_batch_end`, on a Keras worker thread under JAX and PyTorch) are
timed with `time.thread_time_ns`, so a hook is charged for its own work and
not for waiting on the GIL or on an earlier batch. Next to it, in the same
`fit`, a minimal async-safe hook does nothing but the same probes' `read()`.
A second fit times each probe's `read()` inside both hooks, to show where
MemWatch's time goes (probes vs its own bookkeeping: spike detection, the
recorder, the logs). The first epoch of every fit is left out. A hot loop
of the same reads outside `fit` is given for scale.
"""

from __future__ import annotations

import gc
import statistics
from typing import Any

from benchmarks import arms as A
from benchmarks.common import log, spread, thread_ns, timer_overhead_ns
from benchmarks.models import build_model, make_data, workload


def _after_first_epoch(values: list, marks: list, index: int) -> list:
    """The values recorded from the second epoch on."""
    if len(marks) < 2:
        return list(values)
    return list(values[marks[1][index]:])


def _us(values: list, overhead_ns: float) -> list[float]:
    return [max(v - overhead_ns, 0.0) / 1e3 for v in values]


def hot_loop_us(probes: list, n: int = 2000) -> dict[str, float]:
    """Thread CPU time of each probe's read() in a tight loop, best of 5."""
    out = {}
    for p in probes:
        best = float("inf")
        for _ in range(5):
            t = thread_ns()
            for _ in range(n):
                p.read()
            best = min(best, (thread_ns() - t) / n)
        out[p.name] = best / 1e3
    return out


def run_hook_cost(gpu: bool, reps: int, steps: int, epochs: int,
                  model_name: str = "mlp") -> dict[str, Any]:
    w = workload(model_name, gpu)
    model = build_model(w, gpu)
    x, y = make_data(w, steps)
    TimedMemWatch = A.timed_memwatch_class()
    MinimalHook = A.minimal_hook_class()
    overhead = timer_overhead_ns()

    def fit(callbacks: list) -> None:
        gc.collect()
        model.fit(x, y, batch_size=w.batch_size, epochs=epochs, verbose=0,
                  shuffle=False, callbacks=callbacks)

    fit([])  # compile
    fit([TimedMemWatch(), MinimalHook()])  # first-time work of both

    # Whichever hook runs first after a step finds the caches cold and pays
    # more: each runs first in half the rounds, and each figure is the mean
    # of its median in either position.
    reps = max(2, reps + reps % 2)
    by_order: list[dict[str, list[float]]] = [
        {"begin": [], "end": [], "minimal": [], "minimal_begin": [],
         "minimal_call": []} for _ in range(2)]
    probes_mw: dict[str, list[float]] = {}
    probes_min: dict[str, list[float]] = {}
    reads_per_batch: list[float] = []  # ns of MemWatch's probe reads per batch
    parts: list[dict[str, float]] = []  # the profile of each per-probe fit
    plain_end: list[float] = []  # the end hook's trimmed mean, uninstrumented
    rounds = []
    for r in range(reps):
        first = r % 2  # 0: MemWatch first, 1: the minimal hook first
        watch, minimal = TimedMemWatch(), MinimalHook()
        fit([watch, minimal] if first == 0 else [minimal, watch])
        begin = _us(_after_first_epoch(watch.begin_ns, watch.epoch_marks, 1), overhead)
        end = _us(_after_first_epoch(watch.end_ns, watch.epoch_marks, 2), overhead)
        mini = _us(_after_first_epoch(minimal.end_ns, minimal.epoch_marks, 1), overhead)
        plain_end.append(_trimmed_mean(
            _after_first_epoch(watch.end_ns, watch.epoch_marks, 2), overhead))
        sink = by_order[first]
        sink["begin"] += begin
        sink["end"] += end
        sink["minimal"] += mini
        sink["minimal_begin"] += _us(
            _after_first_epoch(minimal.begin_ns, minimal.epoch_marks, 1), overhead)
        # The call's region holds the reads' own timed region: two more reads
        # of the clock.
        sink["minimal_call"] += _us(
            _after_first_epoch(minimal.call_ns, minimal.epoch_marks, 1), 3 * overhead)
        rnd = {"memwatch_first": first == 0,
               "memwatch_us": statistics.median(begin) + statistics.median(end),
               "minimal_us": statistics.median(mini)}
        rnd["ratio"] = rnd["memwatch_us"] / rnd["minimal_us"]
        rounds.append(rnd)

        # Per probe, in a fit of its own (the wrappers cost a little).
        watch, minimal = TimedMemWatch(per_probe=True), MinimalHook(per_probe=True)
        fit([watch, minimal] if first == 0 else [minimal, watch])
        # Reads per batch, amortized: NVML is read at most once a second.
        reads_per_batch.append(sum(sum(v) for v in watch.probe_ns.values())
                               / max(len(watch.end_ns), 1))
        parts.append(_parts(watch, overhead))
        for sink, hook in ((probes_mw, watch), (probes_min, minimal)):
            for name, values in hook.probe_ns.items():
                # skip the train-begin read and the first epoch's batches
                keep = values[len(values) - len(values) * (epochs - 1) // epochs:]
                sink.setdefault(name, []).extend(_us(keep, overhead))
        log(f"  hook round {r + 1}/{reps} ({'MemWatch' if first == 0 else 'minimal'}"
            f" first): MemWatch {rnd['memwatch_us']:.1f} us, minimal "
            f"{rnd['minimal_us']:.1f} us, ratio {rnd['ratio']:.2f}")

    probes = A.started_probes()
    try:
        hot = hot_loop_us(probes)
        names = [p.name for p in probes]
    finally:
        A._close(probes)

    def stat(values: list[float]) -> dict[str, Any]:
        s = spread(values)
        s["mean"] = statistics.fmean(values) if values else None
        return s

    positions = []
    for sink in by_order:
        begin, end, mini = (stat(sink[k]) for k in ("begin", "end", "minimal"))
        positions.append({"memwatch_begin_us": begin, "memwatch_end_us": end,
                          "memwatch_us": begin["median"] + end["median"],
                          "memwatch_mean_us": begin["mean"] + end["mean"],
                          "minimal_us": mini})
    memwatch_median = statistics.fmean(p["memwatch_us"] for p in positions)
    memwatch_mean = statistics.fmean(p["memwatch_mean_us"] for p in positions)
    minimal_median = statistics.fmean(p["minimal_us"]["median"] for p in positions)
    minimal_mean = statistics.fmean(p["minimal_us"]["mean"] for p in positions)
    minimal_called = statistics.fmean(
        statistics.median(s["minimal_begin"]) + statistics.median(s["minimal_call"])
        for s in by_order)
    begin_median = statistics.fmean(
        p["memwatch_begin_us"]["median"] for p in positions)
    end_median = statistics.fmean(p["memwatch_end_us"]["median"] for p in positions)
    per_probe = {}
    for name in names:
        mw = stat(probes_mw.get(name, []))
        mn = stat(probes_min.get(name, []))
        per_probe[name] = {
            "in_memwatch_us": mw,
            "in_minimal_us": mn,
            "hot_loop_us": hot.get(name),
        }
    probe_sum = max(statistics.median(reads_per_batch) - overhead, 0.0) / 1e3
    return {
        "model": model_name,
        "probes": names,
        "batches_timed": sum(len(s["minimal"]) for s in by_order),
        "rounds": reps,
        "timer_overhead_us": overhead / 1e3,
        "memwatch_begin_us": begin_median,
        "memwatch_end_us": end_median,
        "memwatch_us": memwatch_median,
        "memwatch_mean_us": memwatch_mean,
        "minimal_us": minimal_median,
        "minimal_mean_us": minimal_mean,
        "ratio": memwatch_median / minimal_median,
        "ratio_mean": memwatch_mean / minimal_mean,
        "ratio_per_round": spread([r["ratio"] for r in rounds]),
        # Both hooks timed the same way: around calls into each callback's
        # batch-begin and batch-end methods.
        "minimal_called_us": minimal_called,
        "ratio_called": memwatch_median / minimal_called,
        "by_position": {"memwatch_first": positions[0],
                        "minimal_first": positions[1]},
        "per_probe": per_probe,
        "memwatch_own_us": memwatch_median - probe_sum,
        # Where MemWatch's time goes (the instrumented fits; means, us per batch).
        "profile_us": _profile(parts, plain_end),
    }


def _profile(parts: list[dict[str, float]], plain_end: list[float]) -> dict[str, float]:
    """The medians over rounds of `_parts`, with what the instrumentation
    itself added to the end hook (its wrappers' calls, which land in the
    guard and the hand-over)."""
    out = {k: statistics.median(p[k] for p in parts) for k in parts[0]}
    out["end_hook_uninstrumented"] = statistics.median(plain_end)
    out["instrumentation"] = out["end_hook"] - out["end_hook_uninstrumented"]
    return out


def _trimmed_mean(values: list, overhead_ns: float, timers: int = 1) -> float:
    """Mean in us of the values at or below their 99th percentile, less
    `timers` timer pairs."""
    if not values:
        return 0.0
    cut = sorted(values)[int(0.99 * (len(values) - 1))]
    kept = [v for v in values if v <= cut]
    return max(statistics.fmean(kept) - timers * overhead_ns, 0.0) / 1e3


def _parts(watch: Any, overhead_ns: float) -> dict[str, float]:
    """MemWatch's hooks of one instrumented fit, taken apart (epochs 2..N):
    the begin hook; the end hook's read of the probes (the probes' own
    `read()` and the sampler's guard around them), its logs figures, and
    the rest (checks, the key, the lock, the hand-over to the pipeline)."""
    marks = watch.epoch_marks
    begin = _after_first_epoch(watch.begin_ns, marks, 1)
    end = _after_first_epoch(watch.end_ns, marks, 2)
    n = len(end)
    read = watch.part_ns["read"][-n:] if n else []
    logs = [watch.part_ns[part][-n:] if n else [] for part in ("logs", "logs_add")]
    probes = len(watch.probe_ns)
    # NVML is read at most once a second: its cost is spread over the batches.
    reads = sum(_trimmed_mean(v[len(v) - n:], overhead_ns) * min(len(v), n)
                for v in watch.probe_ns.values()) / max(n, 1)
    read_us = _trimmed_mean(read, overhead_ns, 1 + probes)
    logs_us = sum(_trimmed_mean(part, overhead_ns) for part in logs)
    end_us = _trimmed_mean(end, overhead_ns, 4 + probes)
    return {"begin_hook": _trimmed_mean(begin, overhead_ns),
            "end_hook": end_us,
            "probe_reads": reads,
            "sampler_guard": max(read_us - reads, 0.0),
            "logs_figures": logs_us,
            "hand_over_and_checks": max(end_us - read_us - logs_us, 0.0)}
