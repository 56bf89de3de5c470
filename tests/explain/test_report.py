"""The summary says where the memory went, with the right numbers."""

from __future__ import annotations

import keras
import pandas as pd

from conftest import tiny_data, tiny_model
from keras_memwatch import MemWatch
from keras_memwatch.explain.breakdown import memory_breakdown
from keras_memwatch.judge.events import DriftEvent
from keras_memwatch.explain.report import (compare_processes, process_groups, report_text,
                                    summarize)
from conftest import GIB, HOST, MIB, built, dense_model, record, steady

WORKING = [40, 41, 39, 40, 42, 40, 400, 41, 40, 39, 40, 41, 40, 420, 40, 40]
SOURCES = {
    "fake": "fake allocator: bytes in use and the peak since the previous sample",
    "host": "host: RSS and peak RSS since the previous sample (Linux)",
    "nvml": "unavailable: NVML could not start (NVML Shared Library Not Found)",
}


def gpu_record():
    return record(steady(WORKING))  # 500 MiB in use, steps of about 40 MiB


def test_first_lines_say_where_the_memory_went():
    frame, spikes = gpu_record()
    model = built(dense_model(keras.optimizers.Adam()))
    breakdown = memory_breakdown(model, frame, batch_size=16)
    text = summarize(frame, spikes, [], SOURCES, breakdown=breakdown)
    lines = text.splitlines()
    assert lines[0] == "keras_memwatch summary: 16 training steps sampled over 1 epoch(s)"
    assert lines[2] == "Where the memory went:"
    # 484 float32 weights (1,936 B); Adam: two slots (3,872 B) and counters.
    counters = 12 if keras.backend.backend() == "tensorflow" else 8
    assert lines[3].startswith("  weights:              1.9 KiB (484 parameters; "
                               "trainable 1.9 KiB, non-trainable 0 B)")
    assert lines[4] == (f"  optimizer state:      {(3872 + counters) / 1024:.1f} KiB "
                        "(Adam keeps 2 slots per weight)")
    assert "step working memory:  40.0 MiB typical on GPU:0, 420 MiB at most " \
           "(epoch 0 batch 13)" in text
    assert "per sample:           2.5 MiB of working memory (typical step / " \
           "batch size 16)" in text


def test_per_device_peak_typical_limit_headroom_and_spikes():
    frame, spikes = gpu_record()
    text = summarize(frame, spikes, [], SOURCES)
    assert ("  GPU:0: peak 920 MiB, typical step peak 540 MiB, in use between "
            "steps 500 MiB") in text
    # 16 GiB - 920 MiB = 15,464 MiB; 920 / 16,384 = 5.6% used.
    assert "    limit 16.00 GiB, headroom at peak 15.10 GiB (94%)" in text
    assert ("    2 spike(s); worst 920 MiB at epoch 0 batch 13 (it needed 420 MiB, "
            "10.5x the usual 40.0 MiB); at epoch/batch: 0/6, 0/13") in text


def test_sources_and_what_was_not_available_with_why():
    frame, spikes = gpu_record()
    text = summarize(frame, spikes, [], SOURCES)
    sources = text[text.index("Sources:"):]
    assert "  host: RSS and peak RSS since the previous sample (Linux)" in sources
    assert ("Not available:\n  nvml: NVML could not start (NVML Shared Library "
            "Not Found)") in sources


def test_drift_is_reported():
    frame, spikes = gpu_record()
    drift = [("GPU:0", 0, DriftEvent(500 * MIB, 700 * MIB, 16))]
    text = summarize(frame, spikes, drift, SOURCES)
    assert ("  GPU:0 in epoch 0: baseline grew from 500 MiB to 700 MiB over "
            "16 batches") in text
    assert "Drift: none" in summarize(frame, spikes, [], SOURCES)


def test_without_a_model_weights_and_optimizer_are_unknown():
    frame, spikes = gpu_record()
    text = summarize(frame, spikes)
    assert "weights, optimizer state: unknown without the model" in text
    assert "step working memory:  40.0 MiB typical on GPU:0" in text


def test_no_per_step_peak_is_said():
    frame, spikes = record(steady([40, 40, 300, 40, 40]), per_step_peak=False)
    text = summarize(frame, spikes)
    assert "300 MiB at most on GPU:0 (epoch 0 batch 2)" in text


def test_host_has_no_limit():
    frame, spikes = record(steady([5] * 8, in_use=900), device="host", sources=HOST)
    text = summarize(frame, spikes)
    assert "host: peak 905 MiB" in text
    assert "limit: not recorded for the host, so no headroom" in text
    assert "no spikes" in text


def test_many_spikes_are_listed_briefly():
    working = [40] * 6 + [400, 40] * 15
    frame, spikes = record(steady(working))
    text = summarize(frame, spikes)
    assert "15 spike(s)" in text and "... and 3 more" in text


def test_empty_record():
    frame, spikes = record([])
    assert summarize(frame, spikes) == "keras_memwatch: no samples recorded."


# -- through MemWatch -------------------------------------------------------

