"""New files, never replaced unless asked."""

from __future__ import annotations

import os
from typing import IO, Any, Union

PathLike = Union[str, "os.PathLike[str]"]


def refuse_existing(path: PathLike, overwrite: bool) -> None:
    """Raises `FileExistsError` for an existing `path` unless `overwrite`."""
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(
            f"{os.fspath(path)} exists; pass overwrite=True to replace it")


def open_new(path: PathLike, overwrite: bool, binary: bool = False) -> IO[Any]:
    """`path` opened for writing: created, never replaced unless `overwrite`.

    Raises:
        FileExistsError: when `path` exists and `overwrite` is `False`.
    """
    mode = ("w" if overwrite else "x") + ("b" if binary else "")
    text = {} if binary else {"encoding": "utf-8", "newline": ""}
    try:
        return open(path, mode, **text)
    except FileExistsError:
        refuse_existing(path, overwrite)
        raise
