"""The sampler turns probe readings into rows and contains probe faults."""

import logging

import pytest

from keras_memwatch import columns as C
from keras_memwatch.record.probes.base import Probe, ProbeUnavailable
from keras_memwatch.record.probes.host import HostProbe
from keras_memwatch.record.sampler import Sampler


class Unavailable(Probe):
    name = "nothing"
    columns = (C.NVML_USED,)

    def start(self):
        raise ProbeUnavailable("no such device here")

    def read(self):
        raise AssertionError("never read")


class Nvml(Probe):
    name = "nvmlfake"
    columns = (C.NVML_USED, C.NVML_TOTAL, C.PROCESS)

    def start(self):
        return ("GPU:0",)

    def read(self):
        return ((5000, 80000, 3000),)


def test_rows_merge_probes_of_the_same_device(fake_probe_cls):
    sampler = Sampler([fake_probe_cls([(1000, 1500)]), Nvml(), HostProbe()])
    assert sampler.start() == ("GPU:0", "host")
    gpu, host = sampler.sample()
    assert gpu[C.ALLOCATOR_CURRENT] == 1000
    assert gpu[C.PROCESS] == 3000
    assert gpu["current_bytes"] == 1000  # allocator before NVML
    assert gpu["peak_bytes"] == 1500
    assert host["current_bytes"] == host[C.HOST_RSS] > 0
    assert sampler.device_columns["GPU:0"] == (
        C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK, C.ALLOCATOR_LIMIT,
        C.NVML_USED, C.NVML_TOTAL, C.PROCESS)


def test_without_a_per_sample_peak_the_peak_is_missing_not_the_current(fake_probe_cls):
    probe = fake_probe_cls([(1000, 9000)])
    probe.peak_per_sample = False  # a high-water mark, as JAX gives
    sampler = Sampler([probe])
    sampler.start()
    assert sampler.per_step_peak == (False,)
    (row,) = sampler.sample()
    assert row[C.ALLOCATOR_PEAK] == 9000  # recorded as is
    assert row["current_bytes"] == 1000 and row["peak_bytes"] is None


def test_nvml_process_bytes_stand_in_when_no_allocator():
    sampler = Sampler([Nvml()])
    sampler.start()
    (row,) = sampler.sample()
    assert row["current_bytes"] == 3000
    assert row["peak_bytes"] is None  # NVML has no peak


def test_unavailable_probe_is_left_out_with_its_reason(memwatch_logs):
    sampler = Sampler([Unavailable(), HostProbe()])
    assert sampler.start() == ("host",)
    assert sampler.notes["nothing"] == "unavailable: no such device here"
    assert "no such device here" in memwatch_logs.text


def test_failing_probe_gives_missing_values_and_warns_once(fake_probe_cls, memwatch_logs):
    probe = fake_probe_cls([RuntimeError("driver reset"), (1, 2), RuntimeError("again")])
    sampler = Sampler([probe, HostProbe()])
    sampler.start()
    rows = [sampler.sample() for _ in range(3)]
    assert [r[0].get(C.ALLOCATOR_CURRENT) for r in rows] == [None, 1, None]
    assert all(r[1][C.HOST_RSS] for r in rows)
    warnings = [r for r in memwatch_logs.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "driver reset" in warnings[0].getMessage()


@pytest.mark.parametrize("garbage", [-5, float("nan"), "12", 1.5, True, object()])
def test_garbage_values_are_recorded_as_missing(fake_probe_cls, garbage, memwatch_logs):
    sampler = Sampler([fake_probe_cls([(garbage, 10)])])
    sampler.start()
    (row,) = sampler.sample()
    assert row[C.ALLOCATOR_CURRENT] is None
    assert row[C.ALLOCATOR_PEAK] == 10
    assert "invalid allocator_current_bytes" in memwatch_logs.text


def test_numpy_integers_are_accepted(fake_probe_cls):
    import numpy as np

    sampler = Sampler([fake_probe_cls([(np.int64(7), np.uint64(9))])])
    sampler.start()
    (row,) = sampler.sample()
    assert (row[C.ALLOCATOR_CURRENT], row[C.ALLOCATOR_PEAK]) == (7, 9)


def test_probe_failing_in_a_row_is_switched_off(fake_probe_cls, memwatch_logs):
    probe = fake_probe_cls([RuntimeError("gone")])
    sampler = Sampler([probe], max_failures=3)
    sampler.start()
    for _ in range(10):
        sampler.sample()
    assert probe.calls == 3
    assert "switched off" in sampler.notes["fake"]
    assert "failed 3 times in a row" in memwatch_logs.text


def test_wrong_number_of_readings_is_a_probe_failure(fake_probe_cls):
    probe = fake_probe_cls([(1, 2)])
    probe.read = lambda: ()
    sampler = Sampler([probe])
    sampler.start()
    (row,) = sampler.sample()
    assert row["current_bytes"] is None


def test_a_high_water_mark_counts_as_peak_only_when_it_rises(fake_probe_cls):
    readings = [(100, 5000), (100, 5000), (120, 9000), (110, 9000), (130, 9000)]
    probe = fake_probe_cls(readings)
    probe.peak_per_sample = False  # JAX: peak_bytes_in_use never resets
    sampler = Sampler([probe])
    sampler.start()
    peaks = [sampler.sample()[0]["peak_bytes"] for _ in readings]
    # First sample: the mark predates the fit. Third: it rose to 9000
    # between two samples, so that interval's peak is exactly 9000; the
    # others' peaks are unknown.
    assert peaks == [None, None, 9000, None, None]


def test_a_probe_with_a_minimum_interval_is_read_at_most_that_often(fake_probe_cls):
    probe = fake_probe_cls([(1, 2)])
    probe.min_interval_s = 3600.0
    sampler = Sampler([probe])
    sampler.start()
    rows = [sampler.sample()[0] for _ in range(3)]
    assert probe.calls == 1
    assert [r["current_bytes"] for r in rows] == [1, None, None]


class EveryGpu(Probe):
    """NVML's view: every GPU of the machine, used by this process or not."""

    name = "everygpu"
    columns = (C.NVML_USED, C.NVML_TOTAL, C.PROCESS)
    sees_all_gpus = True

    def start(self):
        return ("GPU:0", "GPU:1")

    def read(self):
        return ((5000, 80000, None), (7000, 80000, 3000))


def test_a_probe_of_every_gpu_keeps_only_the_gpus_the_framework_uses(fake_probe_cls):
    # One process of a distributed run, on GPU:1 of a two-GPU machine.
    sampler = Sampler([fake_probe_cls([(1000, 1500)], device="GPU:1"), EveryGpu()])
    assert sampler.start() == ("GPU:1",)
    (row,) = sampler.sample()
    assert row[C.NVML_USED] == 7000 and row[C.PROCESS] == 3000


def test_without_a_framework_probe_every_gpu_is_kept():
    sampler = Sampler([EveryGpu(), HostProbe()])
    assert sampler.start() == ("GPU:0", "GPU:1", "host")
