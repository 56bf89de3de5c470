"""`heap_follows_arrays`: while the host is measured, glibc hands each large
block back when it is freed, wherever it sits in the heap; each case runs in
a fresh process, whose heap has no history."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from keras_memwatch.measure import host_heap

GLIBC = sys.platform.startswith("linux") and host_heap._libc() is not None

CHILD = textwrap.dedent("""
    import contextlib, sys
    import numpy as np
    from keras_memwatch.measure.host_heap import heap_follows_arrays

    def resident():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    # A freed 24 MiB block raises glibc's moving threshold above 4 MiB.
    np.ones(3 * 2**20).sum()
    within = sys.argv[1] == "within"
    with heap_follows_arrays() if within else contextlib.nullcontext():
        blocks, kept = [], []
        for _ in range(8):
            blocks.append(np.ones(2**19))  # 4 MiB
            kept.append(np.ones(2**10))  # a live block after each
        before = resident()
        del blocks
        print((before - resident()) // 2**20)
""")


def freed_mib(where):
    done = subprocess.run([sys.executable, "-c", CHILD, where], capture_output=True,
                          text=True, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not GLIBC, reason="glibc's heap on Linux")
def test_blocks_freed_between_live_ones_leave_the_resident_set():
    assert freed_mib("within") >= 30  # 8 x 4 MiB handed back
    assert freed_mib("without") <= 2  # kept in the heap, resident


@pytest.mark.skipif(not GLIBC, reason="glibc's heap on Linux")
def test_afterwards_the_threshold_stays_fixed_at_glibcs_ceiling(monkeypatch):
    calls = []
    monkeypatch.setattr(host_heap, "_set_threshold",
                        lambda libc, value: calls.append(value) or True)
    with host_heap.heap_follows_arrays() as fixed:
        with host_heap.heap_follows_arrays() as nested:
            assert calls == [host_heap.MEASURING_THRESHOLD]
        assert fixed and nested and calls == [host_heap.MEASURING_THRESHOLD]
    assert calls == [host_heap.MEASURING_THRESHOLD, host_heap.LEFT_THRESHOLD]


def test_without_glibc_nothing_is_set_and_it_says_so(monkeypatch):
    monkeypatch.setattr(host_heap, "_libc", lambda: None)
    with host_heap.heap_follows_arrays() as fixed:
        assert fixed is False
    host_heap.trim_host_heap()  # does nothing, raises nothing
