"""A row's checks as jobs in new processes (`ways_to_fit(fresh_process=True)`).

The measuring process holds the user's model beside each variant, and has
trained: near the limit, the sizes its steps fit differ by a size or so
from those of a job of the variant started afresh (PyTorch's caching
allocator, split blocks, arrays freed by the collector or not). With
`FreshJobs`, each row's ladder still runs in the measuring process, and
each check near the limit is a job of the row's setting in a new process
(`capacity.fresh_process.Jobs`), as the user would run it: the model
built again from its config (`model.json`, the weights new) with the
setting's levers pulled, under the cap the row is read against, trained
by `fit`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
from typing import Any, Optional

from keras_memwatch.capacity.fresh_process import (
    Child, Jobs, child_arguments, load_batch, save_batch, start_job, train_job,
    written_directory)
from keras_memwatch.measure.batches import Batches
from keras_memwatch.ways.variant import (Setting, from_config, model_config,
                                         pulled, rebuild_problem, uncompilable)

logger = logging.getLogger("keras_memwatch")

CONFIG = "model.json"


class FreshJobs:
    """The files a table's jobs load, written at the first row that can
    check by jobs, and each row's checks as jobs; a warning, once, where
    none can.

    Args:
        model: the user's compiled model.
        data: its sample batch.
    """

    def __init__(self, model: Any, data: Batches):
        self.model = model
        self.data = data
        self.directory: Optional[str] = None
        self.refused = ""

    def around(self, steps: Any, setting: Setting, widened: int) -> Any:
        """The checks of `steps` (a row's real steps, measured with the
        cap widened by `widened` bytes) as jobs of `setting`, under the cap
        before it was widened; `steps` itself where jobs cannot check."""
        if self.refused:
            return steps
        limit = None if steps.limit is None else steps.limit - widened
        why, width = Jobs.refusal(steps, limit)
        if not why and self.directory is None:
            why = self._save()
        if why:
            return self._refuse(steps, why)
        child = Child(__name__, ("--setting", json.dumps(dataclasses.asdict(setting))),
                      limit_bytes=limit, base_bytes=steps.in_use - widened)
        return Jobs(steps, self.directory, child, width, own=False)

    def _save(self) -> str:
        """Writes the model's config and the sample batch; why not, or `""`."""
        problem = rebuild_problem(self.model)
        if problem:
            return problem
        config = model_config(self.model)
        problem = uncompilable(config)
        if problem:
            return problem

        def write(directory: str) -> None:
            with open(os.path.join(directory, CONFIG), "w") as f:
                json.dump(config, f)
            save_batch(directory, self.data.x, self.data.y)

        try:
            self.directory = written_directory(write)
        except Exception as e:  # noqa: BLE001 - the user's config, any error
            return f"the model could not be saved for a new process ({e!r})"
        return ""

    def _refuse(self, steps: Any, why: str) -> Any:
        if not self.refused:
            logger.warning("ways_to_fit: fresh_process=True, but %s; the checks "
                           "train in this process", why)
            self.refused = why
        return steps

    def close(self) -> None:
        """Deletes the files the jobs loaded."""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def variant_for_job(directory: str, setting: Setting) -> tuple[Any, Batches]:
    """The model of `setting`, built from the config in `directory`, and
    the sample batch as the setting feeds it."""
    with open(os.path.join(directory, CONFIG)) as f:
        model = from_config(json.load(f), setting.policy)
    shown = pulled(model, Batches(*load_batch(directory)), setting, build=False)
    return model, shown


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--setting", default="{}", help="a `Setting` as JSON")
    args = child_arguments(argv, parser)
    start_job(args.limit_bytes, args.model_module, args.break_cycles)
    model, data = variant_for_job(args.directory,
                                  Setting.from_dict(json.loads(args.setting)))
    status, report = train_job(model, data.x, data.y, args.size)
    print(json.dumps(report), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
