"""A fault inside MemWatch never ends training: it is logged once, where it
happened, and training goes on."""

from __future__ import annotations

import logging

logger = logging.getLogger("keras_memwatch")


class Faults:
    """The places that failed during a call, each warned about once."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def report(self, where: str, error: Exception) -> None:
        """Logs `error` at WARNING, the first time `where` fails."""
        if where not in self.seen:
            self.seen.add(where)
            logger.warning("MemWatch %s failed (%r); training goes on", where,
                           error, exc_info=True)

    def clear(self) -> None:
        """Forgets them: a new call warns again."""
        self.seen = set()
