"""New files, never replaced unless asked."""

from __future__ import annotations

import os
from typing import IO, Any, Optional, Union

from keras_memwatch import options

PathLike = Union[str, "os.PathLike[str]"]


def refuse_existing(path: Optional[PathLike], overwrite: bool) -> None:
    """Checks `path` (`None`: nothing to write) and `overwrite`.

    Raises:
        TypeError: for a `path` that is not a path, or an `overwrite` that
            is not a bool.
        FileExistsError: for an existing `path` unless `overwrite`.
    """
    options.path("path", path, optional=True)
    options.boolean("overwrite", overwrite)
    if path is not None and not overwrite and os.path.lexists(path):
        raise FileExistsError(
            f"{os.fspath(path)} exists; pass overwrite=True to replace it")


def open_new(path: PathLike, overwrite: bool, binary: bool = False) -> IO[Any]:
    """`path` opened for writing: created, never replaced unless `overwrite`.

    Raises:
        TypeError: for a `path` that is not a path, or an `overwrite` that
            is not a bool.
        FileExistsError: when `path` exists and `overwrite` is `False`.
    """
    options.path("path", path)
    options.boolean("overwrite", overwrite)
    mode = ("w" if overwrite else "x") + ("b" if binary else "")
    text = {} if binary else {"encoding": "utf-8", "newline": ""}
    try:
        return open(path, mode, **text)
    except FileExistsError:
        refuse_existing(path, overwrite)
        raise


def _folder_problem(argument: str, path: str) -> Optional[str]:
    """What is wrong with the folder of a file to write, in words that name
    `argument`, or `None` where it exists and can be written in."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return (f"{argument} {path}: the folder {os.path.dirname(path) or folder} "
                "does not exist: create it first, or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{argument} {path}: cannot write in {folder}: choose another folder"
    return None


def place_problem(argument: str, path: str, overwrite: bool,
                  replace: str) -> Optional[str]:
    """What stops a new file, whose name was checked, from being written at
    `path`, in words that name `argument`: its folder (`_folder_problem`), or
    the file existing unless `overwrite`, where `replace` says how the caller
    allows replacing it (`"--force"`); `None` where nothing does."""
    problem = _folder_problem(argument, path)
    if problem is None and not overwrite and os.path.lexists(path):
        problem = (f"{argument} {path} exists: pass {replace} to replace it, "
                   "or choose another path")
    return problem
