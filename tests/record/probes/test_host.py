"""The host probe reads real RSS, and its peak restarts at every read."""

import sys

import numpy as np
import pytest

from keras_memwatch.record.probes.host import HostProbe

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


CHILD = """
import numpy as np, sys
from keras_memwatch.record.probes.host import HostProbe
probe = HostProbe(); probe.start(); probe.read()
block = np.ones(100 * 2**20 // 8); del block
(rss, with_block), = probe.read()
(rss2, after), = probe.read()
print(with_block - rss, after - rss2)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
def test_a_child_of_a_large_process_sees_its_own_peaks():
    import subprocess

    parent = np.ones(400 * MIB // 8)  # the parent's peak, which exec keeps
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    del parent
    assert done.returncode == 0, done.stderr
    grew, settled = (int(v) for v in done.stdout.split())
    assert grew > 80 * MIB
    assert settled < 20 * MIB
