"""Checks trained as jobs in new Python processes (`fresh_process=True`).

A process that has trained keeps some of what its first steps left on the
device, so it can fit a few percent more than a job started afresh. With
`Jobs`, the ladder still runs in the measuring process, but every check is
a child, `python -m keras_memwatch.capacity.fresh_process`, that sets the
same limit with `configure_memory`, loads the model (saved once to a
temporary `.keras` file, with the sample batch) and trains `JOB_EPOCHS`
epochs of `JOB_STEPS` steps with `fit`'s own step, as a job would.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Optional

from keras_memwatch.measure.batches import Batches, repeated, wait_for_steps
from keras_memwatch.capacity.evidence import JOB, Observation
from keras_memwatch.units import MIB, format_bytes

logger = logging.getLogger("keras_memwatch")

TIMEOUT_S = 600  # one child: start, load, train
JOB_STEPS = 10
JOB_EPOCHS = 2
EXIT_OOM = 3  # the child's exit status when its steps ran out of memory


class FreshProcessError(RuntimeError):
    """A child could not train for a reason other than memory."""


class Jobs:
    """The ladder of `steps` (a `steps.Steps`), with every check a job in a
    new process. Build it with `around`."""

    how = JOB
    aims = False
    deadline: Optional[float] = None  # a job is never abandoned

    def __init__(self, steps: Any, directory: str):
        self.steps = steps
        self.directory = directory
        self.above_limit = steps.above_limit
        self.ladder_width = steps.ladder_width
        self.check_width = steps.check_width
        self.in_use, self.limit = steps.in_use, steps.limit
        self.limit_words = steps.limit_words

    @property
    def words(self) -> str:
        """What the ladder's needs are read from, and how the checks are."""
        return f"{self.steps.words}; checks as jobs in new processes"

    @classmethod
    def around(cls, steps: Any) -> Any:
        """`Jobs` around `steps`, or `steps` itself (with a warning saying
        why) where jobs cannot check: not PyTorch on a GPU under a cap, too
        little free device memory beside this process, or a model Keras
        cannot save."""
        device = steps.device
        why = ""
        if device.backend != "torch" or not device.on_gpu or not steps.above_limit:
            why = "only PyTorch on a GPU under an allocator cap trains checks as jobs"
        else:
            import torch

            free = torch.cuda.mem_get_info(device.gpu_index)[0]
            if free < steps.limit:
                why = (f"{device.name} has {format_bytes(free)} free beside this "
                       f"process, less than the {format_bytes(steps.limit)} a job needs")
        if why:
            logger.warning("estimate_max_batch_size: fresh_process=True, but %s; "
                           "the checks train in this process", why)
            return steps
        directory = tempfile.mkdtemp(prefix="keras_memwatch_fresh_")
        try:
            steps.model.save(os.path.join(directory, "model.keras"))
            save_batch(directory, steps.data.x, steps.data.y)
        except Exception as e:
            shutil.rmtree(directory, ignore_errors=True)
            logger.warning("estimate_max_batch_size: fresh_process=True, but the "
                           "model could not be saved for a new process (%r); the "
                           "checks train in this process", e)
            return steps
        return cls(steps, directory)

    def ladder(self, sizes: Sequence[int]) -> list[Observation]:
        return self.steps.ladder(sizes)

    def check(self, sizes: Sequence[int]) -> list[Observation]:
        return [self._job(b) for b in sizes]

    def _job(self, size: int) -> Observation:
        began = time.perf_counter()
        model_module = type(self.steps.model).__module__.split(".")[0]
        try:
            done = subprocess.run(
                [sys.executable, "-m", "keras_memwatch.capacity.fresh_process",
                 self.directory, str(size), str(self.limit), model_module],
                capture_output=True, text=True, timeout=TIMEOUT_S,
                env=_child_env(self.steps.device.gpu_index))
        except subprocess.TimeoutExpired:
            raise FreshProcessError(f"batch {size} took over {TIMEOUT_S} s") from None
        out = _last_json(done.stdout)
        if out is None or done.returncode not in (0, EXIT_OOM):
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise FreshProcessError(
                f"batch {size}: the process exited {done.returncode} ({tail[:300]})")
        ran = done.returncode == 0
        peak = out.get("allocated")
        need = None if peak is None else max(int(peak) - self.in_use, 0)
        seconds = time.perf_counter() - began
        self.steps.progress(f"estimate_max_batch_size: batch {size}, a job in a new "
                            f"process ({seconds:.1f} s): "
                            + ("ran" if ran else "out of memory"))
        return Observation(size, need, JOB, ran=ran, seconds=round(seconds, 3))

    def close(self) -> None:
        """Deletes the saved model and batch."""
        shutil.rmtree(self.directory, ignore_errors=True)


