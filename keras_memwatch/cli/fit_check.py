"""`python -m keras_memwatch fit-check --model MODULE:FUNCTION`: what fits?

Loads the user's function (it returns a compiled model and a sample
batch), prints where the memory goes and `estimate_max_batch_size`'s
answer. Imports no framework until it runs.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch import options
from keras_memwatch.capacity import METHODS, CapacityEstimate, estimate_max_batch_size
from keras_memwatch.cli import checked
from keras_memwatch.configure.devices import device_label
from keras_memwatch.columns import HOST_DEVICE
from keras_memwatch.units import format_bytes

__all__ = ["add_fit_check_arguments", "fit_check_main", "run_fit_check"]


def _sizes(text: str) -> list[int]:
    """`--trial-sizes`: comma-separated integers."""
    return [int(s) for s in text.split(",") if s.strip()]


def _device(name: str, value: str) -> str:
    """`--device`: `GPU:<i>` (or `gpu:<i>`, `cuda:<i>`) or `host`."""
    return device_label(value, name)


def add_fit_check_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the `fit-check` options to a parser (the sub-command's own).

    Args:
        parser: the parser of the `fit-check` sub-command.

    Returns:
        The same parser.
    """
    parser.add_argument(
        "--model", required=True, metavar="MODULE:FUNCTION",
        help="a function returning (compiled model, (x, y)) or (compiled model, x): "
             "MODULE is imported from the current directory or sys.path (or a "
             "path to a .py file)")
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"),
                        help="Keras backend (default: Keras's own choice: "
                             "$KERAS_BACKEND, else keras.json, else tensorflow)")
    parser.add_argument("--headroom", type=checked("headroom", options.fraction, float),
                        default=0.1,
                        help="fraction of the limit to keep free (default: 0.1)")
    parser.add_argument("--device", type=checked("device", _device, str),
                        help="GPU:<i> or host (default: the first GPU, "
                             "else the host)")
    parser.add_argument("--trial-sizes", metavar="B1,B2,B3,...",
                        type=checked("trial_sizes", options.batch_sizes, _sizes),
                        help="batch sizes to measure (default: an adaptive ladder)")
    parser.add_argument("--method", default="auto", metavar="{%s}" % ",".join(METHODS),
                        type=checked("method", functools.partial(
                            options.choice, allowed=METHODS), str),
                        help="how a step's memory is measured (default: auto)")
    parser.add_argument("--max-seconds", metavar="S",
                        type=checked("max_seconds", options.optional_seconds, float),
                        help="stop the estimate (and --ways's table) after S "
                             "seconds each and answer from what was measured "
                             "(default: no limit)")
    parser.add_argument("--compilation-cache", metavar="DIR", nargs="?", const=True,
                        type=checked("compilation_cache", options.cache_directory, str),
                        help="JAX: keep compilations in JAX's persistent cache in "
                             "DIR (alone: ~/.cache/keras_memwatch/jax), where a "
                             "later estimate and fit find them; a cache you set "
                             "(JAX_COMPILATION_CACHE_DIR) wins; PyTorch, "
                             "TensorFlow: ignored (default: none)")
    parser.add_argument("--fresh-process", action="store_true",
                        help="PyTorch on a GPU under a cap: check the estimate's "
                             "answers (and --ways's rows) with jobs in new "
                             "processes (slower; elsewhere a warning says the "
                             "checks train in this process)")
    parser.add_argument("--json", action="store_true",
                        help="print the estimate as JSON instead of text")
    parser.add_argument("--ways", action="store_true",
                        help="also measure what each change (mixed precision, a "
                             "leaner optimizer, recomputation, gradient "
                             "accumulation, a shorter sequence) would save at "
                             "--batch-size (keras_memwatch.ways_to_fit)")
    parser.add_argument("--batch-size", type=checked("batch_size", options.positive_int,
                                                     int),
                        help="with --ways: the batch you want (default: the "
                             "samples the function returns)")
    parser.add_argument("--levers", metavar="L1,L2,...", default="all",
                        type=checked("levers", _levers, _names),
                        help="with --ways: the levers to measure (default: all; "
                             "names as keras_memwatch.ways_to_fit takes them)")
    return parser


