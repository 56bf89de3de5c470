"""`mem_peak_mib` and `mem_current_mib` in Keras's logs, from raw reads."""

import pytest

from conftest import FakeProbe
from keras_memwatch.judge.step_plan import StepPlan
from keras_memwatch.session.logs_figures import LogsFigures
from keras_memwatch.record.sampler import Sampler

MIB = 2**20
KEY = ("train", 0, 0)


def metrics_of(*probes, planner=None, in_order=True):
    sampler = Sampler(list(probes))
    sampler.start()
    return sampler, LogsFigures(sampler, 0, planner, in_order)


def logged(metrics, key, raw):
    logs = {}
    metrics.fill_batch(key, metrics.figures_of(key, raw), logs)
    return logs


@pytest.mark.parametrize("current, peak", [(100 * MIB, 300 * MIB), (100 * MIB, 0)])
def test_figures_are_the_main_device_current_and_peak_never_below_it(current, peak):
    sampler, metrics = metrics_of(FakeProbe([(current, peak)]))
    assert logged(metrics, KEY, sampler.read()) == {
        "mem_current_mib": current / MIB, "mem_peak_mib": max(current, peak) / MIB}


@pytest.mark.parametrize("reading", [(None, None), (-1, 5), ("lots", 5), (True, 5),
                                     RuntimeError("driver reset")])
def test_a_reading_that_is_not_a_byte_count_leaves_its_figure_out(reading):
    sampler, metrics = metrics_of(FakeProbe([reading]))
    logs = {"loss": 1.0}
    metrics.fill_batch(KEY, metrics.figures_of(KEY, sampler.read()), logs)
    assert set(logs) <= {"loss", "mem_peak_mib"}
    assert all(isinstance(v, float) and v >= 0 for v in logs.values())


def test_a_probe_not_read_this_time_gives_no_figures():
    sampler, metrics = metrics_of(FakeProbe([(MIB, MIB)]))
    assert logged(metrics, KEY, [None]) == {}


def test_the_direct_path_and_the_general_one_agree():
    sampler, metrics = metrics_of(FakeProbe([(7 * MIB, 9 * MIB), (7 * MIB, 2 * MIB)]))
    assert metrics._figures_of != metrics._measured  # the direct path is taken
    for _ in range(2):
        raw = sampler.read()
        assert metrics._figures_of(KEY, raw) == metrics._measured(KEY, raw)


def keys(*batches):
    return [("train", 0, b) for b in batches]


def test_hooks_out_of_order_log_their_own_batchs_read_or_a_prior_one():
    # Reads are the batches' in the order they were taken (as in the record):
    # batch 0's hook runs first, then batch 2's (its read is batch 1's), then
    # batch 1's (its read is batch 2's, but batch 1's is known by then).
    sampler, metrics = metrics_of(
        FakeProbe([(10 * MIB, 10 * MIB), (20 * MIB, 20 * MIB), (30 * MIB, 30 * MIB)]),
        in_order=False)
    k0, k1, k2 = keys(0, 1, 2)
    for key in (k0, k1, k2):
        metrics.batch_begins(key)
    assert logged(metrics, k0, sampler.read()) == {
        "mem_peak_mib": 10.0, "mem_current_mib": 10.0}
    # Batch 2's own read is not taken yet: batch 1's figures, named so.
    assert logged(metrics, k2, sampler.read()) == {
        "mem_peak_mib_prior_batch": 20.0, "mem_current_mib_prior_batch": 20.0}
    assert logged(metrics, k1, sampler.read()) == {
        "mem_peak_mib": 20.0, "mem_current_mib": 20.0}


def test_figures_go_to_their_batch_whichever_hook_logs_first():
    # Batch 1's hook reads first, batch 0's second; batch 0's hook logs
    # before batch 1's does.
    sampler, metrics = metrics_of(
        FakeProbe([(10 * MIB, 10 * MIB), (20 * MIB, 20 * MIB)]), in_order=False)
    k0, k1 = keys(0, 1)
    metrics.batch_begins(k0)
    metrics.batch_begins(k1)
    first = metrics.figures_of(k1, sampler.read())
    second = metrics.figures_of(k0, sampler.read())
    late, early = {}, {}
    metrics.fill_batch(k0, second, early)
    metrics.fill_batch(k1, first, late)
    assert early == {"mem_peak_mib": 10.0, "mem_current_mib": 10.0}
    assert late == {"mem_peak_mib_prior_batch": 10.0,
                    "mem_current_mib_prior_batch": 10.0}


class Plans:
    """A planner's look-up of the plan of each batch."""

    def __init__(self, working):
        self.working = working

    def peek(self, key):
        return StepPlan(self.working + 100 * MIB, self.working)


def test_on_jax_the_peak_is_the_settled_in_use_plus_the_plan():
    # One reading holds a step in flight (500 MiB more): the peak of the next
    # batch stays the settled in use plus its plan's working part.
    probe = FakeProbe([(100 * MIB, None), (100 * MIB, None), (600 * MIB, None),
                       (100 * MIB, None)])
    probe.peak_per_sample = False
    sampler, metrics = metrics_of(probe, planner=Plans(40 * MIB))
    metrics.first_read(sampler.read())
    peaks = [logged(metrics, key, sampler.read())["mem_peak_mib"]
             for key in keys(0, 1, 2)]
    assert peaks == [140.0, 140.0, 140.0]
