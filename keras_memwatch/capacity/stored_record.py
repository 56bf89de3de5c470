"""An estimate's record of XLA's plans, kept beside JAX's compilation cache.

A second estimate of the same step finds every compilation in JAX's
persistent cache, but it would still trace and lower each size again, one
at a time (seconds each for a language model). The plans themselves depend
only on the step's program and the compiler's limit, so the record is kept
too: `save` writes the observations to `<cache>/keras_memwatch_records/`,
named by a `fingerprint` of what decides them, and `load` reads them back.
The search then starts from the stored record and asks only what it does
not bracket (nothing, where the limit is the same), and a changed model, a
changed optimizer, another cap, another JAX or other XLA flags make another
fingerprint, so a stale record is never read. A record that cannot be read
or written is skipped with one warning: the estimate measures instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

from keras_memwatch.capacity.evidence import HOWS, Observation
from keras_memwatch.version import __version__

logger = logging.getLogger("keras_memwatch")

__all__ = ["FOLDER", "Stored", "fingerprint", "load", "save"]

#: The folder of records inside the compilation cache's directory.
FOLDER = "keras_memwatch_records"
_FORMAT = 1


class Stored(NamedTuple):
    """A stored record: its observations, and why its ladder stopped."""

    observations: list[Observation]
    stopped: str = ""


def fingerprint(program: str, limit: Optional[int], **decides: Any) -> str:
    """A name for what decides a record's plans.

    Args:
        program: the step's lowered program as text (at any one size: the
            shapes scale with the batch, the rest is the model, the
            optimizer, the loss and the dtype policy).
        limit: the memory limit XLA compiles under, in bytes.
        **decides: everything else the plans depend on (versions, the
            device's kind, compiler options and flags), JSON-serializable.

    Returns:
        A hexadecimal SHA-256 digest.
    """
    h = hashlib.sha256()
    h.update(json.dumps({"format": _FORMAT, "keras_memwatch": __version__,
                         "limit": limit, **decides},
                        sort_keys=True, default=str).encode())
    h.update(program.encode())
    return h.hexdigest()


def _path(directory: str, key: str) -> str:
    return os.path.join(directory, FOLDER, f"{key}.json")


def load(directory: Optional[str], key: str) -> Stored:
    """The record stored under `key`; empty where there is none (or it
    cannot be read: one warning says why)."""
    if directory is None:
        return Stored([])
    path = _path(directory, key)
    if not os.path.exists(path):
        return Stored([])
    try:
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
        fields = {f.name for f in dataclasses.fields(Observation)}
        out = [Observation(**{k: v for k, v in row.items() if k in fields})
               for row in stored["observations"]]
        if any(o.how not in HOWS for o in out):
            raise ValueError("an observation of an unknown kind")
        return Stored(out, str(stored.get("stopped", "")))
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("keras_memwatch: the stored estimate %s cannot be read "
                       "(%s); measuring instead", path, e)
        return Stored([])


def save(directory: Optional[str], key: str,
         observations: Sequence[Observation], stopped: str = "") -> Optional[str]:
    """Writes `observations`, and why the ladder `stopped`, under `key`
    (whole, or not at all); returns the file's path, or `None` where
    nothing was written (one warning)."""
    if directory is None or not observations:
        return None
    path = _path(directory, key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"format": _FORMAT, "stopped": stopped,
                       "observations": [dataclasses.asdict(o) for o in observations]},
                      f)
        os.replace(temporary, path)
        return path
    except OSError as e:
        logger.warning("keras_memwatch: the estimate's record cannot be stored "
                       "in %s (%s)", directory, e)
        return None
