"""Argument checks of `configure_memory`, run before any framework import."""

from __future__ import annotations

from typing import Any

import pytest

from keras_memwatch import configure as cfg
from keras_memwatch.configure.arguments import check_arguments

MIB = 1 << 20


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
    assert check_arguments(True, None, name) == (None, (index,))
    assert check_arguments(True, None, [name]) == (None, (index,))


def test_arguments_normalised() -> None:
    assert check_arguments(None, 1.5, None) == (int(1.5 * MIB), None)
    assert check_arguments(True, None, "GPU:1") == (None, (1,))
    assert check_arguments(True, 64, [1, "gpu:1", "GPU:0"]) == (64 * MIB, (1, 0))
