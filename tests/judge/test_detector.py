"""Specification of SpikeDetector and DriftMonitor, on synthetic traces.

Traces are in bytes: a 200 MiB baseline with +-2% noise unless stated, and
spikes to 1.3 GiB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import numpy as np
import pytest

from keras_memwatch.judge.detector import SpikeDetector
from keras_memwatch.judge.drift import DriftMonitor
from keras_memwatch.judge.events import DriftEvent
from keras_memwatch.units import MIB, format_bytes

BASE = 200 * MIB
SPIKE = 1331 * MIB  # 1.3 GiB


def noise(n: int, seed: int, base: float = BASE, rel: float = 0.02) -> list:
    """`n` samples around `base`, uniform within +-`rel`, as Python ints."""
    rng = np.random.RandomState(seed)
    return (base * (1 + rng.uniform(-rel, rel, n))).astype(np.int64).tolist()


def with_spikes(trace: list, indices: Sequence[int], value: float = SPIKE):
    trace = list(trace)
    for i in indices:
        trace[i] = value
    return trace


def flagged(detector: SpikeDetector, trace: Sequence) -> list[int]:
    return [i for i, value in enumerate(trace) if detector.update(value)]


def sawtooth(n: int) -> list:
    """Allocator sawtooth: ramps 200 -> 260 MiB over 21 samples, drops."""
    return [int((200 + 3 * (i % 21)) * MIB) for i in range(n)]


def leak(n: int, seed: int, per_sample_mb: float = 0.5) -> list:
    growth = np.arange(n) * per_sample_mb * MIB
    return (np.array(noise(n, seed)) + growth).astype(np.int64).tolist()


# --- warm-up and the baseline ------------------------------------------------


def test_warmup_values_are_recorded_not_judged():
    detector = SpikeDetector(warmup=5)
    # Even absurd values are not judged during warm-up.
    for value in [BASE, 10 * SPIKE, BASE, BASE, BASE]:
        assert detector.update(value) is False
        assert detector.baseline is None
    # The sixth value is judged against the median of the first five.
    assert detector.update(SPIKE) is True
    assert detector.baseline == BASE


def test_warmup_zero_still_cannot_judge_the_first_value():
    detector = SpikeDetector(warmup=0)
    assert detector.update(BASE) is False
    assert detector.baseline is None
    assert detector.update(SPIKE) is True
    assert detector.baseline == BASE


def test_baseline_is_the_median_of_the_last_window_non_spike_values():
    trace = with_spikes(noise(400, seed=3), range(20, 400, 7))
    detector = SpikeDetector(window=50)
    kept: list = []  # values that were not spikes, in order
    for i, value in enumerate(trace):
        spike = detector.update(value)
        if i >= 5:
            assert detector.baseline == np.median(kept[-50:])
        assert spike == (i >= 20 and (i - 20) % 7 == 0)
        if not spike:
            kept.append(value)


def test_spikes_do_not_enter_the_baseline():
    # A third of all samples are spikes; the baseline does not move.
    trace = with_spikes(noise(600, seed=4), range(10, 600, 3))
    detector = SpikeDetector()
    baselines = []
    for value in trace:
        detector.update(value)
        baselines.append(detector.baseline)
    assert flagged(SpikeDetector(), trace) == list(range(10, 600, 3))
    assert all(abs(b - BASE) < 0.01 * BASE for b in baselines[5:])


def test_odd_and_even_windows_give_an_exact_median():
    detector = SpikeDetector(window=4, warmup=4)
    for value in [100 * MIB, 400 * MIB, 200 * MIB, 300 * MIB]:
        detector.update(value)
    detector.update(260 * MIB)
    assert detector.baseline == 250 * MIB  # (200 + 300) / 2
    detector.update(250 * MIB)  # 100 MiB drops out: 400, 200, 300, 260
    assert detector.baseline == 280 * MIB


# --- spikes ------------------------------------------------------------------


@pytest.mark.parametrize("warmup", [0, 5])
def test_isolated_spikes_of_one_to_three_samples_are_all_flagged(warmup):
    # 125 comes right after a 3-sample spike: that spike was not taken for a
    # new level, even with the shortest plateau_length (4).
    spikes = [37, 74, 75, 120, 121, 122, 125, 200, 250, 251, 252, 280, 281]
    trace = with_spikes(noise(300, seed=0), spikes)
    assert flagged(SpikeDetector(warmup=warmup), trace) == spikes


@pytest.mark.parametrize("period", [15, 20])
def test_periodic_spikes_are_flagged_every_time(period):
    spikes = list(range(period - 1, 2000, period))
    trace = with_spikes(noise(2000, seed=period), spikes)
    assert flagged(SpikeDetector(), trace) == spikes


def test_periodic_three_sample_bursts_are_flagged_every_time():
    spikes = [i for i in range(1000) if i % 15 in (12, 13, 14)]
    trace = with_spikes(noise(1000, seed=5), spikes)
    assert flagged(SpikeDetector(), trace) == spikes


def test_spikes_are_judged_against_their_own_scale():
    spikes = [60, 130, 131]
    trace = with_spikes(noise(200, seed=6, base=4 * 2**30), spikes, 9 * 2**30)
    assert flagged(SpikeDetector(), trace) == spikes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noise_is_never_flagged(seed):
    trace = noise(3000, seed=seed, rel=0.05)
    assert flagged(SpikeDetector(), trace) == []


def test_allocator_sawtooth_is_never_flagged_but_spikes_on_it_are():
    assert flagged(SpikeDetector(), sawtooth(2000)) == []
    spikes = [100, 333, 334, 1000]
    trace = with_spikes(sawtooth(2000), spikes)
    assert flagged(SpikeDetector(), trace) == spikes


def test_small_model_jumps_under_min_delta_are_never_flagged():
    # 2 MiB -> 40 MiB is 20x, but only 38 MiB: under min_delta_mb=64.
    trace = noise(100, seed=7, base=2 * MIB) + noise(200, seed=8, base=40 * MIB)
    trace = with_spikes(trace, [150, 220], 60 * MIB)
    detector = SpikeDetector()
    assert flagged(detector, trace) == []
    # These jumps are not spikes, so the median follows the new level.
    assert detector.baseline == pytest.approx(40 * MIB, rel=0.02)


def test_a_spike_must_exceed_both_threshold_and_min_delta():
    def judge(base: float, value: float, **kwargs) -> bool:
        detector = SpikeDetector(warmup=1, **kwargs)
        detector.update(base)
        return detector.update(value)

    gib = 2**30
    # Ratio 1.2 (under 1.5) although 205 MiB more than the baseline.
    assert judge(gib, 1.2 * gib) is False
    assert judge(gib, 1.2 * gib, threshold=1.1) is True
    # Ratio 20 although only 38 MiB more than the baseline.
    assert judge(2 * MIB, 40 * MIB) is False
    assert judge(2 * MIB, 40 * MIB, min_delta_mb=16) is True
    # "Exceeds" is strict on both counts.
    assert judge(gib, 1.5 * gib) is False
    assert judge(gib, 1.5 * gib + 1) is True
    assert judge(100 * MIB, 164 * MIB) is False
    assert judge(100 * MIB, 164 * MIB + 1) is True


# --- a new level -------------------------------------------------------------


@pytest.mark.parametrize(
    "window, warmup, plateau_length",
    [(50, 5, 5), (50, 0, 4), (50, 3, 4), (50, 10, 10), (8, 20, 8), (3, 0, 3)],
)
def test_level_shift_is_flagged_for_plateau_length_samples_then_followed(
    window, warmup, plateau_length
):
    # 200 MiB -> 900 MiB at sample 100, forever.
    trace = noise(100, seed=10) + noise(400, seed=11, base=900 * MIB)
    detector = SpikeDetector(window=window, warmup=warmup)
    assert detector.plateau_length == plateau_length
    assert flagged(detector, trace) == list(range(100, 100 + plateau_length))
    assert detector.baseline == pytest.approx(900 * MIB, rel=0.02)


def test_new_level_is_followed_and_spikes_above_it_are_flagged():
    trace = noise(100, seed=12) + noise(400, seed=13, base=900 * MIB)
    trace = with_spikes(trace, [40, 300, 301], 3 * 2**30)
    detector = SpikeDetector()
    assert flagged(detector, trace) == [40, 100, 101, 102, 103, 104, 300, 301]


@pytest.mark.parametrize("seed", range(6))
def test_borderline_noisy_level_stops_being_flagged_within_plateau_length(
    seed,
):
    # 300 MiB +-2% against 200 MiB: about half its samples are over the
    # 1.5x line. Samples under it still continue the elevated run.
    trace = noise(100, seed=seed) + noise(900, seed=seed + 100, base=300 * MIB)
    detector = SpikeDetector()
    flags = flagged(detector, trace)
    assert flags, "the new level is flagged at first"
    assert flags[-1] < flags[0] + detector.plateau_length
    assert detector.baseline == pytest.approx(300 * MIB, rel=0.02)


def test_level_that_never_settles_is_accepted_after_window_samples():
    # After the shift, every 5 samples are 900, 900, 900, 1500, 1500 MiB:
    # no 5 consecutive samples agree, so the run is accepted whole at
    # `window` samples; its median is 900 MiB, above which the 1500 MiB
    # pairs are spikes again.
    pattern = [900 * MIB] * 3 + [1500 * MIB] * 2
    trace = noise(100, seed=14) + pattern * 40
    detector = SpikeDetector(window=20)
    flags = flagged(detector, trace)
    assert flags[:20] == list(range(100, 120))
    assert flags[20:] == [i for i in range(120, 300) if (i - 100) % 5 >= 3]
    assert detector.baseline == 900 * MIB


def test_burst_longer_than_plateau_length_is_flagged_for_its_start():
    trace = with_spikes(noise(300, seed=15), range(100, 112))
    trace = with_spikes(trace, [150, 151])
    detector = SpikeDetector()
    assert flagged(detector, trace) == [100, 101, 102, 103, 104, 150, 151]
    assert detector.baseline == pytest.approx(BASE, rel=0.02)


def test_level_shift_and_periodic_spikes_together():
    spikes = list(range(14, 400, 15))
    trace = noise(200, seed=16) + noise(200, seed=17, base=900 * MIB)
    trace = with_spikes(trace, spikes, 3 * 2**30)
    expected = sorted(set(spikes) | set(range(200, 205)))
    assert flagged(SpikeDetector(), trace) == expected


# --- leaks -------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_slow_leak_is_not_a_stream_of_spikes(seed):
    # +0.5 MiB per sample: 200 MiB -> 700 MiB over 1000 samples.
    assert flagged(SpikeDetector(), leak(1000, seed)) == []


def test_leak_is_reported_once_per_epoch_by_drift_monitor():
    trace = leak(1000, seed=0)
    detector, drift = SpikeDetector(), DriftMonitor()
    events: list[Optional[DriftEvent]] = []
    baselines: list[list] = []
    for epoch in range(4):
        epoch_baselines = []
        for value in trace[250 * epoch : 250 * (epoch + 1)]:
            detector.update(value)
            drift.update(detector.baseline)
            if detector.baseline is not None:
                epoch_baselines.append(detector.baseline)
        baselines.append(epoch_baselines)
        events.append(drift.end_epoch())

    assert all(event is not None for event in events)
    for event, seen in zip(events, baselines):
        assert event.start_bytes == seen[0]
        assert event.end_bytes == seen[-1]
        assert event.n_batches == len(seen)
        assert event.n_epochs == 1
        assert (event.end_bytes - event.start_bytes) == pytest.approx(125 * MIB, rel=0.15)
        assert event.message == (
            f"baseline grew from {format_bytes(seen[0])} "
            f"to {format_bytes(seen[-1])} over {len(seen)} batches"
        )
    assert [e.n_batches for e in events] == [245, 250, 250, 250]


def test_drift_event_message():
    drift = DriftMonitor()
    for i in range(300):
        drift.update((190 + i * 230 / 299) * MIB)
    event = drift.end_epoch()
    assert event.message == (
        "baseline grew from 190 MiB to 420 MiB over 300 batches"
    )
    assert DriftEvent(190 * MIB, 1.31 * 2**30, 900, n_epochs=3).message == (
        "baseline grew from 190 MiB to 1.31 GiB over 3 epochs (900 batches)"
    )


def test_drift_event_is_frozen():
    event = DriftEvent(1, 2, 3)
    with pytest.raises(AttributeError):
        event.start_bytes = 0


def test_level_shift_is_not_a_leak():
    # 200 -> 900 MiB in the middle of epoch 1, flat after.
    trace = noise(375, seed=20) + noise(1125, seed=21, base=900 * MIB)
    detector, drift = SpikeDetector(), DriftMonitor()
    events = []
    for epoch in range(6):
        for value in trace[250 * epoch : 250 * (epoch + 1)]:
            detector.update(value)
            drift.update(detector.baseline)
        events.append(drift.end_epoch())
    assert events == [None] * 6


@pytest.mark.parametrize(
    "trace",
    [noise(2500, seed=22, rel=0.05), sawtooth(2500)],
    ids=["noise", "sawtooth"],
)
def test_flat_traces_never_drift(trace):
    detector, drift = SpikeDetector(), DriftMonitor()
    events = []
    for epoch in range(10):
        for value in trace[250 * epoch : 250 * (epoch + 1)]:
            detector.update(value)
            drift.update(detector.baseline)
        events.append(drift.end_epoch())
    assert events == [None] * 10


def test_growth_under_min_delta_is_not_a_leak():
    drift = DriftMonitor(min_delta_mb=64)
    for i in range(300):
        drift.update(BASE + i * 60 / 299 * MIB)
    assert drift.end_epoch() is None


def test_slow_growth_across_epochs_is_reported_from_the_third_epoch():
    # +30 MiB per epoch, under min_delta_mb in any one epoch.
    drift = DriftMonitor(min_delta_mb=64)
    events = []
    for epoch in range(5):
        for i in range(250 * epoch, 250 * (epoch + 1)):
            drift.update(BASE + i * 30 / 250 * MIB)
        events.append(drift.end_epoch())
    assert events[:2] == [None, None]
    assert events[2] == DriftEvent(
        BASE, BASE + 749 * 30 / 250 * MIB, 750, n_epochs=3
    )
    assert events[2].message == (
        "baseline grew from 200 MiB to 290 MiB over 3 epochs (750 batches)"
    )
    assert events[3].start_bytes == BASE + 250 * 30 / 250 * MIB
    assert events[4] is not None


def test_a_jump_every_epoch_is_a_leak_across_epochs():
    # +100 MiB in the middle of every epoch: each epoch alone is one jump.
    drift = DriftMonitor()
    events = []
    for epoch in range(4):
        for i in range(250):
            level = epoch + (i >= 125)
            drift.update(BASE + level * 100 * MIB)
        events.append(drift.end_epoch())
    assert events[:2] == [None, None]
    assert events[2] == DriftEvent(BASE, BASE + 300 * MIB, 750, n_epochs=3)
    assert events[3] == DriftEvent(
        BASE + 100 * MIB, BASE + 400 * MIB, 750, n_epochs=3
    )


def test_across_epochs_the_baseline_must_rise_in_each_epoch():
    # One jump, then a creep of 1 MiB per epoch: most of it is one epoch.
    drift = DriftMonitor()
    events = []
    for epoch in range(6):
        for i in range(250):
            jump = 700 if epoch > 0 or i >= 125 else 0
            drift.update(BASE + (jump + epoch) * MIB)
        events.append(drift.end_epoch())
    assert events == [None] * 6
    # +100 MiB jumps in epochs 0, 2, 3 and 4; epoch 1 is flat.
    drift = DriftMonitor()
    events = []
    level = 0
    for epoch in range(5):
        for i in range(250):
            if i == 125 and epoch in (0, 2, 3, 4):
                level += 100
            drift.update(BASE + level * MIB)
        events.append(drift.end_epoch())
    assert events[:4] == [None] * 4
    assert events[4] == DriftEvent(BASE + 100 * MIB, BASE + 400 * MIB, 750, 3)


def test_drift_monitor_ignores_missing_baselines_and_resets():
    drift = DriftMonitor()
    for _ in range(10):
        drift.update(None)
        drift.update(math.nan)
    assert drift.end_epoch() is None  # an epoch without any baseline
    for i in range(100):
        drift.update(None if i % 2 else BASE + i * MIB)
    event = drift.end_epoch()
    assert (event.start_bytes, event.end_bytes) == (BASE, BASE + 98 * MIB)
    assert event.n_batches == 50
    for i in range(100):
        drift.update(BASE + i * MIB)
    drift.reset()
    assert drift.end_epoch() is None


# --- missing values, reset and arguments -------------------------------------


@pytest.mark.parametrize("missing", [None, math.nan, np.nan, np.float64("nan")])
def test_missing_values_are_not_judged(missing):
    detector = SpikeDetector(warmup=5)
    # Missing values do not count towards warm-up.
    for value in [missing, BASE, missing, BASE, BASE, BASE, BASE]:
        assert detector.update(value) is False
    assert detector.baseline is None
    assert detector.update(SPIKE) is True
    assert detector.baseline == BASE
    assert detector.update(missing) is False
    assert detector.baseline == BASE  # unchanged


def test_missing_values_inside_a_trace_change_nothing():
    spikes = [37, 74, 75, 120, 121, 122]
    trace = with_spikes(noise(300, seed=23), spikes)
    trace = trace[:150] + noise(150, seed=24, base=900 * MIB)
    expected = spikes + [150, 151, 152, 153, 154]
    assert flagged(SpikeDetector(), trace) == expected

    gappy: list = []
    for value in trace:  # a missing value after every 3rd sample
        gappy.append(value)
        if len(gappy) % 4 == 3:
            gappy.append(None if len(gappy) % 8 == 3 else math.inf)
    detector = SpikeDetector()
    kept = [i for i, value in enumerate(gappy) if detector.update(value)]
    assert [gappy[i] for i in kept] == [trace[i] for i in expected]


def test_reset_starts_over():
    trace = with_spikes(noise(200, seed=25), [50, 51]) + [900 * MIB] * 20
    detector = SpikeDetector()
    first = flagged(detector, trace)
    assert first == [50, 51, 200, 201, 202, 203, 204]
    detector.reset()
    assert detector.baseline is None
    assert detector.update(SPIKE) is False  # warm-up again
    detector.reset()
    assert flagged(detector, trace) == first


def test_numpy_values_are_accepted_and_results_are_bools():
    trace = np.array(with_spikes(noise(100, seed=26), [60]), dtype=np.int64)
    detector = SpikeDetector()
    results = [detector.update(value) for value in trace]
    assert all(type(result) is bool for result in results)
    assert [i for i, r in enumerate(results) if r] == [60]


def test_properties_and_repr():
    detector = SpikeDetector(window=30, threshold=2, min_delta_mb=16, warmup=7)
    assert (detector.window, detector.threshold) == (30, 2.0)
    assert (detector.min_delta_mb, detector.warmup) == (16.0, 7)
    assert detector.plateau_length == 7
    assert repr(detector) == (
        "SpikeDetector(window=30, threshold=2, min_delta_mb=16, warmup=7)"
    )


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"window": 0}, ValueError, "Expected `window` to be a positive "
         "integer. Received: window=0"),
        ({"window": -3}, ValueError, "Received: window=-3"),
        ({"window": 2.5}, TypeError, "Received: window=2.5"),
        ({"window": True}, TypeError, "Received: window=True"),
        ({"window": "50"}, TypeError, "Received: window='50'"),
        ({"threshold": 1}, ValueError, "Expected `threshold` to be a number "
         "greater than 1. Received: threshold=1"),
        ({"threshold": 0.5}, ValueError, "Received: threshold=0.5"),
        ({"threshold": math.inf}, ValueError, "Received: threshold=inf"),
        ({"threshold": True}, TypeError, "Received: threshold=True"),
        ({"threshold": None}, TypeError, "Received: threshold=None"),
        ({"min_delta_mb": -1}, ValueError, "Expected `min_delta_mb` to be a "
         "non-negative number. Received: min_delta_mb=-1"),
        ({"min_delta_mb": math.nan}, ValueError, "Received: min_delta_mb=nan"),
        ({"min_delta_mb": False}, TypeError, "Received: min_delta_mb=False"),
        ({"warmup": -1}, ValueError, "Expected `warmup` to be a non-negative "
         "integer. Received: warmup=-1"),
        ({"warmup": 5.0}, TypeError, "Received: warmup=5.0"),
        ({"warmup": True}, TypeError, "Received: warmup=True"),
    ],
)
def test_invalid_arguments_are_named(kwargs, error, message):
    with pytest.raises(error) as info:
        SpikeDetector(**kwargs)
    assert message in str(info.value)


def test_valid_edge_arguments():
    SpikeDetector(window=1, threshold=1.0001, min_delta_mb=0, warmup=0)
    SpikeDetector(
        window=np.int64(10), threshold=np.float64(2), warmup=np.int32(0)
    )


@pytest.mark.parametrize(
    "value, error",
    [
        (-1, ValueError),
        (math.inf, ValueError),
        (True, TypeError),
        ("64", TypeError),
    ],
)
def test_drift_monitor_validates_min_delta(value, error):
    with pytest.raises(error, match="`min_delta_mb`"):
        DriftMonitor(min_delta_mb=value)


def test_rolling_median_follows_the_last_window_values():
    from keras_memwatch.judge.detector import RollingMedian

    median = RollingMedian(3)
    assert [median.push(v) for v in (5, 1, 9, 7, 8, 2)] == [5, 3, 5, 7, 8, 7]


def block_trace(seed: int) -> np.ndarray:
    """Integer peaks with what a fit shows: noise, isolated spikes, bursts,
    a new level, and a fall back."""
    rng = np.random.default_rng(seed)
    trace = rng.normal(300, 6, 600) * MIB
    trace[rng.choice(600, 12, replace=False)] *= 3  # isolated spikes
    trace[200:208] *= 2.5  # a burst
    trace[350:450] += 400 * MIB  # a new level, then back
    return trace.astype(np.int64)


@pytest.mark.parametrize("window, warmup", [(50, 5), (7, 0), (4, 9)])
@pytest.mark.parametrize("block", [1, 3, 32, 600])
def test_a_block_at_a_time_judges_exactly_as_one_at_a_time(window, warmup, block):
    trace = block_trace(window + block)
    one = SpikeDetector(window, 1.5, 64, warmup)
    many = SpikeDetector(window, 1.5, 64, warmup)
    spikes, baselines = [], []
    for start in range(0, len(trace), block):
        s, b = many.update_many(trace[start:start + block])
        spikes += s.tolist()
        baselines += b.tolist()
    for value, spike, baseline in zip(trace.tolist(), spikes, baselines):
        assert one.update(value) == spike
        expected = math.nan if one.baseline is None else one.baseline
        assert baseline == pytest.approx(expected, nan_ok=True)
    assert many.baseline == one.baseline
    assert sum(spikes) > 12  # the trace has spikes to find


@pytest.mark.parametrize("block", [1, 5, 64])
def test_drift_fed_a_block_at_a_time_sees_what_it_sees_one_at_a_time(block):
    rng = np.random.default_rng(block)
    trace = ((rng.normal(300, 6, 600) + np.arange(600) / 2) * MIB).astype(np.int64)
    one, many = DriftMonitor(64, smooth=50), DriftMonitor(64, smooth=50)
    for start in range(0, len(trace), block):
        many.update_many(trace[start:start + block])
    for value in trace.tolist():
        one.update(value)
    assert many.end_epoch() == one.end_epoch() is not None
