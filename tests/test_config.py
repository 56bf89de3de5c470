"""Tests for `keras_memwatch.config.configure_memory`.

Memory settings are process-global, so each backend's path runs in a fresh
Python child (`_run_child`) with `KERAS_BACKEND` set, whatever backend this
pytest process uses. Where no GPU exists, a fake `pynvml` module stands in
for NVML's device totals, fake GPUs are added to TensorFlow's own device
bookkeeping (so TensorFlow's real rules and "too late" errors apply), and
`torch.cuda` functions are replaced. Argument checks and helpers run here,
in-process, without importing any framework.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
import sys
import textwrap
import types
from typing import Any, Optional

import pytest

from keras_memwatch import config as cfg

GIB = 1 << 30
MIB = 1 << 20
REPO = pathlib.Path(__file__).resolve().parents[1]

# One fake NVML, used in-process and (as source) in the children.
FAKE_NVML = '''
import sys as _sys, types as _types

def install_fake_nvml(totals, reserved=0, fail_init=False):
    """Puts a fake `pynvml` in sys.modules; totals are CUDA-visible bytes."""
    m = _types.ModuleType("pynvml")
    m.calls = []

    class NVMLError(Exception):
        pass

    m.NVMLError = NVMLError
    m.nvmlMemory_v2 = 0x02000028
    handles = [
        _types.SimpleNamespace(index=i, uuid=f"GPU-{i}{i}{i}{i}-feed")
        for i in range(len(totals))
    ]

    def init():
        m.calls.append("init")
        if fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    def mem(handle, version=None):
        total = totals[handle.index]
        if version:
            return _types.SimpleNamespace(total=total + reserved, reserved=reserved)
        return _types.SimpleNamespace(total=total + reserved)

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: len(handles)
    m.nvmlDeviceGetHandleByIndex = lambda i: handles[i]
    m.nvmlDeviceGetUUID = lambda h: h.uuid
    m.nvmlDeviceGetMemoryInfo = mem
    _sys.modules["pynvml"] = m
    return m
'''

PRELUDE = (
    '''
import json, logging, os, sys
from keras_memwatch.config import configure_memory, applied_limit_bytes

records = []

class _Keep(logging.Handler):
    def emit(self, record):
        records.append((record.levelname, record.getMessage()))

_logger = logging.getLogger("keras_memwatch")
_logger.addHandler(_Keep())
_logger.setLevel(logging.INFO)

def expect(kind, *args, **kwargs):
    """Calls configure_memory, expecting `kind`; returns the message."""
    try:
        configure_memory(*args, **kwargs)
    except kind as error:
        return str(error)
    raise AssertionError(f"expected {kind.__name__} for {args} {kwargs}")

result = {}
'''
    + FAKE_NVML
)


def _run_child(backend: str, body: str, env: Optional[dict[str, str]] = None) -> dict:
    """Runs PRELUDE + body in a fresh Python with KERAS_BACKEND=backend.

    The body asserts what it can and stores values in `result`, which comes
    back as a dict.
    """
    child_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("XLA_", "JAX_", "TF_FORCE_GPU", "KERAS_BACKEND"))
        and k != "CUDA_VISIBLE_DEVICES"
    }
    child_env.update(
        KERAS_BACKEND=backend,
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=os.pathsep.join(
            [str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
        ),
    )
    child_env.update(env or {})
    code = PRELUDE + textwrap.dedent(body) + '\nprint("RESULT:" + json.dumps(result))\n'
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT:")][-1]
    return json.loads(line[len("RESULT:") :])


def _fake_nvml(monkeypatch: pytest.MonkeyPatch, *args: Any, **kwargs: Any) -> Any:
    """Installs the fake `pynvml` for one test (the real one comes back)."""
    monkeypatch.setitem(sys.modules, "pynvml", types.ModuleType("pynvml"))
    namespace: dict[str, Any] = {}
    exec(FAKE_NVML, namespace)
    return namespace["install_fake_nvml"](*args, **kwargs)


# --------------------------------------------------------------------------
# Arguments: checked before any framework is imported.


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"memory_limit_mb": -5},
            ValueError,
            "Expected `memory_limit_mb` to be a positive number. "
            "Received: memory_limit_mb=-5",
        ),
        ({"memory_limit_mb": 0}, ValueError, "memory_limit_mb=0"),
        ({"memory_limit_mb": float("nan")}, ValueError, "memory_limit_mb=nan"),
        ({"memory_limit_mb": float("inf")}, ValueError, "memory_limit_mb=inf"),
        ({"memory_limit_mb": 1e-9}, ValueError, "at least one byte"),
        ({"memory_limit_mb": True}, TypeError, "memory_limit_mb=True"),
        ({"memory_limit_mb": "512"}, TypeError, "memory_limit_mb='512'"),
        ({"allow_growth": "yes"}, TypeError, "allow_growth='yes'"),
        ({"allow_growth": 1}, TypeError, "allow_growth=1"),
        ({"allow_growth": True, "devices": "TPU:0"}, ValueError, "devices='TPU:0'"),
        ({"allow_growth": True, "devices": ["GPU:x"]}, ValueError, "devices='GPU:x'"),
        ({"allow_growth": True, "devices": [-1]}, ValueError, "devices=-1"),
        ({"allow_growth": True, "devices": [True]}, TypeError, "devices=True"),
        ({"allow_growth": True, "devices": [1.0]}, TypeError, "devices=1.0"),
        ({"allow_growth": True, "devices": []}, ValueError, "devices=[]"),
        ({"allow_growth": True, "devices": {"GPU:0"}}, TypeError, "devices={'GPU:0'}"),
    ],
)
def test_bad_arguments_raise_before_any_framework_import(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict, error: type, message: str
) -> None:
    def no_backend() -> str:
        raise AssertionError("the backend was looked up before validation")

    monkeypatch.setattr(cfg, "_active_backend", no_backend)
    with pytest.raises(error) as info:
        cfg.configure_memory(**kwargs)
    assert message in str(info.value)
    assert "Received:" in str(info.value)


@pytest.mark.parametrize(
    "name, index",
    [
        (0, 0),
        (3, 3),
        ("GPU:0", 0),
        ("gpu:1", 1),
        ("cuda:2", 2),
        ("/physical_device:GPU:1", 1),
        ("/device:GPU:4", 4),
    ],
)
def test_device_names(name: Any, index: int) -> None:
    assert cfg._device_index(name, "devices") == index


def test_arguments_normalised() -> None:
    assert cfg._check_arguments(None, 1.5, None) == (int(1.5 * MIB), None)
    assert cfg._check_arguments(True, None, "GPU:1") == (None, (1,))
    assert cfg._check_arguments(True, 64, [1, "gpu:1", "GPU:0"]) == (64 * MIB, (1, 0))


# --------------------------------------------------------------------------
# Backends without GPU settings, the record, the logging.


def test_nothing_requested_and_numpy_backend(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cfg, "_active_backend", lambda: "numpy")
    monkeypatch.setattr(cfg, "_last", None)  # restored after the test
    with caplog.at_level(logging.INFO, logger="keras_memwatch"):
        nothing = cfg.configure_memory()
        numpy_config = cfg.configure_memory(allow_growth=True, memory_limit_mb=256)
    assert not nothing.applied and not numpy_config.applied
    assert "'numpy' Keras backend has no GPU memory settings" in str(numpy_config)
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO]
    assert cfg.last_memory_config() is numpy_config
    assert cfg.applied_limit_bytes("GPU:0") is None


def test_memory_config_lookup_and_text() -> None:
    entry = cfg.DeviceMemoryConfig(
        "GPU:1", True, 2 * GIB, 80 * GIB, "XLA_CLIENT_MEM_FRACTION=0.025"
    )
    config = cfg.MemoryConfig("jax", True, 2048, (entry,))
    assert config.applied
    assert config.device("gpu:1") is entry
    assert config.limit_bytes(1) == 2 * GIB
    assert config.limit_bytes("GPU:0") is None
    text = str(config)
    assert "backend: jax" in text
    assert "GPU:1: growth on, limit 2.00 GiB (2147483648 bytes) of 80.00 GiB" in text
    assert "XLA_CLIENT_MEM_FRACTION=0.025" in text
    with pytest.raises(AttributeError):
        config.backend = "torch"  # type: ignore[misc]


# --------------------------------------------------------------------------
# NVML totals, in-process with a fake pynvml.


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
        ("GPU-2222", [30]),  # a UUID prefix
        ("GPU-", []),  # ambiguous prefix: invalid
    ],
)
def test_nvml_totals_honour_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, visible: Optional[str], expected: list[int]
) -> None:
    fake = _fake_nvml(monkeypatch, [10 * GIB, 20 * GIB, 30 * GIB], reserved=615 * MIB)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    view = cfg._nvml_visible_totals()
    # NVML's own total includes the driver's reserve; CUDA's does not.
    assert view.totals == [g * GIB for g in expected]
    assert fake.calls == ["init", "shutdown"]


def test_nvml_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_nvml(monkeypatch, [GIB], fail_init=True)
    view = cfg._nvml_visible_totals()
    assert view.totals is None
    assert "NVML Shared Library Not Found" in view.reason
    assert fake.calls == ["init"]  # no shutdown without a successful init


def test_jax_fraction_rounds_down() -> None:
    total = 150_109_880_320  # an H200 as CUDA reports it
    fraction = cfg._jax_fraction(4 * GIB, [total])
    assert fraction == "0.028612"
    assert float(fraction) * total <= 4 * GIB
    assert cfg._jax_fraction(GIB, [2 * GIB, 4 * GIB]) == "0.25"


def test_jax_fraction_variable_is_read_by_installed_jaxlib() -> None:
    pytest.importorskip("jaxlib")
    name = cfg._jax_fraction_var()
    import importlib.util

    spec = importlib.util.find_spec("jaxlib")
    assert spec is not None and spec.submodule_search_locations
    source = pathlib.Path(list(spec.submodule_search_locations)[0], "xla_client.py")
    assert f"'{name}'" in source.read_text() or f'"{name}"' in source.read_text()


# --------------------------------------------------------------------------
# JAX, in children.


def test_jax_sets_environment_before_start_and_refuses_too_late() -> None:
    result = _run_child(
        "jax",
        """
        nvml = install_fake_nvml([80 * 2**30, 80 * 2**30], reserved=600 * 2**20)
        assert "jax._src.xla_bridge" not in sys.modules or not sys.modules[
            "jax._src.xla_bridge"]._backends

        config = configure_memory(allow_growth=True, memory_limit_mb=2048)
        assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        fraction = os.environ["XLA_CLIENT_MEM_FRACTION"]
        assert fraction == "0.025", fraction
        assert [d.device for d in config.devices] == ["GPU:0", "GPU:1"]
        assert config.limit_bytes("GPU:1") == 2048 * 2**20
        assert applied_limit_bytes(0) == 2048 * 2**20
        assert "XLA_CLIENT_MEM_FRACTION=0.025" in config.devices[0].mechanism
        assert records[-1][0] == "INFO" and "GPU:1: growth on" in records[-1][1]
        assert nvml.calls[-2:] == ["init", "shutdown"]

        # The names are the ones the installed jaxlib reads (real code).
        from jaxlib import xla_client
        if hasattr(xla_client, "generate_pjrt_gpu_plugin_options"):
            options = xla_client.generate_pjrt_gpu_plugin_options()
            assert options["memory_fraction"] == 0.025, options
            assert options["preallocate"] is False, options
            result["plugin_options_checked"] = True

        # JAX settings are process-wide: no subset, no unknown device.
        message = expect(ValueError, allow_growth=True, devices=["GPU:0"])
        assert "CUDA_VISIBLE_DEVICES" in message and "devices=['GPU:0']" in message
        message = expect(ValueError, allow_growth=True, devices=["GPU:5"])
        assert "['GPU:5']" in message and "['GPU:0', 'GPU:1']" in message
        message = expect(ValueError, memory_limit_mb=100_000)
        assert "memory_limit_mb=100000" in message and "81920 MiB" in message

        # The deprecated name would make jaxlib refuse to start beside the new one.
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.5"
        configure_memory(memory_limit_mb=4096)
        assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in os.environ
        assert os.environ["XLA_CLIENT_MEM_FRACTION"] == "0.05"
        assert records[-2][0] == "WARNING" and "deprecated" in records[-2][1]

        # JAX restricted to the CPU (JAX_PLATFORMS / jax_platforms): nothing to do.
        import jax
        jax.config.update("jax_platforms", "cpu")
        config = configure_memory(allow_growth=False)
        assert not config.applied and "restricted to platforms 'cpu'" in config.note
        assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        jax.config.update("jax_platforms", None)
        configure_memory(allow_growth=True, memory_limit_mb=2048)

        # The CUDA plugin reads the variables when it is registered, which
        # can come before the backends exist.
        import jax._src.xla_bridge as xb
        if hasattr(xb, "_discover_and_register_pjrt_plugins"):
            xb._discover_and_register_pjrt_plugins()
            assert not xb._backends
            message = expect(RuntimeError, allow_growth=False)
            assert "registered its GPU plugin" in message
            result["registration_checked"] = True

        # Start JAX for real, then ask for something else: too late.
        jax.devices()
        message = expect(RuntimeError, allow_growth=False)
        assert "JAX initialised its backends (cpu)" in message, message
        assert "XLA_PYTHON_CLIENT_PREALLOCATE=true" in message
        assert "first thing" in message and "before building any model" in message
        assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        message = expect(RuntimeError, memory_limit_mb=1024)
        assert "XLA_CLIENT_MEM_FRACTION=0.0125" in message
        assert os.environ["XLA_CLIENT_MEM_FRACTION"] == "0.025"

        # What was set before JAX started is in effect: not an error.
        config = configure_memory(allow_growth=True, memory_limit_mb=2048)
        assert "already set before JAX started" in config.devices[0].note
        assert "without a GPU backend" in config.devices[0].note
        """,
    )
    assert result.get("plugin_options_checked")


def test_jax_without_gpu_is_a_logged_no_op() -> None:
    result = _run_child(
        "jax",
        """
        from keras_memwatch import config as cfg
        view = cfg._nvml_visible_totals()
        result["nvml"] = view.totals
        if view.totals is None and not cfg._nvidia_driver_present():
            for _ in range(2):
                records.clear()
                config = configure_memory(allow_growth=True, memory_limit_mb=1024)
                assert not config.applied
                assert "no NVIDIA GPU found" in config.note
                assert records == [("INFO", str(config))], records
                assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ
                assert "XLA_CLIENT_MEM_FRACTION" not in os.environ
                import jax
                jax.devices()  # started on CPU: still a no-op, never an error
            result["checked"] = True
        """,
    )
    if not result.get("checked"):
        pytest.skip(f"an NVIDIA GPU is visible here (NVML: {result['nvml']})")


# --------------------------------------------------------------------------
# TensorFlow, in a child: fake GPUs in TensorFlow's own device bookkeeping.


def test_tensorflow_growth_limits_and_too_late() -> None:
    result = _run_child(
        "tensorflow",
        """
        import tensorflow as tf
        from tensorflow.python.eager import context

        # Real: no GPU here, so a logged no-op.
        config = configure_memory(allow_growth=True, memory_limit_mb=512)
        if tf.config.list_physical_devices("GPU"):
            result["real_gpu"] = True
            print("RESULT:" + json.dumps(result))
            sys.exit(0)
        assert not config.applied and "TensorFlow sees no GPU" in config.note
        assert records == [("INFO", str(config))], records

        install_fake_nvml([16 * 2**30, 16 * 2**30])
        ctx = context.context()
        ctx._initialize_physical_devices()
        gpus = [
            tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU")
            for i in range(2)
        ]

        def add_fake_gpus():
            for gpu in gpus:
                ctx._physical_devices.append(gpu)
                ctx._visible_device_list.append(gpu)
                ctx._memory_growth_map[gpu] = None

        def remove_fake_gpus():
            for gpu in gpus:
                ctx._physical_devices.remove(gpu)
                ctx._visible_device_list.remove(gpu)
                ctx._memory_growth_map.pop(gpu, None)
                ctx._virtual_device_map.pop(gpu, None)

        add_fake_gpus()
        assert tf.config.list_physical_devices("GPU") == gpus

        # Growth alone: TensorFlow's own memory growth, on every GPU.
        config = configure_memory(allow_growth=True)
        growth = [tf.config.experimental.get_memory_growth(g) for g in gpus]
        assert growth == [True, True]
        assert [d.device for d in config.devices] == ["GPU:0", "GPU:1"]
        assert "TF_FORCE_GPU_ALLOW_GROWTH" not in os.environ
        # TensorFlow needs one growth setting for all visible GPUs.
        message = expect(ValueError, allow_growth=False, devices=["GPU:0"])
        assert "same memory growth on every visible GPU" in message

        # A limit on one GPU: a logical device with memory_limit.
        config = configure_memory(memory_limit_mb=1024, devices=[1])
        assert tf.config.get_logical_device_configuration(gpus[1]) == [
            tf.config.LogicalDeviceConfiguration(memory_limit=1024)]
        assert tf.config.get_logical_device_configuration(gpus[0]) is None
        assert [d.device for d in config.devices] == ["GPU:1"]
        assert applied_limit_bytes("GPU:1") == 2**30
        assert applied_limit_bytes("GPU:0") is None
        assert config.devices[0].total_bytes == 16 * 2**30
        # TensorFlow's rules behind the growth + limit decision: growth is
        # refused on a GPU with a logical device, and ignored for every GPU
        # once one GPU has one.
        try:
            tf.config.experimental.set_memory_growth(gpus[1], True)
            raise AssertionError("TensorFlow accepted growth beside a limit")
        except ValueError as error:
            assert "virtual devices configured" in str(error)
        assert not ctx._compute_gpu_options().allow_growth

        # Growth and a limit: logical devices plus TF_FORCE_GPU_ALLOW_GROWTH.
        config = configure_memory(allow_growth=True, memory_limit_mb=2048.5)
        assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
        for gpu in gpus:
            assert tf.config.get_logical_device_configuration(gpu) == [
                tf.config.LogicalDeviceConfiguration(memory_limit=2048.5)]
        assert all(d.allow_growth and d.limit_bytes == int(2048.5 * 2**20)
                   for d in config.devices)
        assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in config.devices[0].mechanism

        # Bad values against the devices.
        message = expect(ValueError, memory_limit_mb=32768)
        assert "GPU:0 has 16384 MiB" in message and "memory_limit_mb=32768" in message
        message = expect(ValueError, memory_limit_mb=64, devices=["GPU:3"])
        assert "['GPU:3']" in message and "['GPU:0', 'GPU:1']" in message

        # Start TensorFlow's runtime for real (without the fakes), then
        # bring the fake GPUs back: TensorFlow's own check now refuses.
        remove_fake_gpus()
        tf.constant(1.0) + 1.0
        assert ctx._context_handle is not None
        add_fake_gpus()
        os.environ.pop("TF_FORCE_GPU_ALLOW_GROWTH")
        message = expect(RuntimeError, allow_growth=True)
        assert "TensorFlow started its runtime" in message
        assert "cannot be modified after being initialized" in message
        assert "first thing" in message
        message = expect(RuntimeError, memory_limit_mb=1024)
        assert "Virtual devices cannot be modified" in message
        message = expect(RuntimeError, allow_growth=True, memory_limit_mb=1024)
        assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in message
        assert "TF_FORCE_GPU_ALLOW_GROWTH" not in os.environ
        # A setting equal to the one in effect is no error.
        ctx._memory_growth_map[gpus[0]] = ctx._memory_growth_map[gpus[1]] = False
        config = configure_memory(allow_growth=False)
        assert [d.allow_growth for d in config.devices] == [False, False]
        try:
            configure_memory(allow_growth=True)
        except RuntimeError as error:
            assert isinstance(error.__cause__, RuntimeError)
            result["cause"] = str(error.__cause__)
        """,
    )
    if result.get("real_gpu"):
        pytest.skip("TensorFlow sees a real GPU here")
    assert "cannot be modified after being initialized" in result["cause"]


# --------------------------------------------------------------------------
# PyTorch, in a child: torch.cuda replaced where no GPU exists.


def test_torch_limit_growth_and_late_cap() -> None:
    result = _run_child(
        "torch",
        """
        import types
        import torch

        config = configure_memory(allow_growth=True, memory_limit_mb=512)
        if torch.cuda.is_available():
            result["real_gpu"] = True
            print("RESULT:" + json.dumps(result))
            sys.exit(0)
        assert not config.applied and "PyTorch sees no CUDA GPU" in config.note
        assert records == [("INFO", str(config))], records

        total = 80 * 2**30
        calls, reserved = [], {0: 0, 1: 0}
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 2
        torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(
            total_memory=total)
        torch.cuda.set_per_process_memory_fraction = (
            lambda f, d=None: calls.append((f, d)))
        torch.cuda.memory_reserved = lambda i=None: reserved[i]

        config = configure_memory(
            allow_growth=True, memory_limit_mb=1024, devices=["cuda:1"])
        assert calls == [(1024 * 2**20 / total, 1)], calls
        (entry,) = config.devices
        assert entry.device == "GPU:1" and entry.allow_growth is True
        assert entry.limit_bytes == 2**30 and entry.total_bytes == total
        assert "grows on demand" in entry.mechanism
        assert applied_limit_bytes(1) == 2**30

        # Growth needs nothing; no preallocation exists to turn on.
        calls.clear()
        records.clear()
        config = configure_memory(allow_growth=False)
        assert calls == []
        assert [d.allow_growth for d in config.devices] == [True, True]
        assert "cannot preallocate" in config.devices[0].note
        assert records[0][0] == "WARNING" and "no effect" in records[0][1]

        # A cap below what is already reserved: applied, and said so.
        reserved[0] = 3 * 2**30
        records.clear()
        config = configure_memory(memory_limit_mb=1024, devices=[0])
        assert calls == [(1024 * 2**20 / total, 0)]
        assert "already reserved" in config.devices[0].note
        assert any(level == "WARNING" and "above the new cap" in text
                   for level, text in records), records

        message = expect(ValueError, memory_limit_mb=100_000)
        assert "81920 MiB" in message
        message = expect(ValueError, memory_limit_mb=64, devices=[2])
        assert "['GPU:2']" in message and "devices=[2]" in message
        """,
    )
    if result.get("real_gpu"):
        pytest.skip("PyTorch sees a real GPU here")
