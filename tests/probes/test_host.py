"""The host probe reads real RSS, and its peak restarts at every read."""

import sys

import numpy as np
import pytest

from keras_memwatch.probes.host import HostProbe

MIB = 2**20


def test_reports_one_host_device_with_plausible_rss():
    probe = HostProbe()
    assert probe.start() == ("host",)
    ((rss, peak),) = probe.read()
    assert 10 * MIB < rss < 64 * 2**30
    assert peak >= rss
    probe.close()
    probe.close()  # idempotent


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_peak_is_the_peak_since_the_previous_read():
    probe = HostProbe()
    probe.start()
    if not probe.peak_per_sample:
        pytest.skip(probe.describe())
    probe.read()
    block = np.ones(200 * MIB // 8)  # touch 200 MiB, then free it
    del block
    ((rss_after, peak_with_block),) = probe.read()
    ((_, peak_next),) = probe.read()
    assert peak_with_block - rss_after > 150 * MIB
    assert peak_next - rss_after < 50 * MIB
    assert "since the previous sample" in probe.describe()
    probe.close()


def test_start_can_be_called_again_after_close():
    probe = HostProbe()
    probe.start()
    probe.close()
    probe.start()
    assert len(probe.read()) == 1
    probe.close()
