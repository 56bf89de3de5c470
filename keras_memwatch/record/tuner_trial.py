"""The KerasTuner trial a `fit` runs in, to name its log after it.

KerasTuner hands a callback no trial: for each trial it deep-copies the
callbacks given to `search` and calls `fit` from `Tuner.run_trial(trial,
...)` (its own or a subclass's). The `Trial` is found among the local
variables of the functions that called `fit`. Nothing is imported: where
KerasTuner is not loaded there is no trial.
"""

from __future__ import annotations

import logging
import sys
from types import FrameType
from typing import Optional

logger = logging.getLogger("keras_memwatch")

#: Calling functions looked through, from the callback up.
MAX_FRAMES = 64


def tuner_trial_id() -> Optional[str]:
    """The id of the KerasTuner trial whose `fit` is running, or `None`
    (outside KerasTuner, or where no caller holds a `Trial`). Never
    raises."""
    try:
        trial_class = sys.modules["keras_tuner.engine.trial"].Trial
    except (KeyError, AttributeError):
        return None
    try:
        frame: Optional[FrameType] = sys._getframe(1)
        for _ in range(MAX_FRAMES):
            if frame is None:
                return None
            for value in frame.f_locals.values():
                if isinstance(value, trial_class):
                    trial_id = getattr(value, "trial_id", None)
                    return None if trial_id is None else str(trial_id)
            frame = frame.f_back
    except Exception as e:  # never into training
        logger.debug("could not look for a KerasTuner trial: %r", e)
    return None
