"""Stop requests for a training run: SIGTERM and SIGINT (Ctrl-C; also what run_jobs sends) ask the loop to stop
at the next step boundary -- the step in progress completes, then the run ends with a final checkpoint (exact
resume). A second SIGINT aborts at once (KeyboardInterrupt, no final checkpoint)."""

from __future__ import annotations

import os
import signal
from typing import Any, Optional


class StopSignals:
    """``with StopSignals(verbose) as stop:`` installs the handlers (main thread only; elsewhere signals keep
    their default behaviour) and restores the previous ones at exit; ``stop.requested`` names the first signal."""

    def __init__(self, verbose: bool = True):
        self.verbose = verbose
        self.requested: Optional[str] = None
        self._old: dict = {}

    def __enter__(self) -> "StopSignals":
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, TypeError):
                pass
        self._old = {}

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and self.requested is not None:
            raise KeyboardInterrupt
        if self.requested is None:
            self.requested = name
            if self.verbose:  # os.write: safe inside a signal handler (print may be mid-write)
                os.write(
                    2,
                    f"\n[train] {name}: stopping after the current step with a checkpoint "
                    f"(Ctrl-C again aborts without one)\n".encode(),
                )
