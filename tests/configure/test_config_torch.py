"""`configure_memory` under PyTorch, in a child: `torch.cuda` replaced
where no GPU exists."""

from __future__ import annotations

import pytest

from config_helpers import run_child


def test_torch_limit_growth_and_late_cap() -> None:
    result = run_child(
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
        assert config.limit_bytes(1) == 2**30

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
