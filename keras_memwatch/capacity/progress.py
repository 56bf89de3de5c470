"""What a long measurement shows a person while it runs.

`Progress` takes two streams:

- a line per size measured (from the strategies), handed to the user's
  `progress=` callable whatever `verbose` says, else logged at INFO;
- a step per unit of work done (`step`: an estimate's round, a row of
  `ways_to_fit`), shown as `fit` shows its epochs: `verbose=1` draws a
  `keras.utils.Progbar` of the steps, `2` prints one line per step, `0`
  shows nothing, and `"auto"` draws the bar where the output is a
  terminal or a notebook, else prints lines.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

logger = logging.getLogger("keras_memwatch")

__all__ = ["Progress", "display_mode"]


def display_mode(verbose: Any) -> int:
    """`0` (nothing), `1` (a bar) or `2` (a line per round) for a checked
    `verbose`."""
    if verbose != "auto":
        return int(verbose)
    interactive = sys.stdout.isatty() or "ipykernel" in sys.modules
    return 1 if interactive else 2


class Progress:
    """The lines and the display of one measurement.

    Args:
        verbose: `"auto"`, `0`, `1` or `2` (checked).
        callback: receives every line per size, or `None` (the
            `keras_memwatch` logger at INFO).
        began: `time.perf_counter()` when the measurement began. Defaults
            to `None`: now.
        unit: what a step is called on the bar. Defaults to `"round"`.
    """

    def __init__(self, verbose: Any, callback: Optional[Callable[[str], None]],
                 began: Optional[float] = None, unit: str = "round"):
        self.mode = display_mode(verbose)
        self.callback = callback
        self.began = time.perf_counter() if began is None else began
        self.unit = unit
        self.rounds = 0
        self.sizes = 0
        self._bar: Any = None

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.began

    def line(self, text: str) -> None:
        """A line about one size measured."""
        if self.callback is not None:
            self.callback(text)
        else:
            logger.info("%s", text)

    def step(self, text: str, values: Sequence[tuple[str, Any]]) -> None:
        """One step done: `text` printed (`verbose=2`), or the bar moved on
        with `values` and the seconds so far (`1`)."""
        self.rounds += 1
        if self.mode == 1:
            import keras

            if self._bar is None:
                self._bar = keras.utils.Progbar(None, unit_name=self.unit)
            values = [*values, ("s", round(self.seconds, 1))]
            self._bar.stateful_metrics.update(name for name, _ in values)
            self._bar.update(self.rounds, values=values)
        elif self.mode == 2:
            sys.stdout.write(f"{text} ({self.seconds:.1f} s)\n")
            sys.stdout.flush()

    def round(self, kind: str, sizes: Sequence[int], best: Optional[int]) -> None:
        """An estimate's round done: `kind` (`"ladder"`, `"aim"`,
        `"check"`), the sizes it asked about, the best answer the record
        gives now."""
        self.sizes += len(sizes)
        self.step(f"estimate_max_batch_size: round {self.rounds + 1} ({kind}): batch "
                  + ", ".join(map(str, sizes))
                  + f"; best answer so far {'-' if best is None else best}",
                  [("sizes", self.sizes)] + ([] if best is None else [("best", best)]))

    def done(self, answer: Optional[int] = None) -> None:
        """The measurement finished: the bar's last line."""
        if self.mode == 1 and self._bar is not None:
            values = [("s", round(self.seconds, 1))]
            if self.sizes:
                values.append(("sizes", self.sizes))
            if answer is not None:
                values.append(("best", answer))
            self._bar.stateful_metrics.update(name for name, _ in values)
            self._bar.update(self.rounds, values=values, finalize=True)
