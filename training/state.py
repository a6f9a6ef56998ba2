"""What a checkpoint holds and how a run is restored from it (exact resume).

:class:`Progress` is the run's mutable bookkeeping (step, examples seen, the ACT carry, the open log window,
the W&B run id); :class:`CheckpointManager` builds the checkpoint dict from the run's components (model, EMA,
optimizers, data stream, health monitor, summary) and Progress, writes it through ``training.checkpoint``
(atomic, plain data, ``weights_only=True`` on load) and restores all of it. The file layout is documented in
``training/checkpoint.py``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn

from dataset.metadata import DatasetMetadata
from training import checkpoint as ckpt
from training import distributed as D
from training.build import check_split_matches
from training.config import PretrainConfig
from training.ema import EMA
from training.health import HealthMonitor
from training.summary import RunSummary


class CheckpointSaveError(ckpt.CheckpointError):
    """A checkpoint could not be written (no space left, the run directory gone): the run stops with one line;
    retrying would fail the same way."""


@dataclass
class Progress:
    step: int = 0  # optimizer updates done
    examples_seen: int = 0  # examples the carry took in (pitfall 21)
    carry: Any = None  # the ACT carry (None before the first step)
    # the open log window (raw metric sums of the steps since the last log): checkpointed, so that a resumed run
    # logs -- and summarises -- exactly what an uninterrupted one does
    window: dict[str, float] = field(default_factory=dict)
    window_steps: int = 0
    wandb_id: Optional[str] = None


# keys that are expected to differ between a run and its resume
_RESUME_KEYS = ("resume", "resume_allow_data_change")


def config_changes(old: Any, new: Any, prefix: str = "") -> list[str]:
    """``"key: old -> new"`` for every dotted key whose value differs between two config dumps."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new)):
            if not prefix and k in _RESUME_KEYS:
                continue
            out += config_changes(old.get(k, "<unset>"), new.get(k, "<unset>"), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix[:-1]}: {old!r} -> {new!r}"]


def check_checkpoint_data(state: dict[str, Any], metadata: DatasetMetadata, data_dir: str) -> None:
    """A checkpoint's weights fit only data of its vocab_size / seq_len."""
    if state.get("metadata"):
        check_split_matches(DatasetMetadata.model_validate(state["metadata"]), metadata, f"{data_dir}: data",
                            f"the data of checkpoint {state['_path']}")


