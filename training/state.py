"""What a checkpoint holds and how a run is restored from it (exact resume).

A run's checkpoint is made of **components**: named objects that save and load their own state
(:class:`Component`: ``state_dict()`` / ``load_state_dict(state)``), each stored under its name -- the model, the
EMA, the optimizers, the LR schedules, the health monitor (:func:`training_components`), and per rank the data
stream (its exact position). :class:`CheckpointManager` iterates them; it knows only what is not a component:
:class:`Progress` (the run's mutable bookkeeping: step, examples seen, the ACT carry, the open log window, the W&B
run id), this rank's RNG state, the run's :class:`RunRecord` (config, architecture, data metadata and fingerprint,
names: refused or compared on resume) and the RunSummary it writes beside every checkpoint. It writes through
``training.checkpoint`` (atomic, plain data, ``weights_only=True`` on load); the file layout is documented there.
Adding a component to a run = one more entry of the components dict: it is saved under its name and restored
whenever a checkpoint has that key (an older file without it leaves the component as built).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

import torch
from torch import nn

from dataset.metadata import DatasetMetadata
from training import checkpoint as ckpt
from training import distributed as D
from training.build import check_split_matches
from training.config import PretrainConfig
from training.summary import RunSummary


class CheckpointSaveError(ckpt.CheckpointError):
    """A checkpoint could not be written (no space left, the run directory gone): the run stops with one line;
    retrying would fail the same way."""


class Component(Protocol):
    """A part of a run that saves and loads its own state (torch modules, optimizers, EMA, the data stream ...)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


@dataclass
class Progress:
    step: int = 0  # optimizer updates done
    examples_seen: int = 0  # examples the carry took in (pitfall 21)
    carry: Any = None  # the ACT carry (None before the first step; per rank, stored in the checkpoint's per_rank)
    # the open log window (raw metric sums of the steps since the last log): checkpointed, so that a resumed run
    # logs -- and summarises -- exactly what an uninterrupted one does
    window: dict[str, float] = field(default_factory=dict)
    window_steps: int = 0
    wandb_id: Optional[str] = None

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's top-level keys of the run's progress (the carry is per rank: not here)."""
        return {
            "step": self.step,
            "examples_seen": self.examples_seen,
            "wandb_id": self.wandb_id,
            "log_window": {"acc": dict(self.window), "n": self.window_steps},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.examples_seen = int(state["step"]), int(state["examples_seen"])
        window = state.get("log_window") or {}
        self.window, self.window_steps = dict(window.get("acc", {})), int(window.get("n", 0))
        self.wandb_id = state.get("wandb_id")


@dataclass(frozen=True)
class RunRecord:
    """What a checkpoint records about its run besides state: checked on resume (architecture, data, world size),
    compared (config), and read by evaluate.py (config, arch, metadata, identifiers hash)."""

    cfg: PretrainConfig
    arch: dict[str, Any]  # the resolved architecture config
    metadata: DatasetMetadata  # the train split's
    data_fingerprint: str  # content fingerprint of the training data (resume refuses other data)
    local_batch_size: int
    run_name: str
    project_name: str

    def state_dict(self) -> dict[str, Any]:
        return {
            "local_batch_size": self.local_batch_size,
            "config": self.cfg.model_dump(mode="json"),
            "arch": self.arch,
            "metadata": self.metadata.model_dump(mode="json"),
            "run_name": self.run_name,
            "project_name": self.project_name,
            "identifiers_sha256": self.metadata.identifiers_sha256,  # evaluate.py refuses other data
            "data_fingerprint": self.data_fingerprint,
        }


# keys that are expected to differ between a run and its resume (how it is resumed, where its folder is)
_RESUME_KEYS = ("resume", "resume_allow_data_change", "checkpoint_path")
# components added to the format later: what a checkpoint without their key means (None: keep the built state)
_ABSENT_IN_OLDER_FILES: dict[str, Any] = {"schedulers": {}}  # no saved schedule: its position from the step


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


def _with_names(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's config with the run's names filled in where it stored none (files written before the config
    held the resolved names): a resume that keeps them is no change."""
    cfg = dict(state.get("config") or {})
    for k in ("run_name", "project_name"):
        if cfg.get(k) is None and state.get(k):
            cfg[k] = state[k]
    return cfg


