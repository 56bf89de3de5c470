"""Figures derived from a record are defined once and agree with the live ones."""

from __future__ import annotations

import pandas as pd

from conftest import GPU, MIB, record, steady
from keras_memwatch.judge.derived import (
    device_limit, drift_from_frame, limit_of, log_sources, main_device,
    spikes_from_frame, working_memory, working_memory_of)

WORKING = [40, 41, 39, 40, 42, 40, 400, 41, 40, 39, 40, 41, 40, 420, 40, 40]


def gpu_record():
    return record(steady(WORKING))  # 500 MiB in use, steps of about 40 MiB


# -- one definition of each figure ------------------------------------------

def test_working_memory_is_the_peak_above_the_memory_in_use_before():
    assert working_memory(700, 500) == 200
    assert working_memory(400, 500) == 0  # memory freed during the step
    frame, _ = gpu_record()
    working = working_memory_of(frame.sort_values("step")) / MIB
    assert working.isna().iloc[0]  # nothing before train begin
    assert list(working.iloc[1:].astype(int)) == WORKING


def test_the_limit_is_the_allocators_else_the_devices_total():
    assert device_limit({"allocator_limit_bytes": 8, "nvml_total_bytes": 10}) == (
        8, "allocator_limit_bytes")
    assert device_limit({"allocator_limit_bytes": pd.NA, "nvml_total_bytes": 10}) == (
        10, "nvml_total_bytes")
    assert device_limit({"allocator_limit_bytes": 0}) == (None, None)
    frame, _ = record(steady([40] * 4), sources=GPU, limit=3 * MIB)
    assert limit_of(frame) == 3 * MIB
    frame, _ = record(steady([40] * 4), sources=GPU, limit=None)
    assert limit_of(frame) is None


def test_the_main_device_is_the_first_accelerator_else_the_host():
    assert main_device(["host", "GPU:1", "GPU:0"]) == "GPU:1"
    assert main_device(["host"]) == "host"
    assert main_device([]) is None


# -- a record alone (a streamed log) ----------------------------------------

def test_spikes_from_a_record_equal_the_live_ones():
    frame, spikes = gpu_record()
    pd.testing.assert_frame_equal(spikes_from_frame(frame), spikes, check_dtype=False)


def test_drift_from_a_record_equals_the_live_one():
    # In use grows by 2 MiB a step for 80 steps: a leak.
    readings = [(500 + 2 * i, 540 + 2 * i) for i in range(81)]
    frame, _, monitor = record(readings, monitor=True)
    assert monitor.drift_events == []  # MemWatch judges at the epoch's end:
    monitor.end_epoch(0)
    (live,) = monitor.drift_events
    assert drift_from_frame(frame) == [live]
    device, epoch, event = live
    assert (device, epoch) == ("GPU:0", 0) and (event.end_bytes - event.start_bytes) > 64 * MIB


def test_log_sources_name_the_columns_with_values():
    frame, _ = gpu_record()
    notes = log_sources(frame)
    assert notes["log"] == ("columns with values: allocator_current_bytes, "
                            "allocator_peak_bytes, allocator_limit_bytes")
    assert notes["log (empty columns)"].startswith(
        "unavailable: no values for allocator_reserved_bytes, nvml_used_bytes")
