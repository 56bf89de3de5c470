"""On JAX a step's peak is the memory in use between steps plus its plan:
a reading that holds a step still in flight never counts twice."""

from __future__ import annotations

import numpy as np

from conftest import GPU_SOURCES, block_of
from keras_memwatch import columns as C
from keras_memwatch.judge.derived import (SettledInUse, in_use_before,
                                          spikes_from_frame)
from keras_memwatch.judge.detector import SpikeSettings
from keras_memwatch.judge.spikes import SpikeMonitor
from keras_memwatch.record.block import MISSING, table_columns
from keras_memwatch.record.recorder import Recorder

MIB = 2**20
STATE = 100 * MIB  # in use between steps
IN_FLIGHT = 600 * MIB  # what a reading holds when it catches a step in flight


def test_the_settled_in_use_is_the_lowest_reading_since_the_call_began():
    settled = SettledInUse()
    readings = [STATE, STATE + IN_FLIGHT, STATE + IN_FLIGHT, None, STATE]
    assert [settled.push(r) for r in readings] == [STATE] * 5
    # On a busy GPU every reading after the first may hold a step in
    # flight (seen on an H200): none of them is counted again.
    assert [settled.push(STATE + IN_FLIGHT) for _ in range(100)] == [STATE] * 100
    assert SettledInUse().push(None) is None


def readings(n, every=3):
    """In use between steps, and every `every`-th reading a step in flight."""
    return [STATE + (IN_FLIGHT if i % every == every - 1 else 0) for i in range(n)]


def test_planned_peaks_never_hold_a_step_in_flight():
    n = 30
    current = readings(n + 1)
    working = [400 * MIB if b % 7 == 6 else 40 * MIB for b in range(n)]
    high_water = np.maximum.accumulate(np.array(current) + 2 * MIB)
    samples = [(i, 0, None if i == 0 else i - 1, "train", i * 0.1,
                [{C.ALLOCATOR_CURRENT: current[i], C.ALLOCATOR_PEAK: int(high_water[i]),
                  "current_bytes": current[i]}]) for i in range(n + 1)]
    peak_at = table_columns(GPU_SOURCES).index(C.ALLOCATOR_PEAK)
    monitor = SpikeMonitor(("GPU:0",), SpikeSettings(50, 1.5, 64, 5), alert=False,
                           planned=("GPU:0",), per_step_peak=[False], peak_at=[peak_at])
    recorder = Recorder()
    recorder.reset({"GPU:0": GPU_SOURCES})
    for start in range(0, n + 1, 8):  # blocks of 8 samples, as the pipeline hands them
        block = block_of(samples[start:start + 8], [GPU_SOURCES])
        plans = np.full((2, len(block)), MISSING, np.int64)
        for k, batch in enumerate(block.batch.tolist()):
            if batch >= 0:
                plans[:, k] = 50 * MIB + working[batch], working[batch]
        monitor.judge(block, block.batch >= 0, plans)
        recorder.extend(block)
    frame = recorder.to_dataframe()
    steps = frame[frame["batch"].notna()]
    assert steps["peak_bytes"].tolist() == [STATE + w for w in working]
    assert (steps["peak_bytes"] <= steps["current_bytes"] + steps[C.PLAN]).all()
    # Every output reads the same memory in use before a step.
    assert in_use_before(frame)[steps.index].tolist() == [STATE] * n
    assert spikes_from_frame(frame)["working_bytes"].tolist() == [400 * MIB] * 4
    assert [e.peak_bytes for e in monitor.events] == [STATE + 400 * MIB] * 4
    assert [e.batch for e in monitor.events] == [6, 13, 20, 27]
