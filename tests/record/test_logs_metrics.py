"""`mem_peak_mib` and `mem_current_mib` in Keras's logs, from raw reads."""

import pytest

from conftest import FakeProbe
from keras_memwatch.record.logs_metrics import LogsMetrics
from keras_memwatch.record.sampler import Sampler

MIB = 2**20
KEY = ("train", 0, 0)


def metrics_of(*probes):
    sampler = Sampler(list(probes))
    sampler.start()
    return sampler, LogsMetrics(sampler, 0, None)


@pytest.mark.parametrize("current, peak", [(100 * MIB, 300 * MIB), (100 * MIB, 0)])
def test_figures_are_the_main_device_current_and_peak_never_below_it(current, peak):
    sampler, metrics = metrics_of(FakeProbe([(current, peak)]))
    logs = {}
    metrics.add(KEY, sampler.read(), logs)
    assert logs == {"mem_current_mib": current / MIB,
                    "mem_peak_mib": max(current, peak) / MIB}


@pytest.mark.parametrize("reading", [(None, None), (-1, 5), ("lots", 5), (True, 5),
                                     RuntimeError("driver reset")])
def test_a_reading_that_is_not_a_byte_count_leaves_its_figure_out(reading):
    sampler, metrics = metrics_of(FakeProbe([reading]))
    logs = {"loss": 1.0}
    metrics.add(KEY, sampler.read(), logs)
    assert set(logs) <= {"loss", "mem_peak_mib"}
    assert all(isinstance(v, float) and v >= 0 for v in logs.values())


def test_a_probe_not_read_this_time_gives_no_figures():
    sampler, metrics = metrics_of(FakeProbe([(MIB, MIB)]))
    logs = {}
    metrics.add(KEY, [None], logs)
    assert logs == {}


def test_the_direct_path_and_the_general_one_agree():
    sampler, metrics = metrics_of(FakeProbe([(7 * MIB, 9 * MIB), (7 * MIB, 2 * MIB)]))
    for _ in range(2):
        raw = sampler.read()
        direct, general = {}, {}
        metrics.add(KEY, raw, direct)
        metrics._add(KEY, raw, general)
        assert metrics.add != metrics._add
        assert direct == general and direct
