"""The command line: `python -m keras_memwatch demo` and `... report LOG`.

Also installed as the `keras-memwatch` console script.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Optional

BACKENDS = ("tensorflow", "jax", "torch")


class _Formatter(logging.Formatter):
    """Alerts read "WARNING: ...", information lines as they are."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            return f"{record.levelname}: {message}"
        return message


def _show_logs() -> None:
    """Sends keras_memwatch's INFO and WARNING lines to stdout."""
    logger = logging.getLogger("keras_memwatch")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_Formatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keras-memwatch",
        description="See where the memory of a Keras training run goes.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="train a deep convnet with Adam and an oversized batch now and "
             "then; print the alerts and the summary; write memwatch.csv and "
             "memwatch.png",
        description="Trains a scaled-down deep convnet (CPU, about a minute) "
                    "with Adam on a data pipeline that yields an oversized "
                    "batch every 15th batch, watched by MemWatch.")
    demo.add_argument("--backend", choices=BACKENDS,
                      default=os.environ.get("KERAS_BACKEND") if os.environ.get(
                          "KERAS_BACKEND") in BACKENDS else "jax",
                      help="Keras backend (default: $KERAS_BACKEND, else jax)")
    demo.add_argument("--epochs", type=_positive, default=2,
                      help="epochs to train (default: 2)")
    demo.add_argument("--steps", type=_positive, default=45,
                      help="batches per epoch (default: 45)")
    demo.add_argument("--out", default="memwatch_demo",
                      help="output folder (default: ./memwatch_demo)")
    demo.add_argument("--seed-model", action="store_true",
                      help="build the full-size network of the classic "
                           "question (206.6 M parameters), for a GPU")
    report = commands.add_parser(
        "report",
        help="summary (and plot) of a streamed MemWatch log, without the model",
        description="Prints the summary of a log written by "
                    "MemWatch(log_path=...) or MemWatch.to_csv; with --plot, "
                    "draws it too.")
    report.add_argument("log", help="the CSV log")
    report.add_argument("--plot", metavar="PNG",
                        help="write the plot there (.png, .svg, .pdf)")

    from keras_memwatch.fit_check import add_fit_check_arguments

    add_fit_check_arguments(commands.add_parser(
        "fit-check",
        help="predict the largest batch that fits, before launching a job",
        description="Trains your model for two steps at a few small batch sizes, "
                    "fits its memory per sample, and prints the breakdown and "
                    "the largest batch that fits the device."))
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _demo(args: argparse.Namespace) -> int:
    # The backend is chosen before anything imports Keras.
    os.environ["KERAS_BACKEND"] = args.backend
    if args.backend == "tensorflow":
        # oneDNN's CPU allocator keeps freed memory, so only the first
        # oversized batch would show in the host's peak RSS.
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "keras" in sys.modules:
        import keras

        if keras.backend.backend() != args.backend:
            print(f"error: Keras is already imported with the "
                  f"{keras.backend.backend()} backend", file=sys.stderr)
            return 2
    _show_logs()
    from keras_memwatch.demo import run_demo

    verbose = "auto" if sys.stdout.isatty() else 2
    run_demo(out=args.out, epochs=args.epochs, steps=args.steps,
             seed_model=args.seed_model, verbose=verbose)
    return 0


def _report(args: argparse.Namespace) -> int:
    from keras_memwatch.csvlog import load_log
    from keras_memwatch.derived import spikes_from_frame
    from keras_memwatch.report import summarize

    try:
        frame = load_log(args.log)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: cannot read {args.log} as a MemWatch log: {e}", file=sys.stderr)
        return 1
    spikes = spikes_from_frame(frame)
    print(summarize(frame, spikes))
    if args.plot:
        from keras_memwatch.plot import plot_memory

        figure = plot_memory(frame, spikes, path=args.plot)
        import matplotlib.pyplot as plt

        plt.close(figure)
        print(f"\nWrote {args.plot}.")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command line; returns the exit code.

    Args:
        argv: the arguments, without the program name. Defaults to `None`
            (`sys.argv[1:]`).
    """
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    if args.command == "fit-check":
        from keras_memwatch.fit_check import run_fit_check

        return run_fit_check(args)
    return _report(args)


if __name__ == "__main__":
    sys.exit(main())
