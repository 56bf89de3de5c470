"""A benchmark's part in a new process, its progress shown as it runs.

Every GPU script runs its measured parts as children (a new process per
part: JAX's and PyTorch's allocators start empty, and a cap is per
process). A child prints progress lines and ends with one JSON line;
`json_child` shows the progress lines the caller picks as they arrive (a
run cut off still shows where its time went) and returns the JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional


def json_child(module: str, args: Sequence[str], timeout: float, *,
               shown: Callable[[str], bool] = lambda line: False,
               label: str = "") -> Optional[dict[str, Any]]:
    """Runs `python -m module *args`, killed after `timeout` seconds.

    Args:
        module: the script, run as a module.
        args: its arguments.
        timeout: seconds before the child is killed.
        shown: which of its stdout lines to print as they come, each
            with the seconds since the child began.
        label: names the child in what is printed.

    Returns:
        Its last stdout line that starts with `{`, parsed; `None` where it
        printed none (its exit status and the end of its stderr are
        printed to stderr).
    """
    began = time.perf_counter()
    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen([sys.executable, "-m", module, *args],
                                 stdout=subprocess.PIPE, stderr=errors, text=True,
                                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        timer = threading.Timer(timeout, child.kill)
        timer.start()
        result = None
        try:
            for line in child.stdout:
                if line.startswith("{"):
                    result = json.loads(line)
                elif shown(line):
                    print(f"    {label} [{time.perf_counter() - began:.0f} s] "
                          f"{line.rstrip()}", flush=True)
            child.wait()
        finally:
            timer.cancel()
            if child.poll() is None:
                child.kill()
        if result is None:
            errors.seek(0)
            print(f"child {label or list(args)} ended without an answer after "
                  f"{time.perf_counter() - began:.0f} s (exit {child.returncode}; "
                  f"killed at {timeout:.0f} s): {errors.read()[-1500:]}",
                  file=sys.stderr, flush=True)
    return result
