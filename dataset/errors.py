"""The dataset layer's input error (core.errors: the one-line-error contract)."""

from __future__ import annotations

from core.errors import PlatformError


class DatasetError(PlatformError, ValueError):
    """Bad input to a dataset builder or loader. The message names file, puzzle and field."""
