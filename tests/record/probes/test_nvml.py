"""NvmlProbe and `visible_totals` against a fake pynvml, and NvmlProbe
against the real one where present."""

from __future__ import annotations

import os
import sys
import types
from types import SimpleNamespace

import pytest

from keras_memwatch.record.probes.base import ProbeUnavailable
from keras_memwatch.configure.nvml_devices import visible_totals
from keras_memwatch.record.probes.nvml import NvmlProbe

GiB = 1 << 30
MiB = 1 << 20
NOT_AVAILABLE = (1 << 64) - 1


class FakeNvml(types.ModuleType):
    """Just enough of pynvml: GPUs with a UUID, memory and processes."""

    class NVMLError(Exception):
        pass

    nvmlMemory_v2 = 0x02000028

    def __init__(self, gpus=3, init_error=None):
        super().__init__("pynvml")
        self.gpus = [
            {
                "uuid": f"GPU-{i}{i}{i}aaaa-0000-1111-2222-33334444555{i}",
                "name": "NVIDIA H200",
                "used": (i + 1) * GiB,
                "total": 141 * GiB,
                "reserved": 0,  # by the driver, within "total" (NVML v2)
                "procs": [],
            }
            for i in range(gpus)
        ]
        self.mig = {}
        self.init_error = init_error
        self.memory_error = set()
        self.process_error = set()
        self.init_calls = 0
        self.shutdown_calls = 0

    def nvmlInit(self):
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)
        self.init_calls += 1

    def nvmlShutdown(self):
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise self.NVMLError("Invalid Argument")
        return ("gpu", i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.mig:
            raise self.NVMLError("Not Found")
        return ("mig", uuid)

    def _device(self, handle):
        kind, key = handle
        return self.gpus[key] if kind == "gpu" else self.mig[key]

    def nvmlDeviceGetUUID(self, handle):
        return self._device(handle)["uuid"]

    def nvmlDeviceGetName(self, handle):
        return self._device(handle)["name"]

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if handle in self.memory_error:
            raise self.NVMLError("GPU is lost")
        d = self._device(handle)
        if version:
            return SimpleNamespace(
                used=d["used"], total=d["total"], free=0, reserved=d["reserved"]
            )
        return SimpleNamespace(used=d["used"], total=d["total"], free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if handle in self.process_error:
            raise self.NVMLError("Unknown Error")
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used)
            for pid, used in self._device(handle)["procs"]
        ]


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return fake


def started(**kwargs):
    probe = NvmlProbe(**kwargs)
    devices = probe.start()
    return probe, devices


def used_per_device(probe):
    return [reading[0] for reading in probe.read()]


def test_constructor_does_not_touch_nvml(nvml):
    NvmlProbe()
    assert nvml.init_calls == 0


def test_unset_cuda_visible_devices_lists_every_gpu_in_nvml_order(nvml):
    probe, devices = started()
    assert devices == ("GPU:0", "GPU:1", "GPU:2")
    assert used_per_device(probe) == [1 * GiB, 2 * GiB, 3 * GiB]


def test_reading_is_used_total_and_process_bytes(nvml):
    nvml.gpus[0]["procs"] = [(os.getpid(), 5 * GiB)]
    probe, _ = started()
    assert NvmlProbe.columns == (
        "nvml_used_bytes",
        "nvml_total_bytes",
        "process_bytes",
    )
    assert probe.read()[0] == (1 * GiB, 141 * GiB, 5 * GiB)
    assert probe.peak_per_sample is False


