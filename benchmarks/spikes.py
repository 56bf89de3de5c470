"""Detection quality on the spike scenario (see `models.spike_scenario`:
mostly small batches, an oversized one every 15th or 20th). For each tool: how many of the oversized batches it
catches, whether it names the batch, and how many other batches it flags.

MemWatch names the batch of each spike itself. Stormlog keeps timestamped
samples from its timer thread and tags them with the phase (here the epoch),
never the batch; the benchmark maps each of its samples to the batch running
at that moment with its own batch clock, and counts an oversized batch as
caught when a sample taken during it rose by at least `min_delta_mb` (64 MiB,
MemWatch's default) over the previous sample: Stormlog's own record of such
a sample is an `allocation` event of that size.
"""

from __future__ import annotations

import bisect
import gc
import time
from typing import Any

from benchmarks import arms as A
from benchmarks.common import MIB
from benchmarks.models import (
    SpikeScenario, spike_dataset, spike_model, spike_scenario)


def _memwatch(s: SpikeScenario) -> dict[str, Any]:
    from keras_memwatch import MemWatch

    model = spike_model(s)
    watch = MemWatch(verbose=0)
    t = time.perf_counter()
    model.fit(spike_dataset(s), epochs=1, verbose=0, shuffle=False,
              callbacks=[watch])
    wall = time.perf_counter() - t
    spikes = watch.spikes
    flagged = sorted({int(b) for b in spikes["batch"].dropna().tolist()})
    by_device = {str(d): sorted(int(b) for b in g["batch"].dropna())
                 for d, g in spikes.groupby("device", observed=True)}
    frame = watch.to_dataframe()
    return {
        "tool": "MemWatch()",
        "flagged": flagged,
        "flagged_by_device": by_device,
        "tied_to_batch": True,
        "samples": int(len(frame)),
        "devices": [str(d) for d in frame["device"].unique()],
        "fit_s": wall,
    }


def _stormlog(s: SpikeScenario, gpu: bool, min_delta: int) -> dict[str, Any]:
    model = spike_model(s)
    arm = A.stormlog_class()(gpu)
    clock = A.batch_clock_class()()
    t = time.perf_counter()
    model.fit(spike_dataset(s), epochs=1, verbose=0, shuffle=False,
              callbacks=[clock, arm])
    wall = time.perf_counter() - t
    begins = [b for _, b in clock.begins]
    samples = arm.samples
    flagged = set()
    in_fit = 0
    for (t0, m0), (t1, m1) in zip(samples, samples[1:]):
        if not begins or t1 < begins[0] or (clock.end and t1 > clock.end):
            continue
        in_fit += 1
        if m1 - m0 >= min_delta:
            i = bisect.bisect_right(begins, t1) - 1
            flagged.add(clock.begins[i][0])
    return {
        "tool": f"Stormlog {arm.kind}, sampling_interval=0.5",
        "flagged": sorted(flagged),
        "tied_to_batch": False,
        "samples": in_fit,
        "fit_s": wall,
    }


def run_spike_scenario(gpu: bool, batches: int | None = None,
                       min_delta_mb: float = 64) -> dict[str, Any]:
    scenario = spike_scenario(gpu, batches)
    oversized = scenario.oversized()
    results = []
    runs = [("memwatch", lambda: _memwatch(scenario))]
    why_not = A.stormlog_available()
    if why_not is None:
        runs.append(("stormlog",
                     lambda: _stormlog(scenario, gpu, int(min_delta_mb * MIB))))
    for name, run in runs:
        gc.collect()
        try:
            r = run()
        except Exception as e:  # report, keep going
            results.append({"tool": name, "error": f"{type(e).__name__}: {e}"})
            continue
        caught = sorted(set(r["flagged"]) & set(oversized))
        r["caught"] = caught
        r["tied"] = caught if r["tied_to_batch"] else []
        r["false_alarms"] = sorted(set(r["flagged"]) - set(oversized))
        results.append(r)
    if why_not is not None:
        results.append({"tool": "stormlog", "skipped": why_not})
    return {"scenario": scenario.describe(), "batches": scenario.batches,
            "oversized": oversized, "tools": results}
