"""The run directory (``<checkpoint_dir>``): one live run writes there at a time.

``RunDir(path, info, resume=...).claim()`` -- rank 0 takes an OS lock on ``<dir>/.run.lock`` (a second
concurrent run on the directory is refused; the OS releases the lock when the process dies), refuses a built
dataset directory, and, unless ``resume=true``, a directory that already holds another run's checkpoints or
summary.json. Every rank
raises the same ConfigError. ``release()`` removes the lock file and drops the lock (a run leaves no
``.run.lock`` behind); ``discard_if_empty()`` removes a directory this run created and never wrote to.
"""

from __future__ import annotations

import datetime
import inspect
import json
import os
import secrets
from typing import Callable, Optional

import filelock

from dataset.metadata import looks_like_dataset
from training import checkpoint as ckpt
from training import distributed as D
from training.config import ConfigError, PretrainConfig, with_wandb_group
from training.summary import SUMMARY_FILE

RUN_LOCK_FILE = ".run.lock"  # in the checkpoint dir: held (OS lock) by the run writing there


class RunDir:
    def __init__(self, path: str, info: D.DistInfo, *, resume: bool, warn: Callable[[str], None] = print):
        self.path, self.info, self.resume, self.warn = os.path.abspath(path), info, resume, warn
        self._lock: Optional[filelock.BaseFileLock] = None
        self._created = False

    @property
    def lock_path(self) -> str:
        return os.path.join(self.path, RUN_LOCK_FILE)

    def claim(self) -> None:
        """Lock and check the directory (rank 0 decides, every rank raises the same error)."""
        err = self._lock_and_check() if self.info.is_main else None
        err = D.broadcast_object(err)
        if err:
            self.release()
            raise ConfigError(err)

    def _lock_and_check(self) -> Optional[str]:
        d = self.path
        if looks_like_dataset(d):
            return (
                f"{d}: is a built dataset directory (identifiers.json / <split>/dataset.json), not a run "
                f"directory; choose another checkpoint_path=… (nothing was written)"
            )
        try:
            self._created = not os.path.isdir(d)
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            return f"{d}: cannot create the run directory ({e.strerror or e})"
        # a file-existence lock would outlive a killed process: better no lock than a stale one
        kw = (
            {"fallback_to_soft": False} if "fallback_to_soft" in inspect.signature(filelock.FileLock).parameters else {}
        )
        lock = filelock.FileLock(self.lock_path, timeout=0, **kw)
        try:
            lock.acquire()
            self._lock = lock
        except filelock.Timeout:
            return (
                f"{d}: another run is using this run directory right now ({RUN_LOCK_FILE} is locked by a live "
                f"process); wait for it to end, or give this run a new +run_name=… / checkpoint_path=…"
            )
        except OSError as e:  # e.g. a file system without flock: run unlocked, loudly
            self.warn(
                f"[train] WARNING: cannot lock {self.lock_path} ({e.strerror or e}); a second run on the same "
                f"directory would not be refused"
            )
        if self.resume:
            return None
        found = [os.path.basename(p) for _, p in ckpt.list_checkpoints(d)]
        if os.path.isfile(os.path.join(d, SUMMARY_FILE)):
            found.append(SUMMARY_FILE)
        if not found:
            return None
        shown = ", ".join(found[-3:]) if len(found) <= 3 else f"{len(found)} files incl. {found[-1]}"
        return (
            f"{d}: already holds another run's files ({shown}); pass resume=true to continue that run, "
            f"or give this run a new +run_name=… / checkpoint_path=… (nothing was written)"
        )

    def release(self) -> None:
        """Release the lock and delete ``.run.lock`` (idempotent; only a lock this run holds)."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        try:  # unlinked while still held: a newcomer can only lock a fresh file once we are done
            os.unlink(self.lock_path)
        except OSError:
            pass
        try:
            lock.release(force=True)
        except Exception:  # noqa: BLE001 - releasing is best effort (the OS drops the lock at exit anyway)
            pass

    def discard_if_empty(self) -> None:
        """A run that failed while being set up leaves nothing behind: the directory it created (holding only its
        lock file) is removed."""
        if not (self._created and self.info.is_main):
            return
        try:
            if set(os.listdir(self.path)) <= {RUN_LOCK_FILE}:
                if os.path.exists(self.lock_path):
                    os.unlink(self.lock_path)
                os.rmdir(self.path)
        except OSError:
            pass


def run_dir(cfg: PretrainConfig, project: str, run: str) -> str:
    """The run directory: ``checkpoint_path``, else ``checkpoints/<project>/<run>`` (absolute)."""
    return os.path.abspath(cfg.checkpoint_path or os.path.join("checkpoints", project, run))


def run_identity(cfg: PretrainConfig) -> tuple[str, str, str]:
    """``(project_name, run_name, wandb_group)`` of a run: the configured ones; else, for ``resume=true``, the ones
    the resumed run already has (:func:`resumed_identity`), so that a resume keeps its name, its folder and its
    W&B group; else the defaults (``<dataset dir>-ACT-torch``, ``<arch>-<date>-<time>-<hex>``; the group:
    :func:`training.config.with_wandb_group`)."""
    before = resumed_identity(cfg.checkpoint_path) if cfg.resume and cfg.checkpoint_path else {}
    project = (
        cfg.project_name
        or before.get("project_name")
        or f"{os.path.basename(os.path.normpath(cfg.data_paths[0]))}-ACT-torch"
    )
    run = (
        cfg.run_name
        or before.get("run_name")
        or f"{cfg.arch.name}-{datetime.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    )
    if cfg.resume and not cfg.checkpoint_path:  # resumed by +run_name=: the run's folder follows from the names
        before = resumed_identity(run_dir(cfg, project, run))
    group = cfg.wandb.group or before.get("wandb_group") or with_wandb_group(cfg, run).wandb.group
    return project, run, group


def with_identity(cfg: PretrainConfig, project: str, run: str, group: str) -> PretrainConfig:
    """``cfg`` with its resolved names and W&B group in place of ``None``: what the run stores (config.yaml, the
    checkpoint's config), so that a resume or a comparison reads the names the run had."""
    return cfg.model_copy(
        update={
            "project_name": project,
            "run_name": run,
            "wandb": cfg.wandb.model_copy(update={"group": group}),
        }
    )


def resumed_identity(checkpoint_dir: str) -> dict[str, str]:
    """The ``run_name`` / ``project_name`` / ``wandb_group`` of the run in ``checkpoint_dir``: from its newest
    readable checkpoint (the state that is resumed; read memory-mapped, tensors untouched), else its summary.json
    (names only); ``{}`` when it has neither. A missing or corrupt summary.json does not lose the names."""
    for _, path in reversed(ckpt.list_checkpoints(checkpoint_dir)):
        try:
            state = ckpt.read_checkpoint(path, "cpu", mmap=True)
        except ckpt.CheckpointError:
            continue  # the resume itself reports (and moves aside) a corrupt file
        cfg = state.get("config") if isinstance(state.get("config"), dict) else {}
        found = {
            "run_name": state.get("run_name") or cfg.get("run_name"),
            "project_name": state.get("project_name") or cfg.get("project_name"),
            "wandb_group": (cfg.get("wandb") or {}).get("group"),
        }
        return {k: str(v) for k, v in found.items() if v}
    try:
        with open(os.path.join(checkpoint_dir, SUMMARY_FILE), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: str(data[k]) for k in ("run_name", "project_name") if isinstance(data, dict) and data.get(k)}
