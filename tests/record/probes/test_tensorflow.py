"""TensorFlowProbe against a fake tensorflow, and against the real CPU build."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from keras_memwatch.record.probes.base import ProbeUnavailable
from keras_memwatch.record.probes.tensorflow import TensorFlowProbe

MiB = 1 << 20
GiB = 1 << 30


def config(memory_limit=None, ordinal=None):
    return SimpleNamespace(memory_limit=memory_limit, experimental_priority=None,
                           experimental_device_ordinal=ordinal)


class FakeTf(types.ModuleType):
    """Physical GPUs, optional logical configurations, BFC-like stats."""

    def __init__(self, gpus=2, configs=None, cuda_build=True):
        super().__init__("tensorflow")
        self.physical = [SimpleNamespace(name=f"/physical_device:GPU:{i}",
                                         device_type="GPU") for i in range(gpus)]
        self.configs = configs or {}
        logical = sum(len(self.configs.get(i) or [None]) for i in range(gpus))
        self.stats = {f"GPU:{i}": {"current": (i + 1) * GiB, "peak": (i + 2) * GiB}
                      for i in range(logical)}
        self.calls = []
        self.info_error = None
        self.reset_error = None
        self.config = SimpleNamespace(
            list_physical_devices=lambda kind: list(self.physical),
            get_visible_devices=lambda kind: list(self.physical),
            list_logical_devices=lambda kind: [
                SimpleNamespace(name=f"/job:localhost/replica:0/task:0/device:{d}",
                                device_type="GPU")
                for d in self.stats
            ],
            get_logical_device_configuration=lambda dev: self.configs.get(
                self.physical.index(dev)
            ),
            experimental=SimpleNamespace(
                get_memory_info=self.get_memory_info,
                reset_memory_stats=self.reset_memory_stats,
            ),
        )
        self.test = SimpleNamespace(is_built_with_cuda=lambda: cuda_build)

    def get_memory_info(self, device):
        self.calls.append(("info", device))
        if self.info_error is not None:
            raise self.info_error
        return dict(self.stats[device])

    def reset_memory_stats(self, device):
        self.calls.append(("reset", device))
        if self.reset_error is not None:
            raise self.reset_error
        self.stats[device]["peak"] = self.stats[device]["current"]


@pytest.fixture
def install(monkeypatch):
    def install(**kwargs):
        tf = FakeTf(**kwargs)
        monkeypatch.setitem(sys.modules, "tensorflow", tf)
        return tf

    return install


def started():
    probe = TensorFlowProbe()
    devices = probe.start()
    return probe, devices


def test_constructor_does_not_import_tensorflow(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    TensorFlowProbe()


def test_devices_are_logical_gpus_with_short_names(install):
    install(gpus=3)
    _, devices = started()
    assert devices == ("GPU:0", "GPU:1", "GPU:2")


def test_reading_is_current_and_peak_since_previous_read(install):
    tf = install(gpus=1)
    probe, _ = started()
    assert probe.peak_per_sample is True
    assert TensorFlowProbe.columns == (
        "allocator_current_bytes",
        "allocator_peak_bytes",
        "allocator_limit_bytes",
    )
    tf.stats["GPU:0"]["peak"] = 6 * GiB  # a batch's activations came and went
    assert probe.read() == ((1 * GiB, 6 * GiB, None),)
    assert probe.read() == ((1 * GiB, 1 * GiB, None),)


def test_peak_is_reset_right_after_each_read(install):
    tf = install(gpus=2)
    probe, _ = started()
    tf.calls.clear()
    probe.read()
    assert tf.calls == [("info", "GPU:0"), ("reset", "GPU:0"),
                        ("info", "GPU:1"), ("reset", "GPU:1")]


def test_zeros_are_not_data(install):
    tf = install(gpus=2)
    probe, _ = started()
    tf.stats["GPU:1"] = {"current": 0, "peak": 0}
    readings = probe.read()
    assert readings[1] == (None, None, None)
    assert readings[0][0] == 1 * GiB


def test_configured_memory_limit_becomes_the_limit_in_bytes(install):
    install(gpus=2, configs={1: [config(memory_limit=4096)]})
    probe, _ = started()
    assert [r[2] for r in probe.read()] == [None, 4096 * MiB]


def test_limits_follow_virtual_devices_and_their_ordinals(install):
    # Physical GPU 0 split in two, the second ordered after physical GPU 1.
    install(gpus=2, configs={0: [config(1000), config(2000, ordinal=1)]})
    probe, devices = started()
    assert devices == ("GPU:0", "GPU:1", "GPU:2")
    assert [r[2] for r in probe.read()] == [1000 * MiB, None, 2000 * MiB]


def test_limits_are_none_when_configuration_does_not_match_devices(install):
    tf = install(gpus=2, configs={0: [config(1000)]})
    del tf.stats["GPU:1"]  # one logical GPU fewer than configured
    probe, _ = started()
    assert [r[2] for r in probe.read()] == [None]


def test_unresettable_peak_is_a_high_water_mark(install):
    tf = install(gpus=1)
    tf.reset_error = ValueError("clearing memory statistics not supported")
    probe, _ = started()
    assert probe.peak_per_sample is False
    assert "high-water mark" in probe.describe()
    assert probe.read() == ((1 * GiB, 2 * GiB, None),)


def test_allocator_without_stats_is_unavailable(install):
    tf = install(gpus=1)
    tf.info_error = ValueError("Allocator stats not available for device 'GPU:0'")
    with pytest.raises(ProbeUnavailable, match="Allocator stats not available"):
        started()


def test_failing_read_gives_none_and_does_not_raise(install):
    tf = install(gpus=1, configs={0: [config(512)]})
    probe, _ = started()
    tf.info_error = RuntimeError("device lost")
    assert probe.read() == ((None, None, 512 * MiB),)


def test_cpu_build_is_unavailable_with_install_command(install):
    install(gpus=0, cuda_build=False)
    with pytest.raises(ProbeUnavailable, match=r"tensorflow\[and-cuda\]"):
        started()


def test_gpu_build_without_gpu_is_unavailable(install):
    install(gpus=0, cuda_build=True)
    with pytest.raises(ProbeUnavailable, match="sees no GPU"):
        started()


def test_missing_tensorflow_is_unavailable_with_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(ProbeUnavailable, match="pip install tensorflow"):
        started()


def test_close_is_idempotent_and_stops_reading(install):
    install(gpus=1)
    probe, _ = started()
    probe.close()
    probe.close()
    assert probe.read() == ()


def test_real_tensorflow_without_gpu_is_unavailable():
    tf = pytest.importorskip("tensorflow")
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("a GPU is present")
    with pytest.raises(ProbeUnavailable, match="no GPU support|sees no GPU"):
        TensorFlowProbe().start()
