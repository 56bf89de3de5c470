"""Training a batch size in a new Python process, as a job started at it would.

A process that has trained keeps some of what its first steps left on the
device (allocations of the CUDA libraries, cached blocks placed among the
activations), so the largest batch that trains in the measuring process
can be larger than in a job started afresh. On an H200 under a 6 GiB cap,
a PyTorch block whose activations take 1 MiB a sample trained 646 in the
process that had measured it and 585-617 in new ones; a transformer, 147
and 136. So, on PyTorch, the boundary is searched once more in new
processes: the model is saved once (`model.save`, a `.keras` file in a
temporary folder) with the sample batch, and each size is one child,
`python -m keras_memwatch.capacity.fresh_process`, that sets the same
limit with `configure_memory`, loads the model and trains with `fit` as a
job would: `JOB_EPOCHS` epochs of `JOB_STEPS` steps, Python's garbage
collector running when it will. Each costs a process start and 60 steps
(25-35 s on the H200, measured eight side by side)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Optional

from keras_memwatch.capacity import collector
from keras_memwatch.capacity.batches import Batches, repeated
from keras_memwatch.capacity.result import Trial
from keras_memwatch.units import MIB, format_bytes

TIMEOUT_S = 600  # one child: start, load, train
#: A child trains as a job: `JOB_EPOCHS` epochs of `JOB_STEPS` steps. Two
#: steps are not enough: on an H200 under a 6 GiB cap, the PyTorch block
#: trained 569 for two steps and ran out of memory at 537 and 553 within 60
#: (at batch 500 the peak of 60 steps was 383 MiB, three of its batch-sized
#: tensors held by reference cycles, above the first steps': `collector`);
#: the transformer trained 136 for two steps and failed there within 60.
#: Nor are 60 for every job: 600 steps failed at the recommendations of the
#: transformer (118) and the ResNet (178); with a full collection every 50
#: batches (`cycles.CollectCycles`) 133 and 199, above them, trained 600.
JOB_STEPS = 15
JOB_EPOCHS = 4
JOB = f"{JOB_EPOCHS} epochs of {JOB_STEPS} steps"  # in words
EXIT_OOM = 3  # the child's exit status when the steps ran out of memory


class FreshProcessError(RuntimeError):
    """A child could not train for a reason other than memory."""


class FreshProcessSteps:
    """Trains sizes in fresh processes under the measuring process's limit.

    Use `prepare`; `run(size, purpose)` then works as `RealSteps.run`, and
    `close` deletes the saved model.

    Args:
        directory: holds `model.keras` and the sample batch (`save_batch`).
        limit_bytes: the allocator cap each child sets.
        device_index: the CUDA device measured.
        trials: the list each trial is appended to.
        progress: receives one line per trial.
    """

    def __init__(self, directory: str, limit_bytes: int, device_index: int,
                 trials: list, progress: Callable[[str], None]):
        self.directory = directory
        self.limit_bytes = limit_bytes
        self.device_index = device_index
        self.trials = trials
        self.progress = progress

    @classmethod
    def prepare(cls, model: Any, data: Batches, limit_bytes: int, device_index: int,
                trials: list, progress: Callable[[str], None]
                ) -> tuple[Optional["FreshProcessSteps"], str]:
        """Saves the model and its sample batch for the children.

        Returns:
            `(steps, "")`, or `(None, why)` for a model that Keras cannot
            save.
        """
        directory = tempfile.mkdtemp(prefix="keras_memwatch_fresh_")
        try:
            model.save(os.path.join(directory, "model.keras"))
            save_batch(directory, data.x, data.y)
        except Exception as e:
            shutil.rmtree(directory, ignore_errors=True)
            return None, f"the model could not be saved for a new process ({e!r})"
        return cls(directory, limit_bytes, device_index, trials, progress), ""

    def run(self, size: int, purpose: str) -> bool:
        """Trains `size` in a new process as a job would; whether it ran.

        Raises:
            FreshProcessError: when the child failed for another reason than
                memory (the model could not be loaded, a crash, a timeout).
        """
        began = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "keras_memwatch.capacity.fresh_process",
                 self.directory, str(size), str(self.limit_bytes)],
                capture_output=True, text=True, timeout=TIMEOUT_S,
                env=_child_env(self.device_index))
        except subprocess.TimeoutExpired:
            raise FreshProcessError(f"batch {size} took over {TIMEOUT_S} s") from None
        out = _last_json(done.stdout)
        if out is None or done.returncode not in (0, EXIT_OOM):
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise FreshProcessError(
                f"batch {size}: the process exited {done.returncode} ({tail[:300]})")
        ran = done.returncode == 0
        trial = Trial(batch_size=size, ran=ran, purpose=purpose,
                      allocated_peak_bytes=out.get("allocated"),
                      reserved_peak_bytes=out.get("reserved"),
                      seconds=round(time.perf_counter() - began, 3),
                      error=out.get("error", ""), fresh_process=True,
                      cyclic_bytes=out.get("cyclic"))
        self.trials.append(trial)
        reserved = trial.reserved_peak_bytes
        self.progress(
            f"estimate_max_batch_size: trained batch {size} in a new process "
            f"({purpose}, {trial.seconds:.1f} s): "
            + (f"ran, reserved peak {format_bytes(reserved)}" if ran and reserved
               else "ran" if ran else f"out of memory ({trial.error})"))
        return ran

    def close(self) -> None:
        """Deletes the saved model and batch."""
        shutil.rmtree(self.directory, ignore_errors=True)


def _child_env(index: int) -> dict[str, str]:
    """This process's environment, the child seeing device `index` as its
    first (where Keras computes)."""
    env = dict(os.environ)
    if index:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        ids = [d.strip() for d in visible.split(",")] if visible else None
        env["CUDA_VISIBLE_DEVICES"] = ids[index] if ids and index < len(ids) else str(index)
    import keras

    env["KERAS_BACKEND"] = keras.backend.backend()
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
    JSON (`batch.json`, each array by its index): nothing a child loads
    can run code."""
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


def train_fresh(directory: str, size: int, limit_bytes: int) -> tuple[int, dict]:
    """The child's work: limit, load, train. Returns `(exit status, report)`."""
    from keras_memwatch.configure import configure_memory

    configure_memory(memory_limit_mb=limit_bytes / MIB, devices=[0])
    import keras

    from keras_memwatch.explain.oom import is_oom_error

    model = keras.saving.load_model(os.path.join(directory, "model.keras"))
    x, y = load_batch(directory)
    # As a job would train: `fit`, epochs of many steps (one batch of the
    # sample repeated, so the host holds one), the garbage collector left
    # to run when it will.
    steps = repeated(*Batches(x, y).take(size), JOB_STEPS)
    torch = None
    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        else:
            torch = None
    try:
        model.fit(steps, epochs=JOB_EPOCHS, verbose=0)
        if torch is not None:
            torch.cuda.synchronize()
    except Exception as e:
        if not is_oom_error(e):
            raise
        return EXIT_OOM, {"error": type(e).__name__}
    if torch is None:
        return 0, {}
    return 0, {"allocated": int(torch.cuda.max_memory_allocated()),
               "reserved": int(torch.cuda.max_memory_reserved()),
               "cyclic": collector.freed_by_collection(torch.cuda.memory_allocated)}


def main(argv: Optional[list[str]] = None) -> int:
    directory, size, limit_bytes = (argv if argv is not None else sys.argv[1:])
    status, report = train_fresh(directory, int(size), int(limit_bytes))
    print(json.dumps(report), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
