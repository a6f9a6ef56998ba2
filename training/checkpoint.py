"""Checkpoints: the full training state in one ``torch.save`` dict, written atomically.

Layout of ``<checkpoint_dir>/step_<N>.pt`` (``format = "trm-platform/1"``)::

    model       state_dict of the (uncompiled) ACT model, incl. the puzzle-embedding buffer
    ema         EMA shadow of the trainable parameters (or None)
    optimizers  {name: optimizer.state_dict()} -- "adam" (AdamATan2) and "puzzle_emb" (SignSGDSparse)
    step        optimizer updates done;  examples_seen
    per_rank    [per rank] {"rng": python / numpy / torch / cuda RNG states, "data_state": the train dataset's
                state_dict() (exact stream position), "carry": the ACT carry (CPU tensors)}, gathered to rank 0;
                ``rng`` and ``data_state`` are also stored top-level as lists indexed by rank
    config      the validated PretrainConfig (dict);  arch  the resolved architecture config
    metadata    the train split's DatasetMetadata (dict);  summary  RunSummary state

Files are written to a temp file in the same directory and ``os.replace``-d, so a crash never leaves a
truncated ``step_*.pt``; the previous checkpoint stays intact.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import random
import re
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from training.summary import atomic_write

FORMAT = "trm-platform/1"
_STEP_RE = re.compile(r"^step_(\d+)\.pt$")


class CheckpointError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------------
def tree_map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor inside dicts / lists / tuples / dataclasses (returns a new tree)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: tree_map_tensors(getattr(obj, f.name), fn)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, dict):
        return type(obj)((k, tree_map_tensors(v, fn)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(tree_map_tensors(v, fn) for v in obj)
    return obj


def unwrap_model(model: nn.Module) -> nn.Module:
    return getattr(model, "_orig_mod", model)


def get_rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# ---------------------------------------------------------------------------------------------------
def checkpoint_file(checkpoint_dir: str, step: int) -> str:
    return os.path.join(checkpoint_dir, f"step_{int(step)}.pt")


def list_checkpoints(checkpoint_dir: str) -> list[tuple[int, str]]:
    """``[(step, path)]`` of complete checkpoints, oldest first."""
    out = []
    for p in glob.glob(os.path.join(checkpoint_dir, "step_*.pt")):
        m = _STEP_RE.match(os.path.basename(p))
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def find_latest_checkpoint(checkpoint_dir: str) -> Optional[str]:
    ckpts = list_checkpoints(checkpoint_dir)
    return ckpts[-1][1] if ckpts else None


def save_checkpoint_atomic(state: dict[str, Any], path: str) -> None:
    atomic_write(path, lambda f: torch.save(state, f), binary=True)


def prune_checkpoints(checkpoint_dir: str, keep: Optional[int]) -> None:
    if keep is None:
        return
    ckpts = list_checkpoints(checkpoint_dir)
    for _, p in ckpts[:-keep] if keep > 0 else ckpts:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def load_checkpoint_file(path: str, map_location: Any = "cpu") -> dict[str, Any]:
    """Load one of our checkpoints (trusted pickle: it holds the ACT carry and RNG states)."""
    if os.path.isdir(path):
        latest = find_latest_checkpoint(path)
        if latest is None:
            raise CheckpointError(f"{path}: no step_*.pt checkpoint in this directory")
        path = latest
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: checkpoint file not found")
    state = torch.load(path, map_location=map_location, weights_only=False)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: not a trm-platform checkpoint (format={state.get('format') if isinstance(state, dict) else None!r}); "
            "checkpoints of the original TRM code load through models.compat")
    state["_path"] = path
    return state


# ---------------------------------------------------------------------------------------------------
# Architecture compatibility (pitfall 10)
# ---------------------------------------------------------------------------------------------------
# Keys that change the computation / parameter shapes; a load across different values is refused.
_ARCH_KEYS_IGNORED = {"halt_exploration_prob", "forward_dtype", "loss", "halt_early_in_eval"}


def check_arch_compatible(saved: dict[str, Any], current: dict[str, Any], *, source: str = "checkpoint") -> None:
    """Refuse loading weights trained with another architecture config (names each differing key)."""
    try:  # the models package's check (structural fields refused, behavioural ones warned)
        from models.compat import ArchMismatchError, check_arch_compat
    except ImportError:
        check_arch_compat = None
    if check_arch_compat is not None and saved.get("name") == current.get("name"):
        try:
            check_arch_compat(saved, current, context="checkpoint")
        except ArchMismatchError as e:
            raise CheckpointError(f"{source}: {e}") from None
        return
    keys = (set(saved) | set(current)) - _ARCH_KEYS_IGNORED
    diff = {k: (saved.get(k), current.get(k)) for k in sorted(keys) if saved.get(k) != current.get(k)}
    if diff:
        lines = ", ".join(f"arch.{k}: checkpoint={a!r} vs config={b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(f"{source}: incompatible architecture ({lines}); refusing to load")


def load_weights(model: nn.Module, path: str, *, arch: Optional[dict[str, Any]] = None,
                 use_ema: bool = False, strict: bool = True) -> dict[str, Any]:
    """Weights-only initialisation (``load_checkpoint=…`` for fine-tuning). Returns the checkpoint dict."""
    state = load_checkpoint_file(path)
    if arch is not None:
        check_arch_compatible(state["arch"], arch, source=state["_path"])
    sd = dict(state["model"])
    if use_ema and state.get("ema"):
        sd.update(state["ema"]["shadow"])
    missing, unexpected = unwrap_model(model).load_state_dict(sd, strict=False)
    if strict and (missing or unexpected):
        raise CheckpointError(f"{state['_path']}: state_dict mismatch; missing={missing[:8]} "
                              f"unexpected={unexpected[:8]}")
    return state


def load_model_for_inference(path: str, use_ema: bool = True, device: Any = "cpu",
                             batch_size: Optional[int] = None):
    """Rebuild the model of a checkpoint (file or run dir) for evaluation -> ``(model, cfg, metadata)``.

    ``cfg`` is the run's PretrainConfig; ``metadata`` its train-split DatasetMetadata. With ``use_ema`` and
    an EMA present, the EMA weights are loaded (the puzzle-embedding buffer is always the live one).
    """
    from dataset.common import DatasetMetadata
    from training.config import PretrainConfig
    from training.loop import build_act_model

    state = load_checkpoint_file(path)
    cfg = PretrainConfig.model_validate(state["config"])
    metadata = DatasetMetadata.model_validate(state["metadata"])
    bs = batch_size or int(state.get("local_batch_size") or cfg.global_batch_size)
    # the checkpoint holds every weight: do not re-load init-time sources (they may no longer exist)
    build_cfg = cfg.model_copy(update={"load_pretrained_decoder": None, "load_checkpoint": None})
    model = build_act_model(build_cfg, metadata, batch_size=bs)
    sd = dict(state["model"])
    if use_ema and state.get("ema"):
        sd.update({k: v for k, v in state["ema"]["shadow"].items()})
    model.load_state_dict(sd, strict=True)
    model.to(device).eval()
    return model, cfg, metadata
