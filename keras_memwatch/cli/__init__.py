"""The command line: `python -m keras_memwatch demo`, `... report LOG` and
`... fit-check --model MODULE:FUNCTION`.

Also installed as the `keras-memwatch` console script. Exit status: 0 done,
2 a usage error (a bad argument or path, a missing backend framework), 1
the user's model function failed (`fit-check`). Bad arguments are refused
before Keras is imported.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch import options

BACKENDS = ("tensorflow", "jax", "torch")
#: What the demo writes into `--out`.
DEMO_FILES = ("memwatch.csv", "memwatch.png", "memwatch.html")


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
    from keras_memwatch import __version__

    parser = argparse.ArgumentParser(
        prog="keras-memwatch",
        description="See where the memory of a Keras training run goes.")
    parser.add_argument("--version", action="version",
                        version=f"keras-memwatch {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="train a deep convnet with Adam and an oversized batch now and "
             "then; print the alerts and the summary; write memwatch.csv, "
             "memwatch.png and memwatch.html",
        description="Trains a scaled-down deep convnet (CPU, about a minute) "
                    "with Adam on a data pipeline that yields an oversized "
                    "batch every 15th batch, watched by MemWatch.")
    demo.add_argument("--backend", choices=BACKENDS,
                      help="Keras backend (default: $KERAS_BACKEND, else jax)")
    demo.add_argument("--epochs", type=checked("epochs", options.positive_int),
                      default=2,
                      help="epochs to train (default: 2)")
    demo.add_argument("--steps", type=checked("steps", options.positive_int),
                      default=45,
                      help="batches per epoch (default: 45); batches 14, 29, "
                           "44, ... are oversized")
    demo.add_argument("--out", default="memwatch_demo", metavar="DIR",
                      help="output folder, created if needed (default: "
                           "./memwatch_demo); the demo refuses to run when "
                           f"{' or '.join(DEMO_FILES)} is already there")
    demo.add_argument("--force", action="store_true",
                      help=f"replace {' and '.join(DEMO_FILES)} of an earlier "
                           "run in --out (nothing else there is touched)")
    demo.add_argument("--seed-model", action="store_true",
                      help="build the full-size network of the classic "
                           "question (206.6 M parameters), for a GPU")
    report = commands.add_parser(
        "report",
        help="summary (and plot) of MemWatch logs, without the model; one "
             "section per process and a comparison for a distributed run",
        description="Prints the summary of a log written by "
                    "MemWatch(log_path=...), MemWatch.to_csv or "
                    "MemWatch.to_parquet. Given the logs of several processes "
                    "(mem.rank0.csv mem.rank1.csv ..., or a glob such as "
                    "'mem.rank*.csv'), prints one section per process, then "
                    "compares them: peak per process and device, spikes, "
                    "imbalance, closest to its limit. With --plot, draws them "
                    "too; with --html, writes them into one page.")
    report.add_argument("logs", nargs="+", metavar="LOG",
                        help="a log (CSV or Parquet), several, or a glob in "
                             "quotes ('mem.rank*.csv')")
    report.add_argument("--plot", metavar="FILE",
                        help="also draw the logs into FILE, in the format its "
                             "extension names (.png, .svg, .pdf, ...); an "
                             "existing FILE is refused unless --force")
    report.add_argument("--html", metavar="FILE",
                        help="also write one self-contained page of the logs "
                             "into FILE (.html; needs plotly: pip install "
                             "'keras-memwatch[html]'): the timeline of every "
                             "device and process, the spikes, where the memory "
                             "went; an existing FILE is refused unless "
                             "--overwrite")
    report.add_argument("--force", action="store_true",
                        help="replace an existing --plot FILE")
    report.add_argument("--overwrite", action="store_true",
                        help="replace an existing --html (or --plot) FILE")

    from keras_memwatch.cli.fit_check import add_fit_check_arguments

    add_fit_check_arguments(commands.add_parser(
        "fit-check",
        help="predict the largest batch that fits, before launching a job",
        description="Trains your model for two steps at a few small batch sizes, "
                    "fits its memory per sample, and prints the breakdown and "
                    "the largest batch that fits the device."))
    return parser


def checked(name: str, check: Callable[[str, Any], Any],
            parse: Callable[[str], Any] = int) -> Callable[[str], Any]:
    """An argparse `type` for an option of the Python API: the text parsed,
    then checked as the API checks it, so that a bad value gets the same
    message (a usage error, exit status 2).

    Args:
        name: the option's name in the Python API, such as `"headroom"`.
        check: its check in `keras_memwatch.options`, called as
            `check(name, value)`.
        parse: turns the text into a value. Defaults to `int`. Text it
            cannot parse is checked as received, a string.
    """

    def parse_and_check(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            value = text
        try:
            return check(name, value)
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse_and_check


def _demo_out_problem(out: str, force: bool) -> Optional[str]:
    """Why the demo cannot write into the folder `out`, or `None`. Creates
    nothing: the demo creates the folder once the backend has loaded."""
    if os.path.exists(out) and not os.path.isdir(out):
        return (f"--out {out} is a file, not a folder: choose a folder (it is "
                "created if needed), e.g. --out memwatch_demo")
    existing = os.path.abspath(out)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return (f"--out {out}: cannot create the folder, {existing} is a file: "
                "choose another folder with --out DIR")
    if not os.access(existing, os.W_OK | os.X_OK):
        return (f"--out {out}: cannot write in {existing}: choose another folder "
                "with --out DIR")
    there = [name for name in DEMO_FILES if os.path.lexists(os.path.join(out, name))]
    if there and not force:
        return (f"--out {out} already holds {' and '.join(there)} (from an earlier "
                "run): pass --force to replace them, or choose another folder "
                "with --out DIR")
    return None


def _demo(args: argparse.Namespace) -> int:
    problem = _demo_out_problem(args.out, args.force)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    # The backend is chosen before anything imports Keras.
    if args.backend:
        source = f"--backend {args.backend}"
    elif os.environ.get("KERAS_BACKEND") in BACKENDS:
        args.backend = os.environ["KERAS_BACKEND"]
        source = f"KERAS_BACKEND={args.backend}"
    else:
        args.backend, source = "jax", "the demo's default"
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
    from keras_memwatch.configure.backend_choice import import_keras

    missing = import_keras(args.backend, source)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    _show_logs()
    from keras_memwatch.cli.demo import run_demo

    verbose = "auto" if sys.stdout.isatty() else 2
    run_demo(out=args.out, epochs=args.epochs, steps=args.steps,
             seed_model=args.seed_model, verbose=verbose, force=args.force)
    return 0


def _report(args: argparse.Namespace) -> int:
    """Bad input (a missing file, a file that is not a MemWatch log, a
    --plot path that cannot be written) is one line on stderr naming the
    argument and the fix, and exit status 2, checked before any output."""
    from keras_memwatch.record.log_reader import NotALogError, load_log
    from keras_memwatch.explain.report import report_text

    def refuse(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        return 2

    if args.plot:
        from keras_memwatch.explain.figure_files import plot_path_problem

        problem = plot_path_problem(args.plot, overwrite=args.force or args.overwrite)
        if problem:
            return refuse(problem)
    if args.html:
        from keras_memwatch.explain.html import html_path_problem
        from keras_memwatch.explain.html.library import plotly_objects

        problem = html_path_problem(args.html, args.overwrite, argument="--html",
                                    replace="--overwrite")
        if problem:
            return refuse(problem)
        try:
            plotly_objects()
        except ImportError as e:
            return refuse(f"--html: {e}")
    fix = ("give a log written by MemWatch(log_path=...), MemWatch.to_csv or "
           "MemWatch.to_parquet")
    try:
        frame = load_log(args.logs[0] if len(args.logs) == 1 else args.logs)
    except IsADirectoryError as e:
        return refuse(f"LOG {e.filename} is a folder: name the logs in it, e.g. "
                      f"'{os.path.join(e.filename, '*.csv')}'")
    except OSError as e:
        return refuse(f"cannot read LOG {e.filename or ''}: "
                      f"{e.strerror or e}; {fix}")
    except (NotALogError, ImportError) as e:
        return refuse(str(e))
    except ValueError as e:
        return refuse(f"LOG: {e}")

    def say(text: str) -> None:
        try:
            print(text, flush=True)
        except BrokenPipeError:  # `report ... | head`: the reader has gone
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    text = report_text(frame)
    say(text)
    if args.plot:
        import matplotlib.pyplot as plt

        from keras_memwatch.explain.figure_files import save_figure
        from keras_memwatch.explain.plot import plot_memory

        figure = plot_memory(frame)
        try:
            save_figure(figure, args.plot, overwrite=args.force or args.overwrite)
        except FileExistsError:
            return refuse(f"--plot {args.plot} exists: pass --force to replace "
                          "it, or choose another path")
        except (OSError, ValueError, RuntimeError) as e:
            return refuse(f"cannot write --plot {args.plot}: {e}")
        finally:
            plt.close(figure)
        say(f"\nWrote {args.plot}.")
    if args.html:
        from keras_memwatch.explain.html import write_html_report

        try:
            write_html_report(args.html, frame, summary=text, overwrite=args.overwrite)
        except FileExistsError:
            return refuse(f"--html {args.html} exists: pass --overwrite to replace "
                          "it, or choose another path")
        except (OSError, ValueError) as e:
            return refuse(f"cannot write --html {args.html}: {e}")
        say(f"\nWrote {args.html}.")
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
        from keras_memwatch.cli.fit_check import run_fit_check

        return run_fit_check(args)
    return _report(args)

