"""Which Keras backend a command will use, where that choice came from, and
a clear word when the backend's framework is not installed.

Keras picks its backend, once per process, from `KERAS_BACKEND`, else from
the `"backend"` of `keras.json` (in `$KERAS_HOME`, else `~/.keras`), else
TensorFlow. Keras writes that file with `"tensorflow"` the first time it is
imported, so a user who installed only JAX or PyTorch and set nothing gets
`No module named 'tensorflow'` from `import keras`. The command line says
that in words instead. Nothing here imports Keras until `import_keras`.
"""

from __future__ import annotations

import json
import os
from typing import Optional

__all__ = ["FRAMEWORKS", "chosen_backend", "import_keras"]

#: The module each backend imports, and the command that installs it (CPU).
FRAMEWORKS = {
    "tensorflow": ("tensorflow", "pip install tensorflow"),
    "jax": ("jax", "pip install jax"),
    "torch": ("torch", "pip install torch"),
}


def _keras_json() -> str:
    """Where Keras reads its configuration (as `keras.src.backend.config`)."""
    if "KERAS_HOME" in os.environ:
        home = os.environ["KERAS_HOME"]
    else:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    return os.path.expanduser(os.path.join(home, "keras.json"))


def chosen_backend(option: Optional[str] = None) -> tuple[str, str]:
    """The backend Keras will use, and where that choice came from, in words.

    Args:
        option: a `--backend` given on the command line, which wins.
            Defaults to `None`.

    Returns:
        `(backend, source)`, e.g. `("jax", "KERAS_BACKEND=jax")`.
    """
    if option:
        return option, f"--backend {option}"
    if os.environ.get("KERAS_BACKEND"):
        name = os.environ["KERAS_BACKEND"]
        return name, f"KERAS_BACKEND={name}"
    path = _keras_json()
    try:
        with open(path, encoding="utf-8") as f:
            name = json.load(f).get("backend")
        if isinstance(name, str) and name:
            return name, f"from {path}, as KERAS_BACKEND is not set"
    except (OSError, ValueError, AttributeError):
        pass
    return "tensorflow", "Keras's default, as KERAS_BACKEND is not set"


def import_keras(backend: str, source: str) -> Optional[str]:
    """Imports Keras; on failure returns the error message for the user.

    Args:
        backend: the backend Keras is expected to load (see `chosen_backend`).
        source: where that choice came from, in words.

    Returns:
        `None` when Keras imported, else one message that names the backend,
        why it was chosen, and the fix (`KERAS_BACKEND`, `pip install`).
    """
    try:
        import keras  # noqa: F401
    except ImportError as e:
        missing = (e.name or "").split(".")[0]
        module, install = FRAMEWORKS.get(backend, (backend, f"pip install {backend}"))
        if missing == module or (backend == "jax" and missing == "jaxlib"):
            others = " or ".join(f"KERAS_BACKEND={b}" for b in FRAMEWORKS
                                 if b != backend)
            return (f"Keras is set to the {backend} backend ({source}), but "
                    f"{module} is not installed: {install}, or choose a "
                    f"backend you have installed (export {others}, or pass "
                    f"--backend).")
        return f"cannot import Keras with the {backend} backend ({source}): {e}"
    return None
