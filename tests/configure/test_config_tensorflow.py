"""`configure_memory` under TensorFlow, in a child with fake GPUs.

The fake GPUs are added to TensorFlow's own device bookkeeping, so
TensorFlow's real rules and "too late" errors apply.
"""

from __future__ import annotations

import pytest

from config_helpers import run_child


def test_tensorflow_growth_limits_and_too_late() -> None:
    result = run_child(
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
        assert config.limit_bytes("GPU:1") == 2**30
        assert config.limit_bytes("GPU:0") is None
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
