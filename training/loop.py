"""The one training loop: ``train(cfg) -> summary dict`` (TRM, HRM, transformer and ETRM all use it).

Reading order: ``train`` -> ``Trainer.__init__`` (data, model, optimizers, resume) -> ``Trainer.run``
(the step loop) -> ``Trainer.train_step`` (one optimizer update). See docs/training.md for the semantics of
every metric, the ACT-carry data consumption and the resume guarantees.
"""
from __future__ import annotations

import datetime
import inspect
import math
import os
import secrets
import signal
import sys
from typing import Any, Optional, Union

import torch
from torch import nn

from dataset.common import DatasetMetadata
from training import checkpoint as ckpt
from training import distributed as D
from training.config import ConfigError, PretrainConfig, config_from_dict, config_from_hydra
from training.ema import EMA
from training.logging import RunLogger
from training.schedule import lr_at_step
from training.summary import (EXIT_EARLY_STOP, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NONFINITE, EXIT_OK,
                              STOP_COMPLETED, STOP_ERROR, STOP_INTERRUPTED, STOP_MAX_STEPS, STOP_NONFINITE,
                              SUMMARY_FILE, RunSummary)

RUN_LOCK_FILE = ".run.lock"  # in the checkpoint dir: held (OS lock) by the run writing there


class NonFiniteLossError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------------
# Model construction (shared with training.checkpoint.load_model_for_inference)
# ---------------------------------------------------------------------------------------------------
def check_data_matches_arch(arch: dict[str, Any], metadata: DatasetMetadata, data_dir: str) -> dict[str, Any]:
    """Compare optional ``arch.vocab_size`` / ``arch.seq_len`` with the data; returns arch without them."""
    arch = dict(arch)
    for key in ("vocab_size", "seq_len"):
        if key in arch:
            want = arch.pop(key)
            have = getattr(metadata, key)
            if want is not None and int(want) != int(have):
                raise ConfigError(
                    f"{data_dir}: data {key}={have} but the model config has arch.{key}={want}; "
                    f"rebuild the data or change the architecture")
    return arch


def resolve_arch(cfg: PretrainConfig, metadata: Optional[DatasetMetadata] = None) -> dict[str, Any]:
    """The architecture config with every default filled in (stored in checkpoints, compared on load)."""
    arch, _ = cfg.arch_for_model()
    if metadata is not None:
        arch = check_data_matches_arch(arch, metadata, cfg.data_paths[0])
    else:
        arch = {k: v for k, v in arch.items() if k not in ("vocab_size", "seq_len")}
    import models

    if arch.get("name") in models.ARCH_REGISTRY:
        try:
            return models.parse_arch_config(arch).model_dump(mode="json")
        except models.ArchConfigError as e:
            raise ConfigError(str(e)) from None
    return arch


def build_act_model(cfg: PretrainConfig, metadata: DatasetMetadata, batch_size: int) -> nn.Module:
    """The ACT model of ``cfg`` for data described by ``metadata`` (local batch ``batch_size``)."""
    import models

    arch, _ = cfg.arch_for_model()
    arch = check_data_matches_arch(arch, metadata, cfg.data_paths[0])
    try:
        if cfg.encoder is not None:
            from models.etrm import build_etrm_model

            kw = {}
            params = inspect.signature(build_etrm_model).parameters
            if "batch_size" in params:
                kw["batch_size"] = batch_size
            return build_etrm_model(cfg, metadata, **kw)
        return models.build_model(arch, vocab_size=metadata.vocab_size, seq_len=metadata.seq_len,
                                  num_puzzle_identifiers=metadata.num_puzzle_identifiers, batch_size=batch_size)
    except models.ArchConfigError as e:
        raise ConfigError(str(e)) from None


def build_loss_head(model: nn.Module, loss_type: Optional[str]) -> nn.Module:
    """ACTLossHead configured from the model's ``arch.loss`` section (``loss_type`` overrides it)."""
    import models

    overrides = {"loss_type": loss_type} if loss_type else {}
    if getattr(getattr(model, "config", None), "loss", None) is not None:
        return models.build_loss_head(model, None, **overrides)
    return models.ACTLossHead(model, **overrides)


def _sparse_embedding(model: nn.Module) -> Optional[nn.Module]:
    """The model's SparsePuzzleEmbedding, if any (searched by type name, wherever it lives)."""
    for m in model.modules():
        if type(m).__name__ == "SparsePuzzleEmbedding":
            return m
    return None