@pytest.mark.parametrize(
    "visible, expected_used",
    [
        ("1", [2 * GiB]),
        ("2,0", [3 * GiB, 1 * GiB]),
        (" 2 , 1 ", [3 * GiB, 2 * GiB]),
        ("0,1,7,2", [1 * GiB, 2 * GiB]),  # stops at the invalid index
        ("1,1,2", [2 * GiB]),  # stops at the repeated index
        ("1,-1,2", [2 * GiB]),
    ],
)
def test_cuda_visible_indices_name_devices_in_cuda_order(
    nvml, monkeypatch, visible, expected_used
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    probe, devices = started()
    assert devices == tuple(f"GPU:{i}" for i in range(len(expected_used)))
    assert used_per_device(probe) == expected_used


def test_cuda_visible_full_uuids_map_to_their_gpus(nvml, monkeypatch):
    monkeypatch.setenv(
        "CUDA_VISIBLE_DEVICES", f"{nvml.gpus[2]['uuid']},{nvml.gpus[1]['uuid']}"
    )
    probe, devices = started()
    assert devices == ("GPU:0", "GPU:1")
    assert used_per_device(probe) == [3 * GiB, 2 * GiB]


def test_cuda_visible_uuid_prefixes_map_when_unique(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-111,GPU-0")
    probe, devices = started()
    assert used_per_device(probe) == [2 * GiB, 1 * GiB]


def test_cuda_visible_ambiguous_uuid_prefix_ends_the_list(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-2,GPU-,GPU-0")
    probe, devices = started()
    assert used_per_device(probe) == [3 * GiB]


def test_cuda_visible_uuids_given_as_bytes_by_old_pynvml(nvml, monkeypatch):
    as_text = nvml.nvmlDeviceGetUUID
    monkeypatch.setattr(nvml, "nvmlDeviceGetUUID", lambda h: as_text(h).encode())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-111")
    probe, _ = started()
    assert used_per_device(probe) == [2 * GiB]


def test_cuda_visible_mig_uuid_reads_the_mig_instance(nvml, monkeypatch):
    mig = "MIG-9f0a1b2c-0000-1111-2222-333344445555"
    nvml.mig[mig] = {"uuid": mig, "name": "MIG 1g.18gb", "used": 7, "total": 18 * GiB,
                     "procs": []}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mig)
    probe, devices = started()
    assert devices == ("GPU:0",)
    assert probe.read()[0][:2] == (7, 18 * GiB)


def test_unknown_mig_uuid_leaves_no_gpu(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-unknown")
    with pytest.raises(ProbeUnavailable, match="CUDA_VISIBLE_DEVICES"):
        NvmlProbe().start()
    assert nvml.shutdown_calls == nvml.init_calls == 1


@pytest.mark.parametrize("visible", ["", "-1", "none"])
def test_cuda_visible_hiding_every_gpu_is_unavailable(nvml, monkeypatch, visible):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    with pytest.raises(ProbeUnavailable, match="leaves no GPU visible"):
        NvmlProbe().start()
    assert nvml.shutdown_calls == 1  # NVML shut down again


def test_no_gpu_at_all_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus=0))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(ProbeUnavailable, match="no GPU"):
        NvmlProbe().start()


def test_missing_library_is_unavailable_with_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    with pytest.raises(ProbeUnavailable, match="pip install nvidia-ml-py"):
        NvmlProbe().start()


def test_driver_not_loaded_is_unavailable_with_nvml_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error="Driver Not Loaded"))
    with pytest.raises(ProbeUnavailable, match="Driver Not Loaded"):
        NvmlProbe().start()


def test_process_bytes_counts_only_this_process(nvml):
    me = os.getpid()
    nvml.gpus[0]["procs"] = [(me + 1, 9 * GiB), (me, 2 * GiB), (me, 1 * GiB)]
    nvml.gpus[1]["procs"] = [(me + 1, 9 * GiB)]
    probe, _ = started()
    assert [r[2] for r in probe.read()] == [3 * GiB, None, None]


@pytest.mark.parametrize("value", [None, NOT_AVAILABLE])
def test_process_bytes_missing_when_driver_hides_usage(nvml, value):
    nvml.gpus[0]["procs"] = [(os.getpid(), value)]
    probe, _ = started()
    assert probe.read()[0][2] is None


def test_process_query_can_be_turned_off(nvml):
    nvml.gpus[0]["procs"] = [(os.getpid(), GiB)]
    calls = []
    original = nvml.nvmlDeviceGetComputeRunningProcesses
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: calls.append(h) or original(h)
    probe, _ = started(process_memory=False)
    assert probe.read()[0] == (1 * GiB, 141 * GiB, None)
    assert calls == []
    assert "turned off" in probe.describe()


