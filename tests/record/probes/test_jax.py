"""JaxProbe against a fake jax, and against the real CPU build."""

from __future__ import annotations

import sys
import types

import pytest

from keras_memwatch.record.probes.base import ProbeUnavailable
from keras_memwatch.record.probes.jax import JaxProbe

GiB = 1 << 30


class FakeDevice:
    def __init__(self, platform, local_id, stats=None):
        self.platform = platform
        self.local_hardware_id = local_id
        self.stats = stats
        self.calls = 0

    def memory_stats(self):
        self.calls += 1
        if isinstance(self.stats, Exception):
            raise self.stats
        return self.stats


def gpu(local_id, in_use=GiB, peak=2 * GiB, limit=100 * GiB, platform="gpu",
        pool=None):
    stats = {
        "bytes_in_use": in_use,
        "peak_bytes_in_use": peak,
        "bytes_limit": limit,
        "num_allocs": 10,
        "largest_alloc_size": GiB,
    }
    if pool is not None:
        stats["pool_bytes"] = pool
    return FakeDevice(platform, local_id, stats)


@pytest.fixture
def install(monkeypatch):
    def install(*devices):
        jax = types.ModuleType("jax")
        jax.local_devices = lambda: list(devices)
        monkeypatch.setitem(sys.modules, "jax", jax)
        return devices

    return install


def test_constructor_does_not_import_jax(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)
    JaxProbe()


def test_only_gpus_are_reported_named_by_local_index(install):
    install(FakeDevice("cpu", 0, None), gpu(0), gpu(1, platform="cuda"),
            gpu(2, platform="rocm"))
    assert JaxProbe().start() == ("GPU:0", "GPU:1", "GPU:2")


def test_devices_are_ordered_by_local_index(install):
    install(gpu(1, in_use=11), gpu(0, in_use=10))
    probe = JaxProbe()
    assert probe.start() == ("GPU:0", "GPU:1")
    assert [r[0] for r in probe.read()] == [10, 11]


def test_positions_name_devices_without_local_hardware_id(install):
    install(gpu(None), gpu(None))
    assert JaxProbe().start() == ("GPU:0", "GPU:1")


def test_reading_is_in_use_high_water_mark_and_limit(install):
    install(gpu(0, in_use=3 * GiB, peak=9 * GiB, limit=100 * GiB))
    probe = JaxProbe()
    probe.start()
    assert JaxProbe.columns == (
        "allocator_current_bytes",
        "allocator_peak_bytes",
        "allocator_limit_bytes",
        "allocator_reserved_bytes",
    )
    assert probe.read() == ((3 * GiB, 9 * GiB, 100 * GiB, None),)


def test_high_water_mark_is_recorded_as_is_and_not_per_sample(install):
    (device,) = install(gpu(0, in_use=GiB, peak=9 * GiB))
    probe = JaxProbe()
    probe.start()
    assert probe.peak_per_sample is False
    probe.read()
    device.stats["bytes_in_use"] = 2 * GiB
    assert probe.read()[0][:2] == (2 * GiB, 9 * GiB)
    assert "process-lifetime high-water mark" in probe.describe()


def test_one_memory_stats_call_per_device_per_read(install):
    a, b = install(gpu(0), gpu(1))
    probe = JaxProbe()
    probe.start()
    a.calls = b.calls = 0
    probe.read()
    assert (a.calls, b.calls) == (1, 1)


def test_missing_keys_and_none_stats_at_read_give_none(install):
    a, b = install(gpu(0), gpu(1))
    probe = JaxProbe()
    probe.start()
    a.stats = {"bytes_in_use": 5}
    b.stats = None
    assert probe.read() == ((5, None, None, None), (None, None, None, None))


def test_failing_memory_stats_at_read_gives_none(install):
    (device,) = install(gpu(0))
    probe = JaxProbe()
    probe.start()
    device.stats = RuntimeError("INTERNAL: device lost")
    assert probe.read() == ((None, None, None, None),)


def test_cpu_only_is_unavailable_with_install_hint(install):
    install(FakeDevice("cpu", 0, None))
    with pytest.raises(ProbeUnavailable, match=r"no GPU \(platforms: cpu\).*jax\[cuda"):
        JaxProbe().start()


def test_gpus_without_memory_stats_are_unavailable(install):
    install(FakeDevice("gpu", 0, None))
    with pytest.raises(ProbeUnavailable, match="memory_stats"):
        JaxProbe().start()


def test_missing_jax_is_unavailable_with_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)
    with pytest.raises(ProbeUnavailable, match="pip install jax"):
        JaxProbe().start()


def test_close_is_idempotent_and_stops_reading(install):
    install(gpu(0))
    probe = JaxProbe()
    probe.start()
    probe.close()
    probe.close()
    assert probe.read() == ()


def test_real_jax_without_gpu_is_unavailable():
    jax = pytest.importorskip("jax")
    if any(d.platform != "cpu" for d in jax.local_devices()):
        pytest.skip("jax sees an accelerator")
    with pytest.raises(ProbeUnavailable, match="no GPU"):
        JaxProbe().start()


def test_reserved_is_the_pool_the_bfc_allocator_holds(install):
    # BFC with preallocation: the whole pool is held from the start, and its
    # bytes_reserved (another notion) is 0.
    (device,) = install(gpu(0, in_use=3 * GiB, pool=75 * GiB))
    device.stats["bytes_reserved"] = 0
    probe = JaxProbe()
    probe.start()
    assert probe.read()[0][3] == 75 * GiB


def test_reserved_falls_back_to_bytes_reserved_of_the_async_allocator(install):
    (device,) = install(gpu(0, in_use=3 * GiB))
    device.stats["bytes_reserved"] = 5 * GiB
    probe = JaxProbe()
    probe.start()
    assert probe.read()[0][3] == 5 * GiB


def test_reserved_below_in_use_or_absent_is_missing(install):
    (device,) = install(gpu(0, in_use=3 * GiB))
    device.stats["bytes_reserved"] = 0  # BFC without pool_bytes: not a reserve
    probe = JaxProbe()
    probe.start()
    assert probe.read()[0][3] is None
    del device.stats["bytes_reserved"]
    assert probe.read()[0][3] is None