def _call_with_supported(fn, /, *args, **kwargs):
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def build_optimizers(cfg: PretrainConfig, model: nn.Module, world_size: int) -> dict[str, torch.optim.Optimizer]:
    """``adam``: AdamATan2 over every trainable parameter (encoder params in their own group when
    ``encoder_lr`` is set); ``puzzle_emb``: SignSGDSparse over the puzzle-embedding buffer (if any)."""
    from training.optim import AdamATan2

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    enc = [p for n, p in named if _is_encoder_param(n)]
    rest = [p for n, p in named if not _is_encoder_param(n)]
    groups: list[dict[str, Any]] = []
    if rest:
        groups.append({"params": rest, "lr": cfg.lr, "base_lr": cfg.lr, "name": "inner"})
    if enc:
        base = cfg.encoder_lr if cfg.encoder_lr is not None else cfg.lr
        groups.append({"params": enc, "lr": base, "base_lr": base, "name": "encoder"})
    opts: dict[str, torch.optim.Optimizer] = {}
    if groups:
        opts["adam"] = AdamATan2(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    emb = _sparse_embedding(model)
    if emb is not None:
        from models.sparse_embedding import SignSGDSparse

        opts["puzzle_emb"] = _call_with_supported(
            SignSGDSparse, list(emb.buffers()), lr=cfg.puzzle_emb_lr, weight_decay=cfg.puzzle_emb_weight_decay,
            world_size=world_size)
        for g in opts["puzzle_emb"].param_groups:
            g["base_lr"] = cfg.puzzle_emb_lr
    return opts


def _is_encoder_param(name: str) -> bool:
    return name.startswith("encoder.") or ".encoder." in f".{name}"


def default_names(cfg: PretrainConfig) -> tuple[str, str]:
    project = cfg.project_name or f"{os.path.basename(os.path.normpath(cfg.data_paths[0]))}-ACT-torch"
    run = cfg.run_name or (f"{cfg.arch.get('name', 'model')}-{datetime.datetime.now():%Y%m%d-%H%M%S}-"
                           f"{secrets.token_hex(2)}")
    return project, run


# ---------------------------------------------------------------------------------------------------
class Trainer:
    """Holds the state of one run. ``run()`` returns the summary dict."""

    def __init__(self, cfg: PretrainConfig, info: D.DistInfo, config_path: Optional[str] = None):
        self.cfg, self.info, self.device = cfg, info, info.device
        self.local_bs = D.local_batch_size(cfg.global_batch_size, info.world_size)
        project, run = default_names(cfg)
        self.project_name, self.run_name = D.broadcast_object((project, run))
        self.checkpoint_dir = os.path.abspath(cfg.checkpoint_path or os.path.join("checkpoints", self.project_name,
                                                                                   self.run_name))
        resolve_arch(cfg)  # fail fast on a bad arch.* key, before any data is read
        if cfg.resume and cfg.run_name is None and cfg.checkpoint_path is None:
            raise ConfigError("resume=true needs +run_name=… or checkpoint_path=… to find the run")
        self._run_lock = None
        self._created_dir = False
        self._claim_run_dir()
        try:
            self._build(config_path)
        except BaseException:
            self.close()
            self._remove_created_dir()
            raise

    def _build(self, config_path: Optional[str]) -> None:
        """Data, model, optimizers, EMA, resume (the body of ``__init__`` once the run directory is ours)."""
        from dataset.loader import PuzzleDatasetConfig, create_dataloader

        cfg, info = self.cfg, self.info
        # identical seed on every rank for construction (same initial weights), per-rank seed afterwards
        D.seed_everything(cfg.seed, 0)

        # ---- data ----
        encoder_mode = cfg.encoder is not None
        self.train_loader, self.metadata = create_dataloader(PuzzleDatasetConfig(
            data_paths=cfg.data_paths, global_batch_size=cfg.global_batch_size, seed=cfg.seed, rank=info.rank,
            world_size=info.world_size, test_mode=False, max_groups=cfg.max_train_groups,
            translate_augment=cfg.translate_augment, encoder_mode=encoder_mode, max_demos=cfg.max_demos,
            num_workers=cfg.num_workers), "train")
        self.train_dataset = self.train_loader.dataset
        if encoder_mode and self.metadata.test_demos_in_train and not cfg.allow_test_demos_in_train:
            raise ConfigError(
                f"{cfg.data_paths}: metadata test_demos_in_train=true (a --mode trm build): the test puzzles' demo "
                f"pairs are in train/, so an encoder model would not be evaluated few-shot. Build the data with "
                f"--mode etrm, or pass allow_test_demos_in_train=true to accept it.")
        self.batches_per_epoch = int(self.train_dataset.num_batches(0))
        if self.batches_per_epoch <= 0:
            raise ConfigError(f"{cfg.data_paths}: fewer training examples than global_batch_size="
                              f"{cfg.global_batch_size}")
        # Step accounting from the real number of samples (pitfall 7): one global batch per step. When the active
        # groups are smaller than one global batch the loader packs several passes into one of its epochs; `epochs`
        # keeps meaning passes over the data.
        self.passes_per_epoch = int(getattr(self.train_dataset, "passes_per_epoch", lambda e: 1)(0))
        self.total_steps = max(1, math.ceil(cfg.epochs * self.batches_per_epoch / self.passes_per_epoch))
        if self.passes_per_epoch > 1 and info.is_main:
            print(f"[train] one pass over the {cfg.max_train_groups or 'selected'} training groups is smaller than "
                  f"global_batch_size={cfg.global_batch_size}: each loader epoch packs {self.passes_per_epoch} "
                  f"passes ({self.batches_per_epoch} batch(es)); {cfg.epochs} epochs = {self.total_steps} steps")
        self.capped = cfg.max_steps is not None and cfg.max_steps < self.total_steps
        if self.capped:
            self.total_steps = int(cfg.max_steps)

        self.evaluators: list = []
        self.test_loader = None
        self.test_metadata = None
        if self._eval_needed():
            self.test_loader, self.test_metadata = create_dataloader(PuzzleDatasetConfig(
                data_paths=cfg.test_paths, global_batch_size=cfg.global_batch_size, seed=cfg.seed,
                rank=info.rank, world_size=info.world_size, test_mode=True, max_groups=cfg.max_eval_groups,
                encoder_mode=encoder_mode, max_demos=cfg.max_demos, num_workers=cfg.num_workers), "test")
            for key in ("vocab_size", "seq_len"):
                if getattr(self.test_metadata, key) != getattr(self.metadata, key):
                    raise ConfigError(f"{cfg.test_paths[0]}: test split {key}={getattr(self.test_metadata, key)} "
                                      f"differs from the train split ({getattr(self.metadata, key)})")
            if cfg.evaluators:
                from evaluators import build_evaluators  # construction failures raise (pitfall 14)

                self.evaluators = build_evaluators(
                    [{"name": e.name, **e.kwargs} for e in cfg.evaluators],
                    data_path=cfg.test_paths[0] if len(cfg.test_paths) == 1 else cfg.test_paths,
                    metadata=self.test_metadata, output_dir=os.path.join(self.checkpoint_dir, "eval"))

        # ---- model, loss head, optimizers, EMA ----
        self.model = build_act_model(cfg, self.metadata, self.local_bs).to(self.device)
        _, loss_type = cfg.arch_for_model()
        self.arch = resolve_arch(cfg, self.metadata)
        self.head = build_loss_head(self.model, loss_type).to(self.device)
        self.optimizers = build_optimizers(cfg, self.model, info.world_size)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.encoder_params = [p for n, p in self.model.named_parameters() if p.requires_grad and _is_encoder_param(n)]
        self.inner_params = [p for n, p in self.model.named_parameters()
                             if p.requires_grad and not _is_encoder_param(n)]
        self.num_params = sum(p.numel() for p in self.trainable)
        D.broadcast_module_(self.model)  # guarantee identical replicas (no-op in one process)
        D.seed_everything(cfg.seed, info.rank)  # per-rank randomness (ACT exploration, dropout)

        self.step = 0
        self.examples_seen = 0
        self.carry = None
        # the open log window (raw metric sums of the steps since the last log): checkpointed, so that a resumed
        # run logs -- and summarises -- exactly what an uninterrupted one does
        self._acc: dict[str, float] = {}
        self._n_acc = 0
        self.wandb_id: Optional[str] = None
        self._pending_rng: Optional[dict] = None
        self.summary = RunSummary(self.checkpoint_dir, run_name=self.run_name, project_name=self.project_name,
                                  config_path=config_path, total_steps=self.total_steps, num_params=self.num_params)
        self.health = None
        if cfg.health or cfg.early_stop or encoder_mode:
            from encoders.health import HealthConfig, HealthMonitor

            self.health = HealthMonitor(HealthConfig(**cfg.health))

        resume_state = None
        if cfg.resume:
            resume_state = self._load_resume_state()
            if resume_state is None:
                self._print(f"[train] resume=true but no checkpoint in {self.checkpoint_dir}; starting fresh")
        elif cfg.load_checkpoint:
            st = ckpt.load_weights(self.model, cfg.load_checkpoint, arch=self.arch)
            self._check_metadata(st, cfg.load_checkpoint)
            self._print(f"[train] initialised weights from {st['_path']}")
        self.ema = EMA(self.model, cfg.ema_rate) if cfg.ema else None
        if resume_state is not None:
            self._restore(resume_state)

        # compile the loss head (model inside) on CUDA; diagnostics / EMA stay outside (pitfall 18)
        self.compiled = D.should_compile(cfg.compile, self.device)
        self.forward = torch.compile(self.head, dynamic=False) if self.compiled else self.head
        self._diag_fn = getattr(self.model, "diagnostics", None)
        self._stop_flag: Optional[str] = None
        self._pending_save = False
        self._last_outputs: dict = {}

    # ------------------------------------------------------------------------------------------------
    def _claim_run_dir(self) -> None:
        """Rank 0 locks the run directory (a second concurrent run on it is refused; the OS releases the lock
        when the process dies) and, unless ``resume=true``, refuses a directory that holds another run's
        checkpoints or summary.json. Every rank raises the same ConfigError."""
        err = None
        if self.info.is_main:
            err = self._lock_and_check_run_dir()
        err = D.broadcast_object(err)
        if err:
            self.close()
            raise ConfigError(err)

    def _lock_and_check_run_dir(self) -> Optional[str]:
        import filelock

        d = self.checkpoint_dir
        try:
            self._created_dir = not os.path.isdir(d)
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            return f"{d}: cannot create the run directory ({e.strerror or e})"
        lock_path = os.path.join(d, RUN_LOCK_FILE)
        kw = {"fallback_to_soft": False} if "fallback_to_soft" in inspect.signature(filelock.FileLock).parameters \
            else {}  # a file-existence lock would outlive a killed process: better no lock than a stale one
        lock = filelock.FileLock(lock_path, timeout=0, **kw)
        try:
            lock.acquire()
            self._run_lock = lock
        except filelock.Timeout:
            return (f"{d}: another run is using this run directory right now ({RUN_LOCK_FILE} is locked by a live "
                    f"process); wait for it to end, or give this run a new +run_name=… / checkpoint_path=…")
        except OSError as e:  # e.g. a file system without flock: run unlocked, loudly
            self._print(f"[train] WARNING: cannot lock {lock_path} ({e.strerror or e}); a second run on the same "
                        f"directory would not be refused")
        if not self.cfg.resume:
            found = [os.path.basename(p) for _, p in ckpt.list_checkpoints(d)]
            if os.path.isfile(os.path.join(d, SUMMARY_FILE)):
                found.append(SUMMARY_FILE)
            if found:
                self.close()
                shown = ", ".join(found[-3:]) if len(found) <= 3 else f"{len(found)} files incl. {found[-1]}"
                return (f"{d}: already holds another run's files ({shown}); pass resume=true to continue that run, "
                        f"or give this run a new +run_name=… / checkpoint_path=… (nothing was written)")
        return None

    def close(self) -> None:
        """Release the run directory's lock (idempotent; also called at the end of ``run``)."""
        lock, self._run_lock = getattr(self, "_run_lock", None), None
        if lock is not None:
            try:
                lock.release(force=True)
            except Exception:
                pass

    def _remove_created_dir(self) -> None:
        """A run that failed while being set up leaves nothing behind: the directory it created (holding only its
        lock file) is removed."""
        if not (self._created_dir and self.info.is_main):
            return
        try:
            if set(os.listdir(self.checkpoint_dir)) <= {RUN_LOCK_FILE}:
                if os.path.exists(os.path.join(self.checkpoint_dir, RUN_LOCK_FILE)):
                    os.unlink(os.path.join(self.checkpoint_dir, RUN_LOCK_FILE))
                os.rmdir(self.checkpoint_dir)
        except OSError:
            pass

    def _load_resume_state(self) -> Optional[dict]:
        """The newest loadable checkpoint of the run dir (rank 0 picks it: a truncated / corrupt newer file is
        reported, moved aside to ``*.corrupt`` and skipped); every rank loads the same file."""
        choice = (None, None)
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

    # ------------------------------------------------------------------------------------------------
    def _print(self, msg: str) -> None:
        if self.info.is_main:
            print(msg, flush=True)

    def _eval_needed(self) -> bool:
        """Evaluate when evaluators are configured, or when every test path has a test split."""
        if self.cfg.evaluators:
            return True
        if self.cfg.eval_interval is None and self.cfg.eval_interval_steps is None and not self.cfg.eval_at_end:
            return False
        return all(os.path.isfile(os.path.join(p, "test", "dataset.json")) for p in self.cfg.test_paths)

    def _check_metadata(self, state: dict, source: str) -> None:
        meta = state.get("metadata") or {}
        for key in ("vocab_size", "seq_len"):
            if key in meta and meta[key] != getattr(self.metadata, key):
                raise ConfigError(f"{source}: checkpoint was trained on data with {key}={meta[key]} but "
                                  f"{self.cfg.data_paths[0]} has {key}={getattr(self.metadata, key)}")

    def _restore(self, state: dict) -> None:
        ckpt.check_arch_compatible(state["arch"], self.arch, source=state["_path"])
        self._check_metadata(state, state["_path"])
        saved_ws = len(state["per_rank"])
        if saved_ws != self.info.world_size:
            raise ckpt.CheckpointError(f"{state['_path']}: saved with world size {saved_ws}, resumed with "
                                       f"{self.info.world_size}; exact resume needs the same number of processes")
        self.model.load_state_dict(state["model"])
        for name, opt in self.optimizers.items():
            # hyper-parameters come from the config of *this* run (the moments from the checkpoint): a resume that
            # changes lr / weight_decay / betas takes effect, and says so, instead of being silently overridden
            wanted = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in opt.param_groups]
            opt.load_state_dict(state["optimizers"][name])
            for g, want in zip(opt.param_groups, wanted):
                changed = {k: (g.get(k), v) for k, v in want.items() if g.get(k) != v}
                if changed:
                    self._print(f"[train] resume: optimizer {name}/{g.get('name', '?')} uses this run's "
                                + ", ".join(f"{k}={new} (checkpoint had {old})" for k, (old, new) in changed.items()))
                g.update(want)
        if self.ema is not None and state.get("ema"):
            self.ema.load_state_dict(state["ema"])
        self.step = int(state["step"])
        self.examples_seen = int(state["examples_seen"])
        mine = state["per_rank"][self.info.rank]
        self.train_dataset.load_state_dict(mine["data_state"])
        self.carry = (ckpt.tree_map_tensors(mine["carry"], lambda t: t.to(self.device))
                      if mine["carry"] is not None else None)
        self._pending_rng = mine["rng"]
        if self.health is not None and state.get("health") is not None:
            self.health.load_state_dict(state["health"])
        if state.get("summary"):
            self.summary.load_state_dict(state["summary"])
        window = state.get("log_window") or {}
        self._acc, self._n_acc = dict(window.get("acc", {})), int(window.get("n", 0))
        self.wandb_id = state.get("wandb_id")
        self._print(f"[train] resumed from {state['_path']} at step {self.step}")

    # ------------------------------------------------------------------------------------------------
    def save_checkpoint(self) -> Optional[str]:
        """Gather per-rank state to rank 0 and write ``step_<N>.pt`` + summary.json atomically."""
        carry_cpu = (ckpt.tree_map_tensors(self.carry, lambda t: t.detach().cpu().clone())
                     if self.carry is not None else None)
        per_rank = D.gather_objects({"rng": ckpt.get_rng_state(), "data_state": self.train_dataset.state_dict(),
                                     "carry": carry_cpu})
        path = None
        if self.info.is_main:
            path = ckpt.checkpoint_file(self.checkpoint_dir, self.step)
            self.summary.set(steps=self.step, examples_seen=self.examples_seen,
                             epochs_completed=self._epochs_completed())
            summary_state = self.summary.state_dict()
            summary_state["last_checkpoint"] = path  # as it will be once this file exists
            state = {
                "format": ckpt.FORMAT, "model": ckpt.unwrap_model(self.model).state_dict(),
                "ema": self.ema.state_dict() if self.ema is not None else None,
                "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
                "step": self.step, "examples_seen": self.examples_seen, "per_rank": per_rank,
                # contract keys (docs/architecture.md §4): lists indexed by rank (same objects as per_rank)
                "rng": [r["rng"] for r in per_rank], "data_state": [r["data_state"] for r in per_rank],
                "local_batch_size": self.local_bs, "config": self.cfg.model_dump(mode="json"), "arch": self.arch,
                "metadata": self.metadata.model_dump(mode="json"), "summary": summary_state,
                "health": self.health.state_dict() if self.health is not None else None,
                "wandb_id": self.wandb_id, "run_name": self.run_name, "project_name": self.project_name,
                "log_window": {"acc": dict(self._acc), "n": self._n_acc},
                "identifiers_sha256": self.metadata.identifiers_sha256,  # evaluate.py refuses other data
            }
            ckpt.save_checkpoint_atomic(state, path)
            self.summary.set(last_checkpoint=path)  # only once the file is complete
            ckpt.prune_checkpoints(self.checkpoint_dir, self.cfg.checkpoint_keep, protect=(path,))
            self.summary.write()
        D.barrier()
        return path

    def _epochs_completed(self) -> float:
        st = self.train_dataset.state_dict()
        loader_epochs = st.get("epoch", 0) + st.get("batch", 0) / max(1, self.batches_per_epoch)
        return round(loader_epochs * self.passes_per_epoch, 4)  # passes over the training groups

    # ------------------------------------------------------------------------------------------------
    def _grad_norm(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        grads = [p.grad.detach().float() for p in params if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))

    def train_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One optimizer update on one global batch. Returns the rank-summed raw metric sums (host floats: the
        step's only device-to-host transfer)."""
        cfg = self.cfg
        if self.carry is None:
            with torch.device(self.device):
                self.carry = self.model.initial_carry(batch)
        # slots that halted at the previous step take this batch's data: the examples trained on (pitfall 21)
        new_examples = self.carry.halted.sum().float()
        with D.autocast(self.device):
            self.carry, loss, metrics, outputs, _ = self.forward(carry=self.carry, batch=batch,
                                                                 return_keys=self._return_keys())
        (loss / cfg.global_batch_size).backward()

        sums = {k: v.detach().float() for k, v in metrics.items()}
        sums["loss"] = loss.detach().float()
        sums["new_examples"] = new_examples
        sums["_stop"] = torch.tensor(1.0 if self._stop_flag else 0.0, device=loss.device)  # any rank -> all stop
        sums = D.all_reduce_dict_(sums)
        # gradients summed over ranks (loss already / global batch) -> norms BEFORE clipping (pitfall 4)
        D.all_reduce_grads_(self.trainable)
        total_norm = self._grad_norm(self.trainable)
        sums["grad/total_norm"] = total_norm
        if self.encoder_params:
            sums["grad/encoder_norm"] = self._grad_norm(self.encoder_params)
            sums["grad/inner_norm"] = self._grad_norm(self.inner_params)
        # one transfer of every scalar; the finiteness check comes before anything is applied to the weights
        host = dict(zip(sums, torch.stack([v.float().reshape(()) for v in sums.values()]).tolist()))
        if not math.isfinite(host["loss"]):
            for p in self.trainable:
                p.grad = None
            raise NonFiniteLossError(f"non-finite loss at step {self.step + 1}: loss={host['loss']} "
                                     f"(sum over the global batch); weights of step {self.step} kept")

        frozen = self.step < cfg.freeze_decoder_steps
        if frozen:  # per parameter, whatever the optimizer count (pitfall 3)
            for p in self.inner_params:
                p.grad = None
        if cfg.grad_clip:
            clip_params = [p for p in self.trainable if p.grad is not None]
            norm = self._grad_norm(clip_params) if frozen else total_norm
            coef = torch.clamp(cfg.grad_clip / (norm + 1e-6), max=1.0)
            for p in clip_params:
                p.grad.mul_(coef.to(p.grad.dtype))

        step1 = self.step + 1
        for name, opt in self.optimizers.items():
            if name == "puzzle_emb" and frozen:
                for g in opt.param_groups:  # the puzzle embedding is part of the frozen decoder
                    for t in g["params"]:
                        t.grad = None
                continue
            for g in opt.param_groups:
                g["lr"] = lr_at_step(step1, base_lr=g["base_lr"], warmup_steps=cfg.lr_warmup_steps,
                                     total_steps=self.total_steps, min_ratio=cfg.lr_min_ratio)
            opt.step()
            opt.zero_grad(set_to_none=True)
        for p in self.trainable:
            p.grad = None
        if self.ema is not None:
            self.ema.update(self.model)
        self.step = step1
        self.examples_seen += int(host["new_examples"])
        host["train/decoder_frozen"] = float(frozen)
        self._last_outputs = outputs
        return host

    def _return_keys(self) -> tuple:
        """Outputs the loss head must return for ``model.diagnostics`` (ETRM: models.etrm.DIAGNOSTIC_KEYS)."""
        if self._diag_fn is None:
            return ()
        return tuple(getattr(self.model, "DIAGNOSTIC_KEYS", None) or _etrm_diag_keys())

    def _current_lr(self) -> float:
        return lr_at_step(max(self.step, 1), base_lr=self.cfg.lr, warmup_steps=self.cfg.lr_warmup_steps,
                          total_steps=self.total_steps, min_ratio=self.cfg.lr_min_ratio)

    # ------------------------------------------------------------------------------------------------
    def reduce_window(self, acc: dict[str, float], n_steps: int) -> dict[str, float]:
        """TRM metric semantics over the log window: loss terms / (global batch * steps);
        accuracies and steps / count (halted samples); norms averaged over steps."""
        out: dict[str, float] = {}
        count = acc.get("count", 0.0)
        for k, v in acc.items():
            if k in ("loss", "new_examples"):
                continue
            if k.startswith("grad/") or k.startswith("train/decoder"):
                out[k] = v / max(n_steps, 1)
            elif k == "count":
                out["train/count"] = v / max(n_steps, 1)
            elif k.endswith("loss") or k in self.head.extra_loss_weights:  # per-sample loss terms, e.g. kl
                out[f"train/{k}"] = v / (self.cfg.global_batch_size * max(n_steps, 1))
            else:
                out[f"train/{k}"] = v / max(count, 1.0)
        out["train/loss"] = acc.get("loss", 0.0) / (self.cfg.global_batch_size * max(n_steps, 1))
        out["train/lr"] = self._current_lr()
        out["train/examples_seen"] = float(self.examples_seen)
        out["train/epoch"] = self._epochs_completed()
        return out

    def evaluate(self) -> dict[str, float]:
        """The eval hook: evaluators.inference.evaluate with EMA weights when ema=true (pitfall 14: raises)."""
        from evaluators.inference import evaluate

        if self.test_loader is None:
            return {}
        model = self.ema.materialize(self.model) if self.ema is not None else ckpt.unwrap_model(self.model)
        head = build_loss_head(model, self.cfg.arch_for_model()[1])
        was_training = model.training
        try:
            raw = _call_with_supported(evaluate, head, self.test_loader, self.evaluators, device=self.device,
                                       autocast_dtype=D.autocast_dtype(self.device),
                                       halt_early=self.cfg.eval_halt_early,
                                       progress=self.cfg.progress and self.info.is_main,
                                       return_keys=tuple(self.cfg.eval_save_outputs),
                                       save_path=os.path.join(self.checkpoint_dir, "eval", f"step_{self.step}"))
        finally:
            model.train(was_training)
        raw = raw or {}
        return {(k if "/" in k else f"eval/{k}"): float(v) for k, v in raw.items()}

    def _eval_due(self) -> bool:
        cfg = self.cfg
        if self.test_loader is None:
            return False
        if cfg.eval_interval_steps:
            return self.step % cfg.eval_interval_steps == 0
        if cfg.eval_interval is None:
            return False
        # eval_interval / min_eval_interval count epochs = passes over the data; a loader epoch of
        # batches_per_epoch steps holds passes_per_epoch passes. Evaluate at the first step that completes a
        # multiple of eval_interval passes (integer arithmetic; with one pass per epoch: every
        # eval_interval * batches_per_epoch steps).
        per = self.batches_per_epoch * cfg.eval_interval
        crossed = (self.step * self.passes_per_epoch) // per > ((self.step - 1) * self.passes_per_epoch) // per
        return crossed and self.step * self.passes_per_epoch >= cfg.min_eval_interval * self.batches_per_epoch

    # ------------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to the end (or a stop) and return the summary dict; the run directory is released at exit."""
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> dict[str, Any]:
        cfg = self.cfg
        logger = RunLogger(enabled=self.info.is_main, project=self.project_name, run_name=self.run_name,
                           config=cfg.model_dump(mode="json"), mode=cfg.wandb.mode,
                           wandb_dir=cfg.wandb.dir or self.checkpoint_dir, total_steps=self.total_steps,
                           initial_step=self.step, entity=cfg.wandb.entity, save_code=cfg.wandb.save_code,
                           progress=cfg.progress, resume_id=self.wandb_id)
        self.wandb_id = logger.run_id
        self.logger = logger
        if self.info.is_main:
            os.makedirs(self.checkpoint_dir, exist_ok=True)
            self.summary.write()
            logger.log({"num_params": float(self.num_params)}, step=self.step)
            logger.print(f"[train] run {self.project_name}/{self.run_name}: {self.num_params:,} params, "
                         f"{self.total_steps} steps ({self.batches_per_epoch} batches/epoch), world size "
                         f"{self.info.world_size}, device {self.device}, compile={self.compiled}, "
                         f"checkpoints in {self.checkpoint_dir}")
        # Starting a DataLoader iteration draws its base seed from the global torch RNG: start it (fetch the
        # first batch) BEFORE restoring the checkpoint's RNG state, so a resumed run sees the same RNG stream.
        it = iter(self.train_loader)
        first = next(it) if self.step < self.total_steps else None
        if self._pending_rng is not None:
            ckpt.set_rng_state(self._pending_rng)  # the very last thing before the first step (exact resume)
            self._pending_rng = None

        stop_reason, exit_status, message = STOP_COMPLETED, EXIT_OK, None
        aborted = False  # a hard abort (second Ctrl-C): the in-memory state may be mid-step, never checkpoint it
        old_handlers = self._install_signal_handlers()
        try:
            while self.step < self.total_steps:
                item, first = (first, None) if first is not None else (next(it), None)
                _set_name, batch, _eff = item
                batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
                sums = self.train_step(batch)
                stop_requested = sums.pop("_stop") > 0
                for k, v in sums.items():
                    self._acc[k] = self._acc.get(k, 0.0) + v
                self._n_acc += 1
                logger.advance()

                logs: dict[str, float] = {}
                if self.step % cfg.log_interval == 0 or self.step == self.total_steps:
                    logs.update(self.reduce_window(self._acc, self._n_acc))
                    self._acc, self._n_acc = {}, 0
                if self._diag_fn is not None and self.step % cfg.diag_interval == 0:
                    with torch.no_grad():
                        d = self._diag_fn(self._last_outputs) or {}
                    logs.update({(k if "/" in k else f"diag/{k}"): float(v) for k, v in d.items()})
                if self._eval_due() and self.step != self.total_steps:
                    ev = self.evaluate()
                    logger.print_eval(self.step, ev)
                    logs.update(ev)
                    if cfg.checkpoint_every_eval:
                        self._pending_save = True
                if logs:
                    logger.log(logs, step=self.step)
                    if self.info.is_main:
                        self.summary.update_metrics(self.step, logs)
                        self.summary.set(steps=self.step, examples_seen=self.examples_seen,
                                         epochs_completed=self._epochs_completed())
                        self.summary.write()  # live progress for watchers (status stays "running")
                    if self.health is not None:
                        for w in self.health.update(self.step, logs):
                            logger.print(f"[health] step {self.step}: {w}")
                            if self.info.is_main:
                                self.summary.add_warning(f"step {self.step}: {w}")
                        # rank 0 decides (evaluator metrics exist only there), every rank follows
                        early = D.broadcast_object(self.health.stop_reason if cfg.early_stop else None)
                        if early:
                            stop_reason, exit_status = f"early_stop: {early}", EXIT_EARLY_STOP
                            break
                if (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0) or \
                        self._pending_save:
                    self._pending_save = False
                    if self.step != self.total_steps:
                        self.save_checkpoint()
                if stop_requested:
                    stop_reason, exit_status, message = STOP_INTERRUPTED, EXIT_INTERRUPTED, self._stop_flag or "stop"
                    break
            else:
                stop_reason = STOP_MAX_STEPS if self.capped else STOP_COMPLETED
        except NonFiniteLossError as e:
            stop_reason, exit_status, message = STOP_NONFINITE, EXIT_NONFINITE, str(e)
            logger.print(f"[train] STOP: {e}; the last good checkpoint is left intact")
        except KeyboardInterrupt:  # second Ctrl-C (or no handler): possibly mid-step, so no final checkpoint
            aborted = True
            last = ckpt.find_latest_checkpoint(self.checkpoint_dir)
            stop_reason, exit_status = STOP_INTERRUPTED, EXIT_INTERRUPTED
            message = (f"KeyboardInterrupt: aborted without a final checkpoint; resume=true continues from "
                       f"{os.path.basename(last) if last else 'the start (no checkpoint yet)'}")
            logger.print(f"[train] {message}")
        except BaseException as e:  # evaluator failure, data error, ...: record it, close W&B, re-raise
            self._fail(logger, e)
            self._restore_signal_handlers(old_handlers)
            raise
        finally:
            _shutdown_iter(it)

        # ---- end of run: final eval, final checkpoint, summary ----
        try:
            if exit_status in (EXIT_OK, EXIT_EARLY_STOP):
                if cfg.eval_at_end and self.test_loader is not None:
                    logs = self.evaluate()
                    logger.print_eval(self.step, logs)
                    logger.log(logs, step=self.step)
                    if self.info.is_main:
                        self.summary.update_metrics(self.step, logs)
            if exit_status != EXIT_NONFINITE and self.step > 0 and not aborted:
                self.save_checkpoint()
            result = None
            if self.info.is_main:
                self.summary.set(steps=self.step, examples_seen=self.examples_seen,
                                 epochs_completed=self._epochs_completed())
                result = self.summary.finish(stop_reason, exit_status, message)
                logger.summary({k: v for k, v in result["final"].items()})
                where = logger.run_dir or "(W&B disabled)"
                logger.print(f"[train] {stop_reason} after {self.step} steps. checkpoint dir: {self.checkpoint_dir}\n"
                             f"[train] summary: {self.summary.path}\n[train] W&B run ({logger.mode}): {where}")
            result = D.broadcast_object(result)
        except BaseException as e:
            if exit_status == EXIT_OK:
                self._fail(logger, e)
            raise
        finally:
            logger.close(exit_code=exit_status)
            self._restore_signal_handlers(old_handlers)
        return result

    def _fail(self, logger: RunLogger, e: BaseException) -> None:
        """Write summary.json with status failed (stop_reason "error") and close W&B with exit code 1."""
        if self.info.is_main:
            try:
                self.summary.set(steps=self.step, examples_seen=self.examples_seen)
                self.summary.finish(STOP_ERROR, EXIT_FAILED, f"{type(e).__name__}: {e}")
            except Exception:
                pass
        logger.close(exit_code=EXIT_FAILED)

    def _install_signal_handlers(self) -> dict:
        """SIGTERM and SIGINT (Ctrl-C; also what run_jobs sends) request a stop at the next step boundary: the
        step in progress completes, then the loop ends with a final checkpoint (exact resume). A second SIGINT
        aborts at once (KeyboardInterrupt, no final checkpoint)."""
        old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                old[sig] = signal.signal(sig, self._on_stop_signal)
            except ValueError:  # not the main thread: signals keep their default behaviour
                pass
        return old

    @staticmethod
    def _restore_signal_handlers(old: dict) -> None:
        for sig, handler in old.items():
            try:
                signal.signal(sig, handler)
            except (ValueError, TypeError):
                pass

    def _on_stop_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and self._stop_flag is not None:
            raise KeyboardInterrupt
        if self._stop_flag is None:
            self._stop_flag = name
            if self.info.is_main:  # os.write: safe inside a signal handler (print may be mid-write)
                os.write(2, f"\n[train] {name}: stopping after the current step with a checkpoint "
                            f"(Ctrl-C again aborts without one)\n".encode())


def _etrm_diag_keys() -> tuple:
    try:
        from models.etrm import DIAGNOSTIC_KEYS
    except ImportError:
        return ()
    return tuple(DIAGNOSTIC_KEYS)


def _shutdown_iter(it) -> None:
    """Stop the loader: close the generator (its finally shuts workers down) / the raw iterator."""
    close = getattr(it, "close", None)
    if close is not None:
        close()
        return
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------------
def train(cfg: Union[PretrainConfig, dict, Any], config_path: Optional[str] = None) -> dict[str, Any]:
    """Validate ``cfg`` (PretrainConfig, dict or Hydra DictConfig), train, and return the summary dict.

    The summary's ``exit_status`` is 0 (completed / max_steps), 2 (non-finite loss), 3 (early stop) or 130
    (interrupted); ``pretrain.py`` exits with it.
    """
    if not isinstance(cfg, PretrainConfig):
        cfg = config_from_dict(cfg) if isinstance(cfg, dict) else config_from_hydra(cfg)
    info = D.init_distributed(cfg.device)
    try:
        trainer = Trainer(cfg, info, config_path=config_path)
        return trainer.run()
    finally:
        D.shutdown_distributed(info)
