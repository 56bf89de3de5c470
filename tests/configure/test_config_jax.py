"""`configure_memory` under JAX: environment variables, set before JAX starts."""

from __future__ import annotations

import pathlib

import pytest

from keras_memwatch.configure.jax import _fraction, _fraction_var

from config_helpers import run_child

GIB = 1 << 30


def test_jax_fraction_rounds_down() -> None:
    total = 150_109_880_320  # an H200 as CUDA reports it
    fraction = _fraction(4 * GIB, [total])
    assert fraction == "0.028612"
    assert float(fraction) * total <= 4 * GIB
    assert _fraction(GIB, [2 * GIB, 4 * GIB]) == "0.25"


def test_jax_fraction_variable_is_read_by_installed_jaxlib() -> None:
    pytest.importorskip("jaxlib")
    name = _fraction_var()
    import importlib.util

    spec = importlib.util.find_spec("jaxlib")
    assert spec is not None and spec.submodule_search_locations
    source = pathlib.Path(list(spec.submodule_search_locations)[0], "xla_client.py")
    assert f"'{name}'" in source.read_text() or f'"{name}"' in source.read_text()


def test_jax_sets_environment_before_start_and_refuses_too_late() -> None:
    result = run_child(
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
        assert config.limit_bytes(0) == 2048 * 2**20
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
    result = run_child(
        "jax",
        """
        from keras_memwatch.configure.nvml_devices import nvidia_driver_present, visible_totals
        view = visible_totals()
        result["nvml"] = view.totals
        if view.totals is None and not nvidia_driver_present():
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


def test_a_device_is_a_gpu_by_any_of_jaxs_names_for_one():
    from types import SimpleNamespace

    from keras_memwatch.configure.jax import is_gpu

    assert all(is_gpu(SimpleNamespace(platform=p)) for p in ("gpu", "cuda", "ROCm"))
    assert not any(is_gpu(SimpleNamespace(platform=p)) for p in ("cpu", "tpu"))
    assert not is_gpu(object())
