"""A finished (or running) run folder read back from its own files: ``metrics.jsonl``, ``summary.json``, its config.

Used by ``python -m training.plot_run`` and ``python -m training.compare_runs``. A run folder is the training
loop's ``checkpoint_path`` (``checkpoints/<project>/<run>``): ``metrics.jsonl`` (one JSON object per log call,
``{"step": N, "<metric>": value, ...}``), ``summary.json`` (:mod:`training.summary`), ``step_*.pt`` checkpoints,
and the resolved config as ``config.yaml`` in newer runs.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

from core.errors import PlatformError
from core.io import read_yaml
from training.checkpoint import CheckpointError, find_latest_checkpoint, read_checkpoint
from training.report import METRICS_FILE
from training.summary import SUMMARY_FILE

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"

Series = dict[str, tuple[list[int], list[float]]]


class RunFilesError(PlatformError, ValueError):
    """A run folder without the file asked for, or with nothing in it (the message names the file)."""


def run_folder(path: str) -> str:
    """The run folder of ``path``: itself, or the folder of a ``metrics.jsonl`` path."""
    return os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else path


def read_metrics(run_dir: str) -> Series:
    """``{metric: (steps, values)}`` from ``<run_dir>/metrics.jsonl`` (or that file's own path). Lines that are
    not a UTF-8 JSON object with a finite ``step`` (e.g. a half-written last line of a running run, a damaged
    byte, ``"step": Infinity``) are skipped with a warning."""
    path = run_dir if os.path.isfile(run_dir) else os.path.join(run_dir, METRICS_FILE)
    if not os.path.isfile(path):
        raise RunFilesError(f"{path}: not found (is {run_dir} a run directory of this platform's training loop?)")
    series: Series = {}
    skipped = 0
    with open(path, "rb") as f:  # line by line: one damaged line is skipped, not the file
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line.decode("utf-8"))
                step = int(rec["step"])  # OverflowError: Infinity; ValueError: NaN, not UTF-8, not JSON
            except (ValueError, TypeError, KeyError, OverflowError):
                skipped += 1
                continue
            for k, v in rec.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    steps, values = series.setdefault(k, ([], []))
                    steps.append(step)
                    values.append(float(v))
    if skipped:
        log.warning("%s: skipped %d line(s) that are not a JSON object with a finite step", path, skipped)
    if not series:
        raise RunFilesError(
            f"{path}: none of its {skipped} line(s) is a JSON object with a finite step (is it a metrics.jsonl?)"
            if skipped
            else f"{path}: no metrics logged yet"
        )
    return series


def read_summary_if_any(run_dir: str) -> dict[str, Any]:
    """``<run_dir>/summary.json`` as a dict; ``{}`` when it is missing or unreadable (a run killed before its
    first write, a folder copied without it)."""
    path = os.path.join(run_folder(run_dir), SUMMARY_FILE)
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_name(run_dir: str) -> str:
    """The run's name: summary.json's ``run_name``, else the folder's name."""
    name = read_summary_if_any(run_dir).get("run_name")
    return str(name) if name else os.path.basename(os.path.normpath(os.path.abspath(run_folder(run_dir))))


def run_labels(run_dirs: list[str]) -> list[str]:
    """One label per run folder: its :func:`run_name`, with the folder path added where two runs share a name."""
    names = [run_name(d) for d in run_dirs]
    return [f"{n} ({os.path.normpath(d)})" if names.count(n) > 1 else n for n, d in zip(names, run_dirs)]


def _read_yaml(path: str) -> dict[str, Any]:
    data = read_yaml(path, RunFilesError)
    if not isinstance(data, dict):
        raise RunFilesError(f"{path}: not a config (a YAML mapping), got {type(data).__name__}")
    return data


def read_run_config(run_dir: str) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """The run's resolved config and where it was read: ``<run_dir>/config.yaml``, else the file summary.json's
    ``config_path`` names (Hydra's ``.hydra/config.yaml``) when it still exists, else the ``config`` stored in the
    newest checkpoint. ``(None, None)`` when the run has none of them."""
    folder = run_folder(run_dir)
    own = os.path.join(folder, CONFIG_FILE)
    if os.path.isfile(own):
        return _read_yaml(own), own
    hydra = read_summary_if_any(folder).get("config_path")
    if isinstance(hydra, str) and os.path.isfile(hydra):
        return _read_yaml(hydra), hydra
    ckpt = find_latest_checkpoint(folder)
    if ckpt is None:
        return None, None
    try:
        state = read_checkpoint(ckpt, "cpu", mmap=True)
    except CheckpointError as e:
        raise RunFilesError(f"{folder}: no {CONFIG_FILE}, and its checkpoint cannot be read ({e})") from None
    cfg = state.get("config")
    return (cfg, ckpt) if isinstance(cfg, dict) else (None, None)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys (``{"arch": {"hidden_size": 512}}`` -> ``{"arch.hidden_size": 512}``); lists
    and scalars are leaves; an empty mapping is a leaf ``{}``."""
    if not isinstance(tree, dict) or (not tree and prefix):
        return {prefix[:-1]: tree} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(flatten(v, f"{prefix}{k}."))
    return out
