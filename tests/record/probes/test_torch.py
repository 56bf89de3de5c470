"""TorchProbe against a fake torch, and against the real CPU build."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from keras_memwatch.record.probes.base import ProbeUnavailable
from keras_memwatch.record.probes.torch import TorchProbe

GiB = 1 << 30


class FakeAllocator:
    """Per-device allocated bytes and peak, with a call log."""

    def __init__(self, devices):
        self.current = [(i + 1) * GiB for i in range(devices)]
        self.peak = [(i + 2) * GiB for i in range(devices)]
        self.reserved = [(i + 3) * GiB for i in range(devices)]
        self.fraction = [1.0] * devices
        self.total = 140 * GiB
        self.calls = []
        self.fail = set()

    def nested(self, i):
        self.calls.append(("stats", i))
        if i in self.fail:
            raise RuntimeError("CUDA error: an illegal memory access")
        stat = {"current": self.current[i], "peak": self.peak[i], "allocated": 0,
                "freed": 0}
        reserved = {"current": self.reserved[i], "peak": self.reserved[i],
                    "allocated": 0, "freed": 0}
        return {"allocated_bytes": {"all": stat, "large_pool": {}, "small_pool": {}},
                "reserved_bytes": {"all": reserved, "large_pool": {}, "small_pool": {}},
                "num_ooms": 0}

    def allocated(self, i):
        return self.nested(i)["allocated_bytes"]["all"]

    def reset(self, i):
        self.calls.append(("reset", i))
        self.peak[i] = self.current[i]


def fake_torch(devices=2, cuda_build=True, private=True, nested_public=True):
    alloc = FakeAllocator(devices)
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+cu130" if cuda_build else "2.13.0+cpu"
    torch.version = SimpleNamespace(cuda="13.0" if cuda_build else None, hip=None)
    cuda = SimpleNamespace(
        is_available=lambda: cuda_build and devices > 0,
        device_count=lambda: devices,
        init=lambda: alloc.calls.append(("init",)),
        reset_peak_memory_stats=lambda i: alloc.reset(i),
        memory_allocated=lambda i: alloc.allocated(i)["current"],
        max_memory_allocated=lambda i: alloc.allocated(i)["peak"],
        memory_reserved=lambda i: alloc.nested(i)["reserved_bytes"]["all"]["current"],
        get_per_process_memory_fraction=lambda i: alloc.fraction[i],
        get_device_properties=lambda i: SimpleNamespace(total_memory=alloc.total),
    )
    if nested_public:
        cuda.memory_stats_as_nested_dict = alloc.nested
    torch.cuda = cuda
    torch._C = SimpleNamespace()
    if private:
        torch._C._cuda_memoryStats = alloc.nested
        torch._C._cuda_resetPeakMemoryStats = alloc.reset
    return torch, alloc


@pytest.fixture
def install(monkeypatch):
    def install(**kwargs):
        torch, alloc = fake_torch(**kwargs)
        monkeypatch.setitem(sys.modules, "torch", torch)
        return torch, alloc

    return install


def test_constructor_does_not_import_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    TorchProbe()  # importing torch would raise here


def test_devices_are_named_by_cuda_index(install):
    install(devices=3)
    assert TorchProbe().start() == ("GPU:0", "GPU:1", "GPU:2")


def test_start_initialises_cuda_so_the_allocator_has_stats(install):
    _, alloc = install()
    TorchProbe().start()
    assert alloc.calls[0] == ("init",)


def test_reading_is_allocated_current_peak_no_limit_and_reserved(install):
    install()
    probe = TorchProbe()
    probe.start()  # also resets the peaks, so they start at current
    readings = probe.read()
    assert TorchProbe.columns == (
        "allocator_current_bytes",
        "allocator_peak_bytes",
        "allocator_limit_bytes",
        "allocator_reserved_bytes",
    )
    assert readings == ((1 * GiB, 1 * GiB, None, 3 * GiB),
                        (2 * GiB, 2 * GiB, None, 4 * GiB))


def test_peak_is_reset_right_after_each_read(install):
    _, alloc = install(devices=1)
    probe = TorchProbe()
    probe.start()
    assert probe.peak_per_sample is True
    alloc.peak[0] = 5 * GiB  # a batch allocated a lot, then freed it
    alloc.calls.clear()
    assert probe.read() == ((1 * GiB, 5 * GiB, None, 3 * GiB),)
    assert alloc.calls == [("stats", 0), ("reset", 0)]
    assert probe.read() == ((1 * GiB, 1 * GiB, None, 3 * GiB),)


def test_private_bindings_are_used_when_present(install):
    torch, _ = install()
    probe = TorchProbe()
    probe.start()
    assert probe.path == "torch._C._cuda_memoryStats"
    assert probe._stats is torch._C._cuda_memoryStats
    assert probe._reset is torch._C._cuda_resetPeakMemoryStats


def test_public_nested_dict_is_the_fallback_without_private_bindings(install):
    _, alloc = install(private=False)
    probe = TorchProbe()
    probe.start()
    assert probe.path == "torch.cuda.memory_stats_as_nested_dict"
    alloc.peak[1] = 7 * GiB
    assert probe.read()[1] == (2 * GiB, 7 * GiB, None, 4 * GiB)


def test_public_pair_is_the_last_fallback(install):
    _, alloc = install(private=False, nested_public=False)
    probe = TorchProbe()
    probe.start()
    assert probe.path == "torch.cuda.memory_allocated"
    alloc.peak[0] = 3 * GiB
    assert probe.read()[0] == (1 * GiB, 3 * GiB, None, 3 * GiB)
    assert probe.read()[0] == (1 * GiB, 1 * GiB, None, 3 * GiB)


def test_private_bindings_can_be_turned_off(install):
    install()
    probe = TorchProbe(use_private_bindings=False)
    probe.start()
    assert probe.path == "torch.cuda.memory_stats_as_nested_dict"


def test_broken_private_binding_falls_back_to_public(install):
    torch, _ = install()

    def broken(i):
        raise TypeError("incompatible function arguments")

    torch._C._cuda_memoryStats = broken
    probe = TorchProbe()
    probe.start()
    assert probe.path == "torch.cuda.memory_stats_as_nested_dict"


def test_allocator_without_stats_is_unavailable(install):
    _, alloc = install()
    alloc.fail = {0, 1}
    with pytest.raises(ProbeUnavailable, match="reports no statistics"):
        TorchProbe().start()


def test_limit_is_fraction_times_total_when_a_fraction_is_set(install):
    _, alloc = install()
    alloc.fraction = [0.5, 1.0]
    probe = TorchProbe()
    probe.start()
    readings = probe.read()
    assert readings[0][2] == 70 * GiB
    assert readings[1][2] is None
    assert "memory fraction" in probe.describe()


def test_limit_is_none_when_torch_cannot_report_the_fraction(install):
    torch, _ = install()
    del torch.cuda.get_per_process_memory_fraction
    probe = TorchProbe()
    probe.start()
    assert [r[2] for r in probe.read()] == [None, None]


def test_failing_read_gives_none_and_does_not_raise(install):
    _, alloc = install()
    probe = TorchProbe()
    probe.start()
    alloc.fail = {1}
    readings = probe.read()
    assert readings[0] == (1 * GiB, 1 * GiB, None, 3 * GiB)
    assert readings[1] == (None, None, None, None)


def test_cpu_build_is_unavailable_and_says_so(install):
    install(cuda_build=False)
    with pytest.raises(ProbeUnavailable, match="no CUDA support"):
        TorchProbe().start()


def test_cuda_build_without_device_is_unavailable(install):
    install(devices=0)
    with pytest.raises(ProbeUnavailable, match="no CUDA device"):
        TorchProbe().start()


def test_missing_torch_is_unavailable_with_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ProbeUnavailable, match="pip install torch"):
        TorchProbe().start()


def test_close_is_idempotent_and_stops_reading(install):
    install()
    probe = TorchProbe()
    probe.start()
    probe.close()
    probe.close()
    assert probe.read() == ()


def test_real_torch_without_gpu_is_unavailable():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ProbeUnavailable):
        TorchProbe().start()


def test_reserved_comes_from_the_same_stats_call_as_allocated(install):
    _, alloc = install(devices=1)
    probe = TorchProbe()
    probe.start()
    alloc.reserved[0] = 6 * GiB + 20 * 2**20  # 2 GiB held but not allocated, and more
    alloc.calls.clear()
    reading = probe.read()[0]
    assert reading[3] == 6 * GiB + 20 * 2**20
    assert reading[3] - reading[0] > 5 * GiB  # reserved but unallocated
    assert alloc.calls == [("stats", 0), ("reset", 0)]  # one stats dict per read


def test_reserved_is_missing_where_the_stats_dict_lacks_it(install):
    torch, alloc = install(devices=1)
    nested = alloc.nested

    def without_reserved(i):
        stats = nested(i)
        del stats["reserved_bytes"]
        return stats

    torch._C._cuda_memoryStats = without_reserved
    probe = TorchProbe()
    probe.start()
    assert probe.path == "torch._C._cuda_memoryStats"
    assert probe.read() == ((1 * GiB, 1 * GiB, None, None),)


def test_public_pair_without_memory_reserved_leaves_reserved_missing(install):
    torch, _ = install(devices=1, private=False, nested_public=False)
    del torch.cuda.memory_reserved
    probe = TorchProbe()
    probe.start()
    assert probe.read() == ((1 * GiB, 1 * GiB, None, None),)
    assert "reserves from the device" in probe.describe()