def test_memwatch_summary_includes_the_breakdown():
    watch = MemWatch(probes="host", verbose=0)
    model = tiny_model()  # Dense 8 -> 16 -> 1: 161 float32 weights, Adam
    x, y = tiny_data(64)
    model.fit(x, y, epochs=1, batch_size=16, callbacks=[watch], verbose=0)
    text = watch.summary()
    assert "weights:              644 B (161 parameters" in text
    assert "Adam keeps 2 slots per weight" in text
    assert "host: peak" in text


# -- several processes ----------------------------------------------------------


def as_process(frame, process, host, log=None):
    frame = frame.copy()
    frame["process"], frame["hostname"] = process, host
    if log is not None:
        frame["log"] = log
    return frame


def two_processes():
    """Process 0: 920 MiB at most of 16 GiB, two spikes; process 1: 1540 MiB
    of 2 GiB, none."""
    zero, _ = record(steady(WORKING))
    one, _ = record(steady([40] * 16, in_use=1500), limit=2 * GIB)
    return pd.concat([as_process(one, 1, "node-b", "mem.rank1.csv"),
                      as_process(zero, 0, "node-a", "mem.rank0.csv")],
                     ignore_index=True)


def test_one_section_per_process_then_the_comparison():
    text = report_text(two_processes())
    assert text.startswith("keras_memwatch report: 2 process(es) on 2 host(s), 2 log(s)\n")
    zero = text.index("== process 0 on node-a (mem.rank0.csv) ==\nkeras_memwatch summary:")
    one = text.index("== process 1 on node-b (mem.rank1.csv) ==\nkeras_memwatch summary:")
    assert zero < one < text.index("Across processes:")
    # Each section is that process's own summary.
    assert "GPU:0: peak 920 MiB" in text[zero:one]
    assert "GPU:0: peak 1.50 GiB" in text[one:]


def test_comparison_peaks_spikes_imbalance_and_closest_to_the_limit():
    lines = compare_processes(two_processes()).splitlines()
    assert lines[:2] == ["Across processes:",
                         "  Peak per process and device (training steps):"]
    assert lines[2].split() == ["process", "host", "device", "peak", "at", "epoch/batch",
                                "(step)", "limit", "used", "at", "peak", "spikes"]
    assert lines[3].split() == ["0", "node-a", "GPU:0", "920", "MiB", "0/13", "(14)",
                                "16.00", "GiB", "5.6%", "2"]
    assert lines[4].split() == ["1", "node-b", "GPU:0", "1.50", "GiB", "0/0", "(1)",
                                "2.00", "GiB", "75.2%", "0"]
    assert lines[5:8] == [
        "  Spikes per process:",
        "    process 0 on node-a: 2 (GPU:0: 2); worst 920 MiB on GPU:0 at epoch 0 batch 13",
        "    process 1 on node-b: none"]
    # 1540 / 920 = 1.67
    assert lines[8] == ("  Imbalance between processes: 1.67x (largest: process 1 on "
                        "node-b, GPU:0 1.50 GiB; smallest: process 0 on node-a, GPU:0 "
                        "920 MiB)")
    assert lines[9] == ("  Closest to its limit: process 1 on node-b, GPU:0: peak 1.50 GiB "
                        "at epoch/batch 0/0 (1), 75.2% of its limit 2.00 GiB (headroom "
                        "508 MiB)")


def test_without_limits_the_largest_peak_is_named():
    zero, _ = record(steady([5] * 8, in_use=900), device="host", sources=HOST)
    one, _ = record(steady([5] * 8, in_use=950), device="host", sources=HOST)
    frame = pd.concat([as_process(zero, 0, "h"), as_process(one, 1, "h")])
    text = compare_processes(frame)
    assert "Imbalance between processes: 1.06x" in text
    assert ("Closest to its limit: no device reported a limit (the host records "
            "none), so the processes cannot be ranked by headroom; the largest "
            "peak: process 1 on h, host: peak 955 MiB") in text


def test_one_process_reads_as_before_and_two_fits_get_two_sections():
    frame, spikes = gpu_record()
    assert report_text(frame) == summarize(frame, spikes)
    fits = pd.concat([as_process(frame, 0, "h", "mem.csv"),
                      as_process(frame, 0, "h", "mem.1.csv")], ignore_index=True)
    assert [label for label, _ in process_groups(fits)] == [
        "process 0 on h (mem.csv)", "process 0 on h (mem.1.csv)"]
    text = report_text(fits)
    assert "== process 0 on h (mem.1.csv) ==" in text
    assert "Across processes" not in text  # one process: nothing to compare


def test_the_plan_and_the_reserve_are_in_the_summary():
    frame, spikes = gpu_record()
    frame["plan_bytes"] = pd.array([pd.NA] + [600 * MIB] * 14 + [9000 * MIB, 600 * MIB],
                                   dtype="Int64")
    frame["allocator_reserved_bytes"] = frame["current_bytes"] + 96 * MIB
    text = summarize(frame, spikes)
    assert "    XLA plan of a step: 600 MiB typical, 8.79 GiB at most (2 distinct plan(s))" in text
    assert ("    reserved by the allocator: 596 MiB at most; reserved but unallocated: "
            "96.0 MiB at most") in text