def _names(text: str) -> Any:
    """`--levers`: `all` or comma-separated names."""
    return "all" if text == "all" else [n.strip() for n in text.split(",") if n.strip()]


def _levers(name: str, value: Any) -> Any:
    from keras_memwatch.ways.levers import LEVER_NAMES

    return options.names_or_all(name, value, LEVER_NAMES)


def _load_function(spec: str) -> Callable[[], Any]:
    """The function `spec` names: `module:function` or `path/to/file.py:function`.

    Raises:
        ValueError: for a spec of another form, or a module without the
            function.
        ImportError: when the module cannot be imported.
    """
    module_name, sep, function_name = spec.rpartition(":")
    if not sep or not module_name or not function_name:
        raise ValueError(f"expected --model MODULE:FUNCTION, got {spec!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        function = getattr(_load_file(module_name), function_name, None)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            function = pkgutil.resolve_name(spec)
        except AttributeError:
            if module_name not in sys.modules:  # raised while importing it
                raise
            function = None
    if not callable(function):
        raise ValueError(f"{module_name} has no function {function_name!r}")
    return function


def _load_file(path: str) -> Any:
    """Imports a `.py` file as a module named after it."""
    path = os.path.abspath(path)
    name = os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return module


def _unpack(returned: Any) -> tuple[Any, Any, Any]:
    """(model, x, y) from what the user's function returned."""
    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        raise ValueError(
            "expected the function to return (compiled model, (x, y)) or "
            f"(compiled model, x); got {type(returned).__name__}")
    model, batch = returned
    if isinstance(batch, dict) and "x" in batch:
        return model, batch["x"], batch.get("y")
    if isinstance(batch, (tuple, list)) and len(batch) in (1, 2):
        return model, batch[0], batch[1] if len(batch) == 2 else None
    return model, batch, None


def _breakdown_text(model: Any, estimate: CapacityEstimate) -> str:
    from keras_memwatch.explain.breakdown import format_breakdown, memory_breakdown
    from keras_memwatch.record.recorder import empty_frame

    b = memory_breakdown(model, empty_frame())
    b["notes"] = [n for n in b.get("notes", ()) if "no training samples" not in n]
    lines = format_breakdown(b).splitlines()
    device = estimate.device
    if estimate.limit_bytes is not None:
        lines.append(f"  in use before a step:  "
                     f"{format_bytes(estimate.in_use_bytes)} on "
                     f"{device} (weights, optimizer state, framework runtime"
                     + (", the Python process" if device == HOST_DEVICE else "") + ")")
    line = estimate.evidence.line
    if line is not None:
        lines.append(
            f"  step working memory:   {format_bytes(line.static_bytes)} + "
            f"{format_bytes(line.per_sample_bytes)} per sample (the line through "
            f"batch sizes {', '.join(map(str, line.batch_sizes))})")
    return "\n".join(lines)


def run_fit_check(args: argparse.Namespace) -> int:
    """Runs `fit-check` with parsed arguments (see `add_fit_check_arguments`).

    Returns:
        `0` with a prediction, `3` when none could be made, `2` for a bad
        `--model`, `--device` or `--method`, or a backend whose framework
        is not installed, `1` when the model function failed.
    """
    from keras_memwatch.configure.backend_choice import chosen_backend, import_keras

    backend, source = chosen_backend(args.backend)
    if args.backend:
        if "keras" in sys.modules:
            import keras

            if keras.backend.backend() != args.backend:
                print(f"error: Keras is already imported with the "
                      f"{keras.backend.backend()} backend", file=sys.stderr)
                return 2
        os.environ["KERAS_BACKEND"] = args.backend
    # Keras first: a missing framework is the backend's problem, not the model's.
    missing = import_keras(backend, source)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    import keras

    if not args.json:
        print(f"Keras backend: {keras.backend.backend()} ({source})", flush=True)
    try:
        function = _load_function(args.model)
    except (ValueError, ImportError, OSError) as e:
        print(f"error: cannot load --model {args.model}: {e}", file=sys.stderr)
        return 2
    try:
        returned = function()
    except Exception:
        import traceback

        traceback.print_exc()
        print(f"error: {args.model} raised", file=sys.stderr)
        return 1
    try:
        model, x, y = _unpack(returned)
    except ValueError as e:
        print(f"error: {args.model}: {e}", file=sys.stderr)
        return 2
    problem = _device_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    estimate = estimate_max_batch_size(
        model, x, y, trial_sizes=args.trial_sizes, device=args.device,
        headroom=args.headroom, method=args.method,
        max_seconds=getattr(args, "max_seconds", None),
        compilation_cache=getattr(args, "compilation_cache", None),
        fresh_process=getattr(args, "fresh_process", False),
        verbose=0 if args.json else "auto")
    if args.json:
        print(json.dumps(estimate.to_dict(), indent=2))
    else:
        print(f"keras_memwatch fit-check: {args.model} (backend "
              f"{keras.backend.backend()}, {estimate.device})\n")
        print(_breakdown_text(model, estimate))
        print()
        print(estimate)
        print()
        if estimate.predicted_batch_size is None:
            print("Predicted largest batch: none (see above)")
        else:
            print(f"Predicted largest batch: {estimate.predicted_batch_size}")
    if args.ways:
        _print_ways(model, x, y, args)
    return 0 if estimate.predicted_batch_size is not None else 3


def _print_ways(model: Any, x: Any, y: Any, args: argparse.Namespace) -> None:
    """`--ways`: the ways-to-fit table, as text or JSON records."""
    from keras_memwatch.explain.ways_text import format_ways
    from keras_memwatch.ways import ways_to_fit

    table = ways_to_fit(model, x, y, batch_size=args.batch_size,
                        headroom=args.headroom, levers=args.levers,
                        device=args.device, verbose=0 if args.json else "auto",
                        max_seconds=getattr(args, "max_seconds", None),
                        compilation_cache=getattr(args, "compilation_cache", None),
                        fresh_process=getattr(args, "fresh_process", False))
    if args.json:
        print(table.to_json(orient="records", indent=2))
    else:
        print()
        print(format_ways(table))


def _device_problem(args: argparse.Namespace) -> Optional[str]:
    """Why `--device` / `--method` cannot be measured here, or `None`.

    Checked after the user's function ran, so a `configure_memory` call in
    it still comes before the framework's runtime starts.
    """
    import keras

    from keras_memwatch.measure.device import Device

    backend = keras.backend.backend()
    if args.method == "xla" and backend != "jax":
        return f"--method xla: only with the JAX backend (this is {backend})"
    try:
        device = Device(backend, args.device)
    except ValueError as e:
        return f"--device {args.device}: {e}"
    device.close()
    if args.method == "steps" and backend == "jax" and device.on_gpu:
        return ("--method steps: JAX on a GPU has no per-step peak; use --method "
                "xla (the default there)")
    return None


def fit_check_main(argv: Optional[Sequence[str]] = None) -> int:
    """`keras-memwatch fit-check`: what fits, before launching a job.

    Args:
        argv: the arguments after `fit-check`. Defaults to `None`
            (`sys.argv[1:]`).

    Returns:
        The exit code (see `run_fit_check`).

    Example:

    ```
    python -m keras_memwatch fit-check --model my_model:build
    ```
    """
    parser = argparse.ArgumentParser(
        prog="keras-memwatch fit-check",
        description="Measures a few small batches of your model, checks near the "
                    "limit on a GPU, and answers the largest batch that fits.")
    add_fit_check_arguments(parser)
    return run_fit_check(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(fit_check_main())
