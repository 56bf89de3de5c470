"""JAX's persistent compilation cache, set from one option.

`use_compilation_cache(value)` points JAX's persistent compilation cache
(`jax_compilation_cache_dir`) at a directory, so that what one process
compiles (an estimate's plans, `fit`'s step) a later process finds on disk
instead of compiling again. `estimate_max_batch_size(compilation_cache=...)`,
`MemWatch(compilation_cache=...)` and `fit-check --compilation-cache DIR`
all call it.

- A user's own setting always wins: where `jax_compilation_cache_dir` was
  set by anyone else (`jax.config.update`, or the `JAX_COMPILATION_CACHE_DIR`
  environment variable), it is left as it is and one INFO line says so.
- Compilations of at least `MIN_COMPILE_SECONDS` are written (JAX's own
  default is 1 s), where `jax_persistent_cache_min_compile_time_secs` is
  still at JAX's default; entries of any size are written (JAX's default).
- On PyTorch and TensorFlow the option is accepted and does nothing.

To turn the cache off, pass `None` (the default) and leave
`JAX_COMPILATION_CACHE_DIR` unset; a cache set by anyone is turned off for
the whole process with `jax.config.update("jax_enable_compilation_cache",
False)`. The cache is a folder of files: delete it to empty it.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from keras_memwatch import options

logger = logging.getLogger("keras_memwatch")

__all__ = ["MIN_COMPILE_SECONDS", "default_cache_directory", "use_compilation_cache"]

#: Compilations at least this long are written to the cache.
MIN_COMPILE_SECONDS = 0.5
#: JAX's default of `jax_persistent_cache_min_compile_time_secs`.
_JAX_DEFAULT_MIN_COMPILE_SECONDS = 1.0
_ENV = "JAX_COMPILATION_CACHE_DIR"

#: The directory this module set last (`None` where it set none).
_ours: Optional[str] = None
#: The user's own directory, once it was logged.
_logged: Optional[str] = None


def default_cache_directory() -> str:
    """`$XDG_CACHE_HOME/keras_memwatch/jax`, else
    `~/.cache/keras_memwatch/jax`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return os.path.join(base, "keras_memwatch", "jax")


def use_compilation_cache(value: Any, name: str = "compilation_cache",
                          backend: Optional[str] = None) -> Optional[str]:
    """Points JAX's persistent compilation cache at a directory.

    Args:
        value: a directory (created where missing), `True` for
            `default_cache_directory()`, or `None`/`False` to set nothing.
        name: the argument's name in error messages. Defaults to
            `"compilation_cache"`.
        backend: the Keras backend. Defaults to `None`: Keras's active one
            (read only where `value` asks for a cache).

    Returns:
        The directory JAX's cache uses after the call (the user's own where
        they set one), or `None` where no cache is used or the backend is
        not JAX.

    Raises:
        TypeError: for a value that is not a path, a bool or `None`.
        ValueError: for an empty path, a path that is a file, or a
            directory that cannot be created.

    Example:

    ```python
    from keras_memwatch.configure.compilation_cache import use_compilation_cache

    use_compilation_cache(True)  # ~/.cache/keras_memwatch/jax
    ```
    """
    global _ours
    value = options.cache_directory(name, value)
    if value is None or value is False:
        return _current() if _backend(backend) == "jax" else None
    directory = default_cache_directory() if value is True else value
    if _backend(backend) != "jax":
        return None
    import jax

    current = jax.config.jax_compilation_cache_dir
    if current is not None and current != _ours:
        _log_theirs(current)
        return current
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise options.expected(
            name, f"a directory that can be created ({e.strerror})", value) from None
    if not os.access(directory, os.W_OK):
        raise options.expected(name, f"a writable directory ({directory} is not)",
                               value)
    if current is not None and current != directory:
        # JAX opens its cache once: a new directory needs a new cache.
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", directory)
    _ours = directory
    if jax.config.jax_persistent_cache_min_compile_time_secs == \
            _JAX_DEFAULT_MIN_COMPILE_SECONDS:
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          MIN_COMPILE_SECONDS)
    logger.info("JAX's persistent compilation cache: %s", directory)
    return directory


def _backend(backend: Optional[str]) -> str:
    if backend is not None:
        return backend
    import keras

    return keras.backend.backend()


def _current() -> Optional[str]:
    """The directory JAX's cache uses, where it is on."""
    import jax

    if not jax.config.jax_enable_compilation_cache:
        return None
    return jax.config.jax_compilation_cache_dir


def _log_theirs(directory: str) -> None:
    global _logged
    if _logged == directory:
        return
    _logged = directory
    where = (f"${_ENV}" if os.environ.get(_ENV) == directory
             else "jax_compilation_cache_dir")
    logger.info("JAX's persistent compilation cache: %s, set by %s; "
                "`compilation_cache=` leaves it as it is", directory, where)
