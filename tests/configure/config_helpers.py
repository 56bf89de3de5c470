"""Runs `configure_memory` in fresh Python children, with a fake NVML.

Memory settings are process-global, so each backend's path runs in a fresh
Python child (`run_child`) with `KERAS_BACKEND` set, whatever backend this
pytest process uses. Where no GPU exists, a fake `pynvml` module
(`install_fake_nvml`, defined in every child) stands in for NVML's device
totals.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Optional


REPO = pathlib.Path(__file__).resolve().parents[2]

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
from keras_memwatch.configure import configure_memory

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


def run_child(backend: str, body: str, env: Optional[dict[str, str]] = None) -> dict:
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
