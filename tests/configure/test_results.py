"""`MemoryConfig` and `DeviceMemoryConfig`: lookup and text."""

from __future__ import annotations

import pytest

from keras_memwatch.configure import DeviceMemoryConfig, MemoryConfig

GIB = 1 << 30


def test_memory_config_lookup_and_text() -> None:
    entry = DeviceMemoryConfig(
        "GPU:1", True, 2 * GIB, 80 * GIB, "XLA_CLIENT_MEM_FRACTION=0.025"
    )
    config = MemoryConfig("jax", True, 2048, (entry,))
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
