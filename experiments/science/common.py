"""Names shared by the science command's stages (:mod:`experiments.science.run`) and its report
(:mod:`experiments.science.report`)."""
from __future__ import annotations

from core.errors import PlatformError

ENCODERS = ("standard", "variational", "lpn", "hybrid", "recurrent")
CONTROL = "control"  # the zero-demo control: encoder=standard encoder.zero_demos=true
UNFIT_TRAIN_EXACT = 0.5  # below this train exact a run's held-out table is flagged "not fitted"


class ScienceError(PlatformError, ValueError):
    """Bad science-command input (the message names the option / file and the value)."""
