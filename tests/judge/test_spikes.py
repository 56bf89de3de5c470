"""The spike monitor judges a block at a time exactly as a sample at a time."""

from __future__ import annotations

import numpy as np
import pytest

from keras_memwatch import columns as C
from keras_memwatch.record.block import BASELINE, MISSING, PEAK, PLAN, Block, table_columns
from keras_memwatch.judge.detector import SpikeSettings
from keras_memwatch.judge.spikes import SpikeMonitor

MIB = 2**20
GPU = (C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK)
HOST = (C.HOST_RSS, C.HOST_PEAK_RSS)


def scenario(n, seed):
    """Two devices as JAX shows them: a GPU whose peak is a high-water
    mark (so its peaks come from XLA's plans), the host with a resettable
    peak; missing values, spikes, a validation phase and compilations."""
    rng = np.random.default_rng(seed)
    gpu = np.full((n, 6), MISSING, np.int64)
    gpu[:, 1] = gpu[:, 4] = 500 * MIB + rng.integers(0, 4, n) * MIB
    gpu[:, 5] = np.maximum.accumulate(gpu[:, 4] + rng.integers(0, 50, n) * MIB)
    host = np.full((n, 6), MISSING, np.int64)
    host[:, 1] = host[:, 4] = 900 * MIB + rng.integers(0, 8, n) * MIB
    host[:, 0] = host[:, 5] = host[:, 4] + 40 * MIB
    host[rng.random(n) < 0.05, 0] *= 4  # spikes
    host[rng.random(n) < 0.03, :] = MISSING  # a failed read
    plans = np.full((2, n), MISSING, np.int64)
    planned = rng.random(n) < 0.9
    plans[0, planned] = 800 * MIB
    plans[1, planned] = np.where(rng.random(n) < 0.05, 900, 100)[planned] * MIB
    phase = np.where(rng.random(n) < 0.1, 1, 0).astype(np.int8)
    batch = np.arange(n) - 1
    compiled = rng.random(n) < 0.04
    return gpu, host, plans, phase, batch, compiled


def monitor():
    return SpikeMonitor(("GPU:0", "host"), SpikeSettings(20, 1.5, 64, 5), alert=False,
                        planned=("GPU:0",), per_step_peak=[False, True],
                        peak_at=[table_columns(GPU).index(C.ALLOCATOR_PEAK),
                                 table_columns(HOST).index(C.HOST_PEAK_RSS)])


def judged_in_blocks(n, seed, size):
    gpu, host, plans, phase, batch, compiled = scenario(n, seed)
    judge = monitor()
    for start in range(0, n, size):
        at = slice(start, start + size)
        part = Block(np.arange(n)[at], np.zeros(n, np.int64)[at], batch[at],
                     phase[at], np.zeros(n)[at], [gpu[at], host[at]],
                     [np.zeros(len(batch[at]), bool) for _ in range(2)])
        judge.judge(part, (part.phase == 0) & (part.batch >= 0), plans[:, at],
                    compiled[at])
    return gpu, host, judge


@pytest.mark.parametrize("size", [2, 7, 128, 600])
def test_judging_a_block_at_a_time_equals_a_sample_at_a_time(size):
    one_gpu, one_host, one = judged_in_blocks(600, 5, 1)
    gpu, host, many = judged_in_blocks(600, 5, size)
    np.testing.assert_array_equal(gpu, one_gpu)
    np.testing.assert_array_equal(host, one_host)
    assert many.events == one.events
    assert many.compiling == one.compiling
    for i in range(2):
        many.end_epoch(0)
        one.end_epoch(0)
    assert many.drift_events == one.drift_events


def test_the_scenario_has_something_to_judge():
    gpu, host, judge = judged_in_blocks(600, 5, 128)
    assert len(judge.events) > 10
    assert {e.device for e in judge.events} == {"GPU:0", "host"}
    assert judge.compiling[1] > 0 and judge.compiling[0] == 0
    assert (gpu[:, PLAN] >= 0).any() and (gpu[:, BASELINE] >= 0).any()
    assert (host[:, BASELINE] >= 0).any() and (host[:, PEAK] >= 0).any()
