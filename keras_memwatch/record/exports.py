"""A record written to a file: CSV or Parquet, never over an existing file
unless asked."""

from __future__ import annotations

import pandas as pd

from keras_memwatch.files import open_new
from keras_memwatch.record.csvlog import PathLike


def write_csv(frame: pd.DataFrame, path: PathLike, overwrite: bool = False) -> None:
    """Writes `frame` as CSV, readable by `keras_memwatch.load_log`.

    Raises:
        FileExistsError: if `path` exists and `overwrite` is `False`.
    """
    with open_new(path, overwrite) as f:
        frame.to_csv(f, index=False)


def write_parquet(frame: pd.DataFrame, path: PathLike, overwrite: bool = False) -> None:
    """Writes `frame` as Parquet (needs pyarrow).

    Raises:
        ImportError: without pyarrow, naming the install command.
        FileExistsError: if `path` exists and `overwrite` is `False`.
    """
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ImportError(
            "Writing Parquet needs pyarrow: pip install pyarrow "
            "(or pip install 'keras-memwatch[parquet]')") from None
    with open_new(path, overwrite, binary=True) as f:
        frame.to_parquet(f, index=False)