@dataclass
class CheckpointManager:
    """Saves and restores one run's full state (see module docstring)."""

    checkpoint_dir: str
    info: D.DistInfo
    cfg: PretrainConfig
    model: nn.Module
    optimizers: dict[str, torch.optim.Optimizer]
    ema: Optional[EMA]
    dataset: Any  # dataset.loader.PuzzleDataset (state_dict / load_state_dict: the exact stream position)
    health: Optional[HealthMonitor]
    summary: RunSummary
    metadata: DatasetMetadata
    arch: dict[str, Any]
    local_batch_size: int
    run_name: str
    project_name: str
    epochs_completed: Callable[[], float]
    schedulers: dict[str, Any] = field(default_factory=dict)  # name -> LambdaLR (training.schedule)

    def __post_init__(self) -> None:
        self.data_fingerprint = self.dataset.fingerprint()

    # -- save ----------------------------------------------------------------------------------------
    def save(self, p: Progress) -> Optional[str]:
        """Gather per-rank state to rank 0 and write ``step_<N>.pt`` + summary.json atomically."""
        carry_cpu = (ckpt.tree_map_tensors(p.carry, lambda t: t.detach().cpu().clone())
                     if p.carry is not None else None)
        per_rank = D.gather_objects({"rng": ckpt.get_rng_state(), "data_state": self.dataset.state_dict(),
                                     "carry": carry_cpu})
        # rank 0 writes; a failure (disk full, ...) reaches every rank as the same one-line error
        path = D.run_on_main(self.info, lambda: self._write(p, per_rank))
        D.barrier()
        return path

    def _write(self, p: Progress, per_rank: list[dict]) -> str:
        path = ckpt.checkpoint_file(self.checkpoint_dir, p.step)
        self.summary.set(steps=p.step, examples_seen=p.examples_seen, epochs_completed=self.epochs_completed())
        try:
            ckpt.save_checkpoint_atomic(self._state(p, per_rank, path), path)
        except OSError as e:  # disk full, the run dir replaced by a file, ...: one line, the queue won't retry
            last = ckpt.find_latest_checkpoint(self.checkpoint_dir) if os.path.isdir(self.checkpoint_dir) else None
            raise CheckpointSaveError(
                f"saving step {p.step} failed: {e.filename or self.checkpoint_dir}: {e.strerror or e} ("
                + (f"the last complete checkpoint {os.path.basename(last)} is intact)" if last else
                   "no earlier checkpoint)")) from None
        self.summary.set(last_checkpoint=path)  # only once the file is complete
        ckpt.prune_checkpoints(self.checkpoint_dir, self.cfg.checkpoint_keep, protect=(path,))
        self.summary.write()
        return path

    def _state(self, p: Progress, per_rank: list[dict], path: str) -> dict[str, Any]:
        summary_state = self.summary.state_dict()
        summary_state["last_checkpoint"] = path  # as it will be once this file exists
        return {
            "format": ckpt.FORMAT, "model": ckpt.unwrap_model(self.model).state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
            "schedulers": {k: s.state_dict() for k, s in self.schedulers.items()},
            "step": p.step, "examples_seen": p.examples_seen, "per_rank": per_rank,
            # contract keys (docs/architecture.md): lists indexed by rank (same objects as per_rank)
            "rng": [r["rng"] for r in per_rank], "data_state": [r["data_state"] for r in per_rank],
            "local_batch_size": self.local_batch_size, "config": self.cfg.model_dump(mode="json"),
            "arch": self.arch, "metadata": self.metadata.model_dump(mode="json"), "summary": summary_state,
            "health": self.health.state_dict() if self.health is not None else None,
            "wandb_id": p.wandb_id, "run_name": self.run_name, "project_name": self.project_name,
            "log_window": {"acc": dict(p.window), "n": p.window_steps},
            "identifiers_sha256": self.metadata.identifiers_sha256,  # evaluate.py refuses other data
            "data_fingerprint": self.data_fingerprint,  # resume refuses other training data
        }

    # -- restore ---------------------------------------------------------------------------------------
    def load_latest(self) -> Optional[dict[str, Any]]:
        """The newest loadable checkpoint of the run dir (rank 0 picks it: a truncated / corrupt newer file is
        reported, moved aside to ``*.corrupt`` and skipped); every rank loads the same file."""
        choice: tuple = (None, None)
        st = None
        if self.info.is_main:
            try:
                st = ckpt.load_latest_intact(self.checkpoint_dir, quarantine=True,
                                             warn=lambda m: print(m, file=sys.stderr, flush=True))
                choice = (st["_path"] if st is not None else None, None)
            except ckpt.CheckpointError as e:
                choice = (None, str(e))
        path, err = D.broadcast_object(choice)
        if err:
            raise ckpt.CheckpointError(err)
        if path is None:
            return None
        return st if self.info.is_main else ckpt.read_checkpoint(path)

    def restore(self, state: dict[str, Any], p: Progress, say: Callable[[str], None]) -> dict[str, Any]:
        """Load ``state`` into the components and ``p``; returns this rank's RNG state, to be set just before the
        first step (docs/training.md: exact resume)."""
        ckpt.check_arch_compatible(state["arch"], self.arch, source=state["_path"])
        check_checkpoint_data(state, self.metadata, self.cfg.data_paths[0])
        self._check_same_data(state)
        saved_ws = len(state["per_rank"])
        if saved_ws != self.info.world_size:
            raise ckpt.CheckpointError(f"{state['_path']}: saved with world size {saved_ws}, resumed with "
                                       f"{self.info.world_size}; exact resume needs the same number of processes")
        self.model.load_state_dict(state["model"])
        for name, opt in self.optimizers.items():
            self._restore_optimizer(name, opt, state["optimizers"][name], say)
            self._restore_scheduler(name, opt, (state.get("schedulers") or {}).get(name), int(state["step"]))
        if self.ema is not None and state.get("ema"):
            self.ema.load_state_dict(state["ema"])
        p.step, p.examples_seen = int(state["step"]), int(state["examples_seen"])
        mine = state["per_rank"][self.info.rank]
        self.dataset.load_state_dict(mine["data_state"])
        device = next(iter(self.model.parameters())).device
        p.carry = (ckpt.tree_map_tensors(mine["carry"], lambda t: t.to(device)) if mine["carry"] is not None
                   else None)
        if self.health is not None and state.get("health") is not None:
            self.health.load_state_dict(state["health"])
        if state.get("summary"):
            self.summary.load_state_dict(state["summary"])
        window = state.get("log_window") or {}
        p.window, p.window_steps = dict(window.get("acc", {})), int(window.get("n", 0))
        p.wandb_id = state.get("wandb_id")
        say(f"[train] resumed from {state['_path']} at step {p.step}")
        notes = [f"resume: config changed since the checkpoint: {c}"
                 for c in config_changes(state.get("config") or {}, self.cfg.model_dump(mode="json"))]
        if state.get("data_fingerprint") not in (None, self.data_fingerprint):
            notes.append("resume: the training data differs from the checkpoint's (resume_allow_data_change=true)")
        for note in notes:  # printed and kept in summary.json, so a changed resume is never silent
            say(f"[train] {note}")
            if self.info.is_main:
                self.summary.add_warning(note)
        return mine["rng"]

    def _check_same_data(self, state: dict[str, Any]) -> None:
        """Resume continues the same run: other training data (same shapes or not) is refused unless
        ``resume_allow_data_change``; checkpoints older than the fingerprint are not checked."""
        want = state.get("data_fingerprint")
        if want is None or want == self.data_fingerprint or self.cfg.resume_allow_data_change:
            return
        raise ckpt.CheckpointError(f"{state['_path']}: the training data {self.cfg.data_paths} differs from the data "
                                   f"this run was trained on (content fingerprint {self.data_fingerprint[:12]} vs "
                                   f"{want[:12]}); resume on the same data, or pass resume_allow_data_change=true")

    def _restore_scheduler(self, name: str, opt: torch.optim.Optimizer, saved: Optional[dict], step: int) -> None:
        """The schedule's position (updates done) from the checkpoint (older checkpoints: the step); its base lrs
        and the next update's lr from *this* run's config (a resume may change lr / warmup / epochs)."""
        sched = self.schedulers.get(name)
        if sched is None:
            return
        if saved is not None:
            sched.load_state_dict(saved)
        sched.last_epoch = step
        sched.base_lrs = [g["initial_lr"] for g in opt.param_groups]
        for g, lr in zip(opt.param_groups, [b * f(step) for b, f in zip(sched.base_lrs, sched.lr_lambdas)]):
            g["lr"] = lr

    @staticmethod
    def _restore_optimizer(name: str, opt: torch.optim.Optimizer, saved: dict, say: Callable[[str], None]) -> None:
        """Moments from the checkpoint, hyper-parameters from *this* run's config: a resume that changes lr /
        weight_decay / betas takes effect, and says so, instead of being silently overridden."""
        wanted = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in opt.param_groups]
        opt.load_state_dict(saved)
        for g, want in zip(opt.param_groups, wanted):
            changed = {k: (g.get(k), v) for k, v in want.items() if g.get(k) != v}
            if changed:
                say(f"[train] resume: optimizer {name}/{g.get('name', '?')} uses this run's "
                    + ", ".join(f"{k}={new} (checkpoint had {old})" for k, (old, new) in changed.items()))
            g.update(want)
