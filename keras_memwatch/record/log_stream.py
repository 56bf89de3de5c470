"""Streams each block of a call's rows to its CSV log, one write a block."""

from __future__ import annotations

import logging
from typing import Optional

from keras_memwatch.record.block import Block
from keras_memwatch.record.csvlog import CsvLog
from keras_memwatch.record.sampler import Sampler

logger = logging.getLogger("keras_memwatch")


class LogStream:
    """A pipeline consumer that appends each block to a `CsvLog`.

    A write that fails (a full disk, a folder removed) is logged once and
    ends the streaming; the record in memory goes on.

    Args:
        log: the call's open log.
        sampler: the call's started sampler (its devices and table layout).
    """

    def __init__(self, log: CsvLog, sampler: Sampler) -> None:
        self.log: Optional[CsvLog] = log
        self.path = log.path
        self._sampler = sampler

    def __call__(self, block: Block) -> None:
        log = self.log
        if log is None:
            return
        text = log.format(block, self._sampler.devices, self._sampler.layout)
        try:
            log.write_text(text)
        except OSError as e:
            logger.warning("cannot write %s (%s); streaming stops, the record "
                           "in memory goes on", log.path, e)
            self.close()

    def close(self) -> None:
        """Closes the file; safe to call more than once."""
        log, self.log = self.log, None
        if log is not None:
            log.close()
