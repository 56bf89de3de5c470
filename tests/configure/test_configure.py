"""`configure_memory` where a backend has nothing to set, and its logging."""

from __future__ import annotations

import logging

import pytest

from keras_memwatch import configure as cfg


def test_nothing_requested_and_numpy_backend(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cfg, "_active_backend", lambda: "numpy")
    with caplog.at_level(logging.INFO, logger="keras_memwatch"):
        nothing = cfg.configure_memory()
        numpy_config = cfg.configure_memory(allow_growth=True, memory_limit_mb=256)
    assert not nothing.applied and not numpy_config.applied
    assert "'numpy' Keras backend has no GPU memory settings" in str(numpy_config)
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO]