def check_checkpoint_data(state: dict[str, Any], metadata: DatasetMetadata, data_dir: str) -> None:
    """A checkpoint's weights fit only data of its vocab_size / seq_len."""
    if state.get("metadata"):
        check_split_matches(
            DatasetMetadata.model_validate(state["metadata"]),
            metadata,
            f"{data_dir}: data",
            f"the data of checkpoint {state['_path']}",
        )


# ---------------------------------------------------------------------------------------------------
# components with a resume rule of their own
class OptimizerStates:
    """``{name: optimizer}``: moments from the checkpoint, hyper-parameters from *this* run's config: a resume
    that changes lr / weight_decay / betas takes effect, and says so, instead of being silently overridden."""

    def __init__(self, optimizers: Mapping[str, torch.optim.Optimizer], say: Callable[[str], None]):
        self.optimizers, self.say = optimizers, say

    def state_dict(self) -> dict[str, Any]:
        return {k: o.state_dict() for k, o in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, opt in self.optimizers.items():
            wanted = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in opt.param_groups]
            opt.load_state_dict(state[name])
            for g, want in zip(opt.param_groups, wanted):
                changed = {k: (g.get(k), v) for k, v in want.items() if g.get(k) != v}
                if changed:
                    self.say(
                        f"[train] resume: optimizer {name}/{g.get('name', '?')} uses this run's "
                        + ", ".join(f"{k}={new} (checkpoint had {old})" for k, (old, new) in changed.items())
                    )
                g.update(want)


class ScheduleStates:
    """``{name: LambdaLR}`` (training.schedule): the position (updates done) is the run's step; the base lrs and
    the next update's lr come from *this* run's config (a resume may change lr / warmup / epochs). Restored after
    the optimizers (whose param groups hold this run's ``initial_lr``)."""

    def __init__(
        self, schedulers: Mapping[str, Any], optimizers: Mapping[str, torch.optim.Optimizer], step: Callable[[], int]
    ):
        self.schedulers, self.optimizers, self.step = schedulers, optimizers, step

    def state_dict(self) -> dict[str, Any]:
        return {k: s.state_dict() for k, s in self.schedulers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        step = self.step()
        for name, sched in self.schedulers.items():
            opt = self.optimizers[name]
            if state.get(name) is not None:
                sched.load_state_dict(state[name])
            sched.last_epoch = step
            sched.base_lrs = [g["initial_lr"] for g in opt.param_groups]
            for g, lr in zip(opt.param_groups, [b * f(step) for b, f in zip(sched.base_lrs, sched.lr_lambdas)]):
                g["lr"] = lr


def training_components(
    model: nn.Module,
    ema: Optional[Component],
    optimizers: Mapping[str, torch.optim.Optimizer],
    schedulers: Mapping[str, Any],
    health: Optional[Component],
    progress: Progress,
    say: Callable[[str], None],
) -> dict[str, Optional[Component]]:
    """The components of a training run, by checkpoint key, in restore order (None: off in this run, stored as
    None). ``progress``: the run's Progress, which ``CheckpointManager.restore`` fills before the components (the
    schedules' position is its step)."""
    return {
        "model": ckpt.unwrap_model(model),
        "ema": ema,
        "optimizers": OptimizerStates(optimizers, say),
        "schedulers": ScheduleStates(schedulers, optimizers, lambda: progress.step),
        "health": health,
    }


def _module_mismatch(module: nn.Module, saved: Any) -> Optional[str]:
    """What keeps ``saved`` from loading into ``module`` (missing / unexpected keys, other shapes), or None."""
    if not isinstance(saved, Mapping):
        return f"a {type(saved).__name__}, not a state_dict"
    own = module.state_dict()
    missing, unexpected = sorted(own.keys() - saved.keys()), sorted(saved.keys() - own.keys())
    shapes = [
        f"{k} {tuple(saved[k].shape)} vs {tuple(own[k].shape)}"
        for k in sorted(own.keys() & saved.keys())
        if isinstance(saved[k], torch.Tensor) and saved[k].shape != own[k].shape
    ]
    parts = [
        f"{what} {', '.join(names[:6])}{f' (+{len(names) - 6} more)' if len(names) > 6 else ''}"
        for what, names in (("missing keys", missing), ("unexpected keys", unexpected), ("other shapes", shapes))
        if names
    ]
    return "; ".join(parts) or None


def _restore_component(key: str, component: Component, saved: Any, path: str) -> None:
    """``component.load_state_dict(saved)``; a saved state that does not fit (a model state_dict with missing or
    extra keys or other shapes, an EMA / optimizer of other parameters) is refused with one line
    (:class:`~training.checkpoint.CheckpointError`: the job queue fails the job instead of retrying it, as every
    attempt would fail the same way)."""
    advice = (
        "the code or the run's config changed since it was saved; resume with the code that wrote it, or start a "
        "new run"
    )
    problem = _module_mismatch(component, saved) if isinstance(component, nn.Module) else None
    if problem is None:
        try:
            component.load_state_dict(saved)
            return
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
            text = e.args[0] if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) else str(e)
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            problem = f"{type(e).__name__}: {' '.join(lines)}" if lines else type(e).__name__
    raise ckpt.CheckpointError(f"{path}: its '{key}' state does not fit this run ({problem}); {advice}")


