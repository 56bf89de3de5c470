"""Figures saved where the user said: the formats matplotlib writes, the
checks made before anything is drawn, and the save that never replaces a
file by surprise."""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from keras_memwatch.files import open_new, place_problem

__all__ = ["image_formats", "plot_path_problem", "pyplot", "save_figure"]

PathLike = Union[str, "os.PathLike[str]"]


def pyplot() -> Any:
    """Imports pyplot (which picks Agg by itself on a headless machine)."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "Plotting needs matplotlib: pip install matplotlib "
            "(or pip install 'keras-memwatch[plot]')") from None
    return plt


def image_formats() -> dict[str, str]:
    """Extension -> format name, of what matplotlib can write (needs
    matplotlib)."""
    pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    return dict(FigureCanvasBase.get_supported_filetypes())


def plot_path_problem(path: PathLike, overwrite: bool = False,
                      argument: str = "--plot") -> Optional[str]:
    """Why a figure cannot be saved at `path`, or `None`; checks before
    anything is drawn, creates nothing.

    Refused: no matplotlib; no extension or one matplotlib cannot write
    (matplotlib would otherwise append `.png` to a bare name, or fail after
    drawing); a folder; a missing or read-only folder; an existing file
    unless `overwrite`.

    Args:
        path: where the figure is to go.
        overwrite: an existing file may be replaced. Defaults to `False`.
        argument: how the message names the path. Defaults to `"--plot"`.

    Returns:
        One sentence that names the argument and the fix, or `None`.
    """
    path = os.fspath(path)
    try:
        formats = image_formats()
    except ImportError as e:
        return f"{argument} needs matplotlib: {e}"
    listed = ", ".join(f".{ext}" for ext in ("png", "svg", "pdf") if ext in formats)
    stem, ext = os.path.splitext(path)
    ext = ext[1:].lower()
    if os.path.isdir(path):
        return (f"{argument} {path} is a folder: give a file name, e.g. "
                f"{argument} {os.path.join(path, 'memwatch.png')}")
    if not ext:
        return (f"{argument} {path} has no extension, so the format is unknown: "
                f"add one ({listed}, ...), e.g. {argument} {path}.png")
    if ext not in formats:
        return (f"{argument} {path}: matplotlib cannot write .{ext} files; use "
                f"{listed} or another of {', '.join(sorted(formats))}, e.g. "
                f"{argument} {stem}.png")
    return place_problem(argument, path, overwrite, "--force")


def save_figure(fig: Any, path: PathLike, overwrite: bool = False) -> str:
    """Saves `fig` at exactly `path`, in the format its extension names.

    The file is created exclusively unless `overwrite`, so an existing file
    is never replaced by surprise, even one created after a check; a file
    half-written by a failed save is removed.

    Returns:
        `path`, as a string.

    Raises:
        FileExistsError: `path` exists and `overwrite` is False.
        ValueError: `path` has no extension matplotlib can write.
        OSError: the file cannot be written.
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1][1:].lower()
    if ext not in image_formats():
        raise ValueError(f"Expected a path ending in an image format's extension "
                         f"(.png, .svg, .pdf, ...). Received: {path!r}")
    with open_new(path, overwrite, binary=True) as f:
        try:
            fig.savefig(f, format=ext, dpi=110, bbox_inches="tight")
        except BaseException:
            f.close()
            os.remove(path)
            raise
    return path