def test_process_query_falls_back_to_v2_on_old_drivers(nvml):
    nvml.gpus[0]["procs"] = [(os.getpid(), GiB)]

    def mismatch(handle):
        raise RuntimeError("pyNVML version does not match the NVML lib version")

    nvml.nvmlDeviceGetComputeRunningProcesses_v2 = (
        FakeNvml.nvmlDeviceGetComputeRunningProcesses.__get__(nvml)
    )
    nvml.nvmlDeviceGetComputeRunningProcesses = mismatch
    probe, _ = started()
    assert probe.read()[0][2] == GiB


def test_failing_queries_at_read_give_none_and_do_not_raise(nvml):
    nvml.gpus[1]["procs"] = [(os.getpid(), GiB)]
    probe, _ = started()
    nvml.memory_error.add(("gpu", 0))
    nvml.process_error.add(("gpu", 1))
    readings = probe.read()
    assert readings[0][:2] == (None, None)
    assert readings[1] == (2 * GiB, 141 * GiB, None)
    assert readings[2] == (3 * GiB, 141 * GiB, None)


def test_close_shuts_nvml_down_once(nvml):
    probe, _ = started()
    probe.close()
    probe.close()
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)


def test_restart_keeps_nvml_init_and_shutdown_balanced(nvml):
    probe, _ = started()
    probe.start()
    probe.close()
    assert nvml.init_calls == nvml.shutdown_calls == 2


def test_describe_warns_of_cuda_and_nvml_numbering_on_mixed_models(nvml, monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    nvml.gpus[1]["name"] = "NVIDIA A100"
    probe, _ = started()
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in probe.describe()


def test_describe_mentions_pid_namespaces(nvml):
    probe, _ = started()
    assert "PID namespace" in probe.describe()


def test_real_nvml_without_driver_is_unavailable():
    pytest.importorskip("pynvml")
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("an NVIDIA driver is present")
    probe = NvmlProbe()
    with pytest.raises(ProbeUnavailable, match="NVML could not start"):
        probe.start()
    probe.close()


# --------------------------------------------------------------------------
# visible_totals: the GPUs' total memory, for configure_memory.


@pytest.mark.parametrize(
    "visible, expected",
    [
        (None, [10, 20, 30]),
        ("1", [20]),
        ("2,0", [30, 10]),
        ("0,7,1", [10]),  # CUDA stops at the first invalid entry
        ("1,1", [20]),
        ("", []),
        ("-1", []),
        ("GPU-222", [30]),  # a UUID prefix
        ("GPU-", []),  # ambiguous prefix: invalid
    ],
)
def test_visible_totals_honour_cuda_visible_devices(
    nvml, monkeypatch, visible, expected
):
    for gpu, size in zip(nvml.gpus, (10, 20, 30)):
        gpu["total"], gpu["reserved"] = size * GiB + 615 * MiB, 615 * MiB
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    view = visible_totals()
    # NVML's own total includes the driver's reserve; CUDA's does not.
    assert view.totals == [g * GiB for g in expected]
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)


def test_visible_totals_without_nvml_v2_are_nvml_totals(nvml, monkeypatch):
    monkeypatch.setattr(nvml, "nvmlMemory_v2", None)  # an older pynvml
    nvml.gpus[0]["reserved"] = 615 * MiB
    assert visible_totals().totals == [141 * GiB] * 3


def test_visible_totals_when_nvml_is_unavailable(monkeypatch):
    fake = FakeNvml(init_error="NVML Shared Library Not Found")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    view = visible_totals()
    assert view.totals is None
    assert "NVML Shared Library Not Found" in view.reason
    assert fake.shutdown_calls == 0  # no shutdown without a successful init


def test_visible_totals_without_the_library(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    view = visible_totals()
    assert view.totals is None and "pip install nvidia-ml-py" in view.reason
