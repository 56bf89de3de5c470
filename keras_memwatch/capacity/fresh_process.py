"""Checks trained as jobs in new Python processes (`fresh_process=True`).

A process that has trained keeps some of what its first steps left on the
device, so it can fit a size more or less than a job started afresh. With
`Jobs`, the ladder still runs in the measuring process, but every check is
a child, `python -m keras_memwatch.capacity.fresh_process`, that sets the
same limit with `configure_memory`, loads the model (saved once to a
temporary `.keras` file, with the sample batch) and trains `JOB_EPOCHS`
epochs of `JOB_STEPS` steps with `fit`'s own step, as a job would. Where
Keras's tree functions no longer hold each step's arrays in reference
cycles in this process (`break_tree_cycles`), the child breaks them too.
Where the device has room for several under the cap, a round's checks
train side by side (`JOBS_SIDE_BY_SIDE`): each process's cap is its own.
A size that trained trains again in a new job, and counts as fitting only
where each of its `JOBS_TO_FIT` jobs trained. A job that ran out of memory
because the device did (other processes held it), not its cap, counts for
nothing: it is started again, and the jobs after it train one at a time.
Another child module (`ways_to_fit`'s rows) takes the same arguments and
more (`Child`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Callable, NamedTuple, Optional

from keras_memwatch.measure.batches import Batches, repeated, wait_for_steps
from keras_memwatch.capacity.evidence import JOB, Observation
from keras_memwatch.units import GIB, MIB, format_bytes

logger = logging.getLogger("keras_memwatch")

TIMEOUT_S = 600  # one child: start, load, train
JOB_STEPS = 10
JOB_EPOCHS = 2
EXIT_OOM = 3  # the child's exit status when its steps ran out of memory
#: A size counts as fitting once this many jobs of it trained, one after
#: the other: near the limit, the same size trains in one new process and
#: runs out of memory in the next.
JOBS_TO_FIT = 2
#: How often a size's job is started again where the device ran out of
#: memory before the job's cap (`oom_errors.device_ran_out`).
DEVICE_FULL_RETRIES = 2
#: The most jobs a round trains side by side, and what each needs on the
#: device beside its cap (PyTorch's CUDA context).
JOBS_SIDE_BY_SIDE = 4
CONTEXT_BYTES = GIB
BREAK_FLAG = "--break-tree-cycles"


class FreshProcessError(RuntimeError):
    """A child could not train for a reason other than memory under its cap."""


class Run(NamedTuple):
    """One job: whether it trained, its need above the base (where it
    reported a peak), and whether the device ran out before its cap."""

    ran: bool
    need: Optional[int] = None
    device_full: bool = False


@dataclasses.dataclass(frozen=True)
class Child:
    """What a job's process runs: `python -m module DIRECTORY SIZE LIMIT
    MODEL_MODULE [--break-tree-cycles] *arguments`.

    Attributes:
        module: the module run, with `main`.
        arguments: what follows the common arguments.
        limit_bytes: the cap each job sets, or `None`: the measuring
            process's limit.
        base_bytes: what a job's peak is read above, or `None`: the memory
            in use in the measuring process.
    """

    module: str = __name__
    arguments: tuple[str, ...] = ()
    limit_bytes: Optional[int] = None
    base_bytes: Optional[int] = None


class Jobs:
    """The ladder of `steps` (a `steps.Steps`), with every check a job in a
    new process: `child` run on the files in `directory` (deleted by
    `close` where the jobs `own` it), `width` side by side. `around` builds
    it for a model saved as a `.keras` file."""

    how = JOB
    aims = False
    checks_in_turn = False  # read for plans only
    ladder_width = 1
    deadline: Optional[float] = None  # a job is never abandoned

    def __init__(self, steps: Any, directory: str, child: Child = Child(),
                 width: int = 1, own: bool = True):
        self.steps = steps
        self.directory = directory
        self.child = child
        self.own = own
        self.above_limit = steps.above_limit
        self.check_width = width
        self.in_use = steps.in_use
        self.limit = steps.limit
        self.limit_words = steps.limit_words
        self.job_limit = (child.limit_bytes if child.limit_bytes is not None
                          else steps.limit)
        self.base = child.base_bytes if child.base_bytes is not None else steps.in_use
        self.break_cycles = _cycles_broken(steps.device.backend)
        #: Set once a job found the device full: side by side, the jobs
        #: met other processes' memory.
        self.one_at_a_time = False

    @property
    def words(self) -> str:
        """What the ladder's needs are read from, and how the checks are."""
        return f"{self.steps.words}; checks as jobs in new processes"

    @property
    def build_left(self) -> tuple[int, int]:
        return self.steps.build_left

    @staticmethod
    def refusal(steps: Any, limit: Optional[int]) -> tuple[str, int]:
        """Why jobs with a cap of `limit` bytes cannot check beside `steps`
        (not PyTorch on a GPU under a cap, too little free device memory
        beside this process), or `""`; and how many fit side by side."""
        device = steps.device
        if (limit is None or device.backend != "torch" or not device.on_gpu
                or not steps.above_limit):
            return ("only PyTorch on a GPU under an allocator cap trains checks as "
                    "jobs"), 1
        import torch

        free = torch.cuda.mem_get_info(device.gpu_index)[0]
        if free < limit:
            return (f"{device.name} has {format_bytes(free)} free beside this "
                    f"process, less than the {format_bytes(limit)} a job needs"), 1
        return "", max(1, min(JOBS_SIDE_BY_SIDE, free // (limit + CONTEXT_BYTES)))

    @classmethod
    def around(cls, steps: Any) -> Any:
        """`Jobs` around `steps` that load the model from a `.keras` file,
        or `steps` itself (with a warning saying why) where jobs cannot
        check (`refusal`) or the model cannot be saved."""
        why, width = cls.refusal(steps, steps.limit)
        if why:
            logger.warning("estimate_max_batch_size: fresh_process=True, but %s; "
                           "the checks train in this process", why)
            return steps
        try:
            directory = written_directory(
                lambda d: save_model(d, steps.model, steps.data))
        except Exception as e:
            logger.warning("estimate_max_batch_size: fresh_process=True, but the "
                           "model could not be saved for a new process (%r); the "
                           "checks train in this process", e)
            return steps
        return cls(steps, directory, width=width)

    def ladder(self, sizes: Sequence[int]) -> list[Observation]:
        return self.steps.ladder(sizes)

    def check(self, sizes: Sequence[int]) -> list[Observation]:
        """Each size a job, the round's side by side; each size that trained
        trains again in new jobs until `JOBS_TO_FIT` did, and counts as
        fitting only where every one of them trained. A job that found the
        device full is started again, and from then on jobs train one at a
        time."""
        began = time.perf_counter()
        runs: dict[int, list[Run]] = {b: [] for b in sizes}
        again = list(sizes)
        while again:
            ended = ([self._train([b])[0] for b in again] if self.one_at_a_time
                     else self._train(again))
            for b, run in zip(again, ended):
                runs[b].append(run)
                if run.device_full:
                    self._device_full(b, runs[b])
            again = [b for b in sizes if _another_job(runs[b])]
        seconds = round(time.perf_counter() - began, 3)
        made = []
        for b in sizes:
            counted = _counted(runs[b])
            ran = all(r.ran for r in counted)
            peaks = [r.need for r in counted if r.need is not None]
            self.steps.progress(f"estimate_max_batch_size: batch {b}, "
                                f"{_jobs_words(len(runs[b]))} ({seconds:.1f} s): "
                                + _outcomes(runs[b]))
            made.append(Observation(b, max(peaks) if ran and peaks else None, JOB,
                                    ran=ran, seconds=seconds))
        return made

    def _device_full(self, size: int, runs: list[Run]) -> None:
        """After a job of `size` found the device full: jobs one at a time,
        a warning the first time; an error once its retries are spent."""
        full = sum(r.device_full for r in runs)
        if full > DEVICE_FULL_RETRIES:
            raise FreshProcessError(
                f"batch {size}: {self.steps.device.name} ran out of memory before "
                f"the job's cap, in {full} jobs: other processes hold it")
        if not self.one_at_a_time:
            logger.warning(
                "estimate_max_batch_size: a job ran out of memory on %s before "
                "its cap (other processes hold the device); it trains again, and "
                "the jobs train one at a time", self.steps.device.name)
            self.one_at_a_time = True

    def _train(self, sizes: Sequence[int]) -> list[Run]:
        """A job of each size, side by side (their output to files, so that
        none waits on a pipe the others fill): each one's `Run`."""
        began = time.perf_counter()
        model_module = type(self.steps.model).__module__.split(".")[0]
        env = _child_env(self.steps.device.gpu_index)
        started = []
        try:
            for b in sizes:
                out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
                started.append((b, out, err, subprocess.Popen(
                    [sys.executable, "-m", self.child.module, self.directory, str(b),
                     str(self.job_limit), model_module]
                    + ([BREAK_FLAG] if self.break_cycles else [])
                    + list(self.child.arguments), stdout=out, stderr=err, env=env)))
            return [self._ended(b, out, err, p, began) for b, out, err, p in started]
        finally:
            for _, out, err, p in started:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                out.close()
                err.close()

    def _ended(self, size: int, out: Any, err: Any, process: Any,
               began: float) -> Run:
        try:
            process.wait(timeout=max(1.0, TIMEOUT_S - (time.perf_counter() - began)))
        except subprocess.TimeoutExpired:
            raise FreshProcessError(f"batch {size} took over {TIMEOUT_S} s") from None
        out.seek(0)
        err.seek(0)
        report = _last_json(out.read())
        if report is None or process.returncode not in (0, EXIT_OOM):
            tail = (err.read().strip().splitlines() or ["no output"])[-1]
            raise FreshProcessError(
                f"batch {size}: the process exited {process.returncode} ({tail[:300]})")
        peak = report.get("allocated")
        return Run(process.returncode == 0,
                   None if peak is None else max(int(peak) - self.base, 0),
                   bool(report.get("device_full")))

    def close(self) -> None:
        """Deletes the saved model and batch, where they are the jobs' own."""
        if self.own:
            shutil.rmtree(self.directory, ignore_errors=True)


def _jobs_words(n: int) -> str:
    return "a job in a new process" if n == 1 else f"{n} jobs in new processes"


def _outcomes(runs: Sequence[Run]) -> str:
    """`"ran"`, `"out of memory"`, or each job's outcome in order."""
    words = ["the device was full" if r.device_full else "ran" if r.ran
             else "out of memory" for r in runs]
    if len(words) == 1:
        return words[0]
    return "ran in each" if all(w == "ran" for w in words) else ", then ".join(words)


def _another_job(runs: Sequence[Run]) -> bool:
    """Whether a size needs another job: its last found the device full,
    or each job so far trained and fewer than `JOBS_TO_FIT` did."""
    if runs[-1].device_full:
        return True
    counted = _counted(runs)
    return all(r.ran for r in counted) and len(counted) < JOBS_TO_FIT


def _counted(runs: Sequence[Run]) -> list[Run]:
    """The jobs that say what fits under the cap: not those that found the
    device full."""
    return [r for r in runs if not r.device_full]


def _cycles_broken(backend: str) -> bool:
    """Whether a child should break Keras's tree cycles as this process has:
    PyTorch, where Keras's tree functions hold no reference cycles here."""
    if backend != "torch":
        return False
    from keras_memwatch.configure.tree_cycles import tree_holds_cycles

    return not tree_holds_cycles()


def _child_env(index: Optional[int]) -> dict[str, str]:
    """This process's environment, the child seeing device `index` first."""
    import keras

    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend())
    if index:
        visible = env.get("CUDA_VISIBLE_DEVICES")
        ids = [d.strip() for d in visible.split(",")] if visible else None
        env["CUDA_VISIBLE_DEVICES"] = (ids[index] if ids and index < len(ids)
                                       else str(index))
    return env


def _last_json(text: str) -> Optional[dict]:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def written_directory(write: Callable[[str], None]) -> str:
    """A new temporary directory that `write` filled with what a job
    loads; none is left where `write` raised (raised again)."""
    directory = tempfile.mkdtemp(prefix="keras_memwatch_jobs_")
    try:
        write(directory)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


def save_model(directory: str, model: Any, data: Batches) -> None:
    """Writes `model` (`model.keras`) and its sample batch for a child."""
    model.save(os.path.join(directory, "model.keras"))
    save_batch(directory, data.x, data.y)


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


def child_arguments(argv: Optional[Sequence[str]] = None,
                    parser: Optional[argparse.ArgumentParser] = None
                    ) -> argparse.Namespace:
    """A child's arguments (`Child`), with those `parser` adds."""
    parser = parser or argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("size", type=int)
    parser.add_argument("limit_bytes", type=int)
    parser.add_argument("model_module", nargs="?", default="")
    parser.add_argument(BREAK_FLAG, dest="break_cycles", action="store_true")
    return parser.parse_args(argv)


def start_job(limit_bytes: int, model_module: str = "",
              break_cycles: bool = False) -> None:
    """A child's set-up before its model: the cap, the module that
    registers the model's classes, and Keras's tree cycles broken."""
    from keras_memwatch.configure import configure_memory

    configure_memory(memory_limit_mb=limit_bytes / MIB, devices=[0])
    import importlib

    if model_module and model_module not in ("keras", "__main__"):
        importlib.import_module(model_module)
    if break_cycles:
        from keras_memwatch.configure.tree_cycles import break_tree_cycles

        break_tree_cycles()


def train_job(model: Any, x: Any, y: Any, size: int) -> tuple[int, dict]:
    """`fit` of `JOB_EPOCHS` epochs of `JOB_STEPS` steps of `size` samples.
    Returns `(exit status, report)`: the allocator's peak on a GPU, or on
    running out of memory the error's class and whether the device ran
    out before the cap (`device_full`)."""
    import keras

    from keras_memwatch.oom_errors import device_ran_out, is_oom_error

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
        return EXIT_OOM, {"error": type(e).__name__, "device_full": device_ran_out(e)}
    if cuda is None:
        return 0, {}
    cuda.synchronize()
    return 0, {"allocated": int(cuda.max_memory_allocated())}


def train_fresh(directory: str, size: int, limit_bytes: int,
                model_module: str = "", break_cycles: bool = False
                ) -> tuple[int, dict]:
    """The child's work: limit, load, train. Returns `(exit status, report)`."""
    start_job(limit_bytes, model_module, break_cycles)
    import keras

    model = keras.saving.load_model(os.path.join(directory, "model.keras"))
    return train_job(model, *load_batch(directory), size)


def main(argv: Optional[list[str]] = None) -> int:
    args = child_arguments(argv)
    status, report = train_fresh(args.directory, args.size, args.limit_bytes,
                                 args.model_module, args.break_cycles)
    print(json.dumps(report), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