# ---------------------------------------------------------------------------------------------------
class CheckpointManager:
    """Saves and restores one run's full state (see module docstring).

    ``components``: checkpoint key -> component (None: off in this run); ``per_rank``: key -> a component whose
    state differs between ranks (the data stream), stored in each rank's ``per_rank`` entry and, as the contract
    of docs/architecture.md, as a top-level list indexed by rank; ``epochs_done()``: the epochs completed, for
    summary.json."""

    def __init__(
        self,
        checkpoint_dir: str,
        info: D.DistInfo,
        record: RunRecord,
        components: Mapping[str, Optional[Component]],
        *,
        per_rank: Mapping[str, Component],
        summary: RunSummary,
        epochs_done: Callable[[], float],
    ):
        self.checkpoint_dir, self.info, self.record = checkpoint_dir, info, record
        self.components, self.per_rank = dict(components), dict(per_rank)
        self.summary, self.epochs_done = summary, epochs_done
        taken = {"format", "per_rank", "rng", "carry", "summary", *Progress().state_dict(), *record.state_dict()}
        if taken & (self.components.keys() | self.per_rank.keys()):
            raise ValueError(
                f"components named {sorted(taken & (self.components.keys() | self.per_rank.keys()))}: "
                "these checkpoint keys are the manager's own"
            )

    # -- save ----------------------------------------------------------------------------------------
    def save(self, p: Progress) -> Optional[str]:
        """Gather per-rank state to rank 0 and write ``step_<N>.pt`` + summary.json atomically."""
        carry_cpu = ckpt.tree_map_tensors(p.carry, lambda t: t.detach().cpu().clone()) if p.carry is not None else None
        mine = {
            "rng": ckpt.get_rng_state(),
            **{k: c.state_dict() for k, c in self.per_rank.items()},
            "carry": carry_cpu,
        }
        per_rank = D.gather_objects(mine)
        # rank 0 writes; a failure (disk full, ...) reaches every rank as the same one-line error
        path = D.run_on_main(self.info, lambda: self._write(p, per_rank))
        D.barrier()
        return path

    def _write(self, p: Progress, per_rank: list[dict]) -> str:
        path = ckpt.checkpoint_file(self.checkpoint_dir, p.step)
        self.summary.set(steps=p.step, examples_seen=p.examples_seen, epochs_completed=self.epochs_done())
        try:
            ckpt.save_checkpoint_atomic(self._state(p, per_rank, path), path)
        except OSError as e:  # disk full, the run dir replaced by a file, ...: one line, the queue won't retry
            last = ckpt.find_latest_checkpoint(self.checkpoint_dir) if os.path.isdir(self.checkpoint_dir) else None
            raise CheckpointSaveError(
                f"saving step {p.step} failed: {e.filename or self.checkpoint_dir}: {e.strerror or e} ("
                + (
                    f"the last complete checkpoint {os.path.basename(last)} is intact)"
                    if last
                    else "no earlier checkpoint)"
                )
            ) from None
        self.summary.set(last_checkpoint=path)  # only once the file is complete
        ckpt.prune_checkpoints(self.checkpoint_dir, self.record.cfg.checkpoint_keep, protect=(path,))
        self.summary.write()
        return path

    def _state(self, p: Progress, per_rank: list[dict], path: str) -> dict[str, Any]:
        """The checkpoint dict (layout: training/checkpoint.py)."""
        state: dict[str, Any] = {"format": ckpt.FORMAT}
        state.update({k: c.state_dict() if c is not None else None for k, c in self.components.items()})
        state.update(p.state_dict())
        state["per_rank"] = per_rank
        for key in ("rng", *self.per_rank):  # contract keys: lists indexed by rank (same objects as per_rank)
            state[key] = [r[key] for r in per_rank]
        state.update(self.record.state_dict())
        state["summary"] = self.summary.state_dict()
        state["summary"]["last_checkpoint"] = path  # as it will be once this file exists
        return state

    # -- restore ---------------------------------------------------------------------------------------
    def load_latest(self) -> Optional[dict[str, Any]]:
        """The newest loadable checkpoint of the run dir (rank 0 picks it: a truncated / corrupt newer file is
        reported, moved aside to ``*.corrupt`` and skipped); every rank loads the same file."""
        choice: tuple = (None, None)
        st = None
        if self.info.is_main:
            try:
                st = ckpt.load_latest_intact(
                    self.checkpoint_dir, quarantine=True, warn=lambda m: print(m, file=sys.stderr, flush=True)
                )
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
        """Load ``state`` into ``p`` and the components (in order); returns this rank's RNG state, to be set just
        before the first step (docs/training.md, "Checkpoints and resume": the resume is exact)."""
        self._check_resumable(state)
        p.load_state_dict(state)
        for key, component in self.components.items():
            saved = state.get(key, _ABSENT_IN_OLDER_FILES.get(key))
            if component is not None and saved is not None:
                _restore_component(key, component, saved, state["_path"])
        mine = state["per_rank"][self.info.rank]
        for key, component in self.per_rank.items():
            _restore_component(key, component, mine.get(key), state["_path"])
        p.carry = (
            ckpt.tree_map_tensors(mine["carry"], lambda t: t.to(self.info.device))
            if mine["carry"] is not None
            else None
        )
        if state.get("summary"):
            self.summary.load_state_dict(state["summary"])
        say(f"[train] resumed from {state['_path']} at step {p.step}")
        notes = [
            f"resume: config changed since the checkpoint: {c}"
            for c in config_changes(_with_names(state), self.record.cfg.model_dump(mode="json"))
        ]
        if state.get("data_fingerprint") not in (None, self.record.data_fingerprint):
            notes.append("resume: the training data differs from the checkpoint's (resume_allow_data_change=true)")
        for note in notes:  # printed and kept in summary.json, so a changed resume is never silent
            say(f"[train] {note}")
            if self.info.is_main:
                self.summary.add_warning(note)
        return mine["rng"]

    def _check_resumable(self, state: dict[str, Any]) -> None:
        """Same architecture, data of the same shapes, the same training data (unless
        ``resume_allow_data_change``; checkpoints older than the fingerprint are not checked), the same world
        size."""
        rec = self.record
        ckpt.check_arch_compatible(state["arch"], rec.arch, source=state["_path"])
        check_checkpoint_data(state, rec.metadata, rec.cfg.data_paths[0])
        want = state.get("data_fingerprint")
        if want not in (None, rec.data_fingerprint) and not rec.cfg.resume_allow_data_change:
            raise ckpt.CheckpointError(
                f"{state['_path']}: the training data {rec.cfg.data_paths} differs from the data this run was "
                f"trained on (content fingerprint {rec.data_fingerprint[:12]} vs {want[:12]}); resume on the same "
                "data, or pass resume_allow_data_change=true"
            )
        saved_ws = len(state["per_rank"])
        if saved_ws != self.info.world_size:
            raise ckpt.CheckpointError(
                f"{state['_path']}: saved with world size {saved_ws}, resumed with "
                f"{self.info.world_size}; exact resume needs the same number of processes"
            )