def _child_env(index: Optional[int]) -> dict[str, str]:
    """This process's environment, the child seeing device `index` first."""
    import keras

    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend())
    if index:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        ids = [d.strip() for d in visible.split(",")] if visible else None
        env["CUDA_VISIBLE_DEVICES"] = ids[index] if ids and index < len(ids) else str(index)
    return env


def _last_json(text: str) -> Optional[dict]:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def save_batch(directory: str, x: Any, y: Any) -> None:
    """Writes the sample batch as arrays (`batch.npz`) and its nesting as
    JSON (`batch.json`): nothing a child loads can run code."""
    import keras
    import numpy as np

    leaves: list = []

    def index(array: Any) -> Optional[int]:
        if array is None:
            return None
        leaves.append(array)
        return len(leaves) - 1

    structure = keras.tree.map_structure(index, {"x": x, "y": y})
    np.savez(os.path.join(directory, "batch.npz"),
             **{str(i): a for i, a in enumerate(leaves)})
    with open(os.path.join(directory, "batch.json"), "w") as f:
        json.dump(structure, f)


def load_batch(directory: str) -> tuple[Any, Any]:
    """`(x, y)` as `save_batch` wrote them (lists where there were tuples)."""
    import keras
    import numpy as np

    with open(os.path.join(directory, "batch.json")) as f:
        structure = json.load(f)
    with np.load(os.path.join(directory, "batch.npz"), allow_pickle=False) as arrays:
        batch = keras.tree.map_structure(
            lambda i: None if i is None else arrays[str(i)], structure)
    return batch["x"], batch["y"]


def train_fresh(directory: str, size: int, limit_bytes: int,
                model_module: str = "") -> tuple[int, dict]:
    """The child's work: limit, load, train. Returns `(exit status, report)`."""
    from keras_memwatch.configure import configure_memory

    configure_memory(memory_limit_mb=limit_bytes / MIB, devices=[0])
    import importlib

    import keras

    from keras_memwatch.oom_errors import is_oom_error

    if model_module and model_module not in ("keras", "__main__"):
        importlib.import_module(model_module)  # registers its classes
    model = keras.saving.load_model(os.path.join(directory, "model.keras"))
    x, y = load_batch(directory)
    cuda: Any = None  # torch.cuda, where PyTorch trains on a GPU
    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            cuda = torch.cuda
            cuda.reset_peak_memory_stats()
    try:
        keras.Model.fit(model, repeated(*Batches(x, y).take(size), JOB_STEPS),
                        epochs=JOB_EPOCHS, verbose=0)
        wait_for_steps(model)  # JAX: a step out of memory raises only here
    except Exception as e:
        if not is_oom_error(e):
            raise
        return EXIT_OOM, {"error": type(e).__name__}
    if cuda is None:
        return 0, {}
    cuda.synchronize()
    return 0, {"allocated": int(cuda.max_memory_allocated())}


def main(argv: Optional[list[str]] = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    directory, size, limit_bytes = args[:3]
    status, report = train_fresh(directory, int(size), int(limit_bytes),
                                 args[3] if len(args) > 3 else "")
    print(json.dumps(report), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
