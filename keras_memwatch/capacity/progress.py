"""What an estimate shows a person while it runs.

`Progress` takes two streams:

- a line per size measured (from the strategies), handed to the user's
  `progress=` callable whatever `verbose` says, else logged at INFO;
- a line per round of the search (the sizes asked, the best answer so far,
  the seconds spent), shown as `fit` shows its epochs: `verbose=1` draws a
  `keras.utils.Progbar` of the rounds, `2` prints one line per round,
  `0` shows nothing, and `"auto"` draws the bar where the output is a
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
    """The lines and the display of one estimate.

    Args:
        verbose: `"auto"`, `0`, `1` or `2` (checked).
        callback: receives every line per size, or `None` (the
            `keras_memwatch` logger at INFO).
        began: `time.perf_counter()` when the estimate began. Defaults to
            `None`: now.
    """

    def __init__(self, verbose: Any, callback: Optional[Callable[[str], None]],
                 began: Optional[float] = None):
        self.mode = display_mode(verbose)
        self.callback = callback
        self.began = time.perf_counter() if began is None else began
        self.rounds = 0
        self.sizes = 0
        self._bar: Any = None

    def line(self, text: str) -> None:
        """A line about one size measured."""
        if self.callback is not None:
            self.callback(text)
        else:
            logger.info("%s", text)

    def round(self, kind: str, sizes: Sequence[int], best: Optional[int]) -> None:
        """One round done: `kind` (`"ladder"`, `"aim"`, `"check"`), the
        sizes it asked about, the best answer the record gives now."""
        self.rounds += 1
        self.sizes += len(sizes)
        seconds = time.perf_counter() - self.began
        if self.mode == 1:
            self._draw(best, seconds)
        elif self.mode == 2:
            sys.stdout.write(
                f"estimate_max_batch_size: round {self.rounds} ({kind}): batch "
                + ", ".join(map(str, sizes))
                + f"; best answer so far {'-' if best is None else best}"
                + f" ({seconds:.1f} s)\n")
            sys.stdout.flush()

    def _draw(self, best: Optional[int], seconds: float) -> None:
        import keras

        if self._bar is None:
            self._bar = keras.utils.Progbar(None, unit_name="round",
                                            stateful_metrics=["sizes", "best", "s"])
        values = [("sizes", self.sizes), ("s", round(seconds, 1))]
        if best is not None:
            values.append(("best", best))
        self._bar.update(self.rounds, values=values)

    def done(self, answer: Optional[int]) -> None:
        """The estimate finished: the bar's last line."""
        if self.mode == 1 and self._bar is not None:
            values = [("sizes", self.sizes),
                      ("s", round(time.perf_counter() - self.began, 1))]
            if answer is not None:
                values.append(("best", answer))
            self._bar.update(self.rounds, values=values, finalize=True)
