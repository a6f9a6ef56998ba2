"""Construction: a validated config + the data's metadata -> model, loss head, optimizers; a checkpoint -> model.

Used by the training loop (``training.loop.Trainer``), ``evaluate.py``, the benchmarks and the science pipeline,
so that a run and its evaluation build the same model the same way.

    model = build_act_model(cfg, metadata, batch_size)     # TRM / HRM / transformer, or ETRM when cfg.encoder
    head = build_loss_head(model, cfg.loss_type)
    optimizers = build_optimizers(cfg, model, world_size)   # {"adam": AdamATan2, "puzzle_emb": SignSGDSparse}
    model, cfg, metadata = load_model_for_inference("checkpoints/proj/run")
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from core.io import read_omegaconf_yaml
from dataset.loader import PuzzleDatasetConfig, create_dataloader
from dataset.metadata import DatasetMetadata
from dataset.rule_labels import rule_label_table
from encoders import build_encoder, parse_encoder_config
from evaluators import build_evaluators
from models import ArchConfig, build_model, compat, parse_arch_config
from models import build_loss_head as build_model_loss_head
from models.etrm import ETRM
from models.losses import ACTLossHead
from models.sparse_embedding import SignSGDSparse, SparsePuzzleEmbedding
from training.checkpoint import CheckpointError, check_arch_compatible, load_checkpoint_file
from training.config import ConfigError, PretrainConfig
from training.optim import AdamATan2


# ---------------------------------------------------------------------------------------------------
# Architecture
# ---------------------------------------------------------------------------------------------------
def check_data_matches_arch(arch: ArchConfig, metadata: DatasetMetadata, data_dir: str) -> None:
    """The optional ``arch.vocab_size`` / ``arch.seq_len`` statements must match the data (the one check, used
    wherever a model meets a dataset)."""
    for key in ("vocab_size", "seq_len"):
        want, have = getattr(arch, key), getattr(metadata, key)
        if want is not None and int(want) != int(have):
            raise ConfigError(
                f"{data_dir}: data {key}={have} but the model config has arch.{key}={want}; "
                f"rebuild the data or change the architecture"
            )


def check_split_matches(metadata: DatasetMetadata, other: DatasetMetadata, where: str, what: str) -> None:
    """Two datasets the same model reads (train vs test split, checkpoint data vs evaluation data) must agree on
    ``vocab_size`` and ``seq_len``: ``other`` (described by ``where``) against the reference ``metadata``
    (described by ``what``)."""
    for key in ("vocab_size", "seq_len"):
        if getattr(other, key) != getattr(metadata, key):
            raise ConfigError(f"{where} {key}={getattr(other, key)} differs from {what} ({getattr(metadata, key)})")


def resolve_arch(cfg: PretrainConfig) -> dict[str, Any]:
    """The architecture config with every default filled in (stored in checkpoints, compared on load)."""
    return cfg.arch.model_dump(mode="json")


def etrm_core_arch(arch: ArchConfig, extra_loss_weights: Optional[dict[str, float]] = None) -> ArchConfig:
    """The TRM core's arch config for ETRM: no learned puzzle embedding (puzzle_emb_ndim=0), the prefix
    positions (puzzle_emb_len, default 16) are fed by the encoder. ``extra_loss_weights`` (the ETRM's per-sample
    terms, e.g. ``{"kl": beta}``, pitfall 6, or ``{"rule_readout": w}``) go to the loss section, so the loss head
    adds ``w * outputs[k]`` per sample."""
    d = parse_arch_config(arch).model_dump()
    if extra_loss_weights:
        d["loss"]["extra_loss_weights"] = {
            **d["loss"].get("extra_loss_weights", {}),
            **{k: float(v) for k, v in extra_loss_weights.items()},
        }
    if int(d.get("puzzle_emb_len") or 0) <= 0:
        d["puzzle_emb_len"] = max(1, -(-int(d.get("puzzle_emb_ndim") or 0) // int(d["hidden_size"])))
    d["puzzle_emb_ndim"] = 0
    return parse_arch_config(d)


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------
@dataclass
class RunData:
    """A run's data: the training stream, its step accounting, and the evaluation loader + evaluators (if any)."""

    train_loader: Any
    metadata: DatasetMetadata
    batches_per_epoch: int  # loader batches (= optimizer steps) per loader epoch
    passes_per_epoch: int  # passes over the training groups per loader epoch
    total_steps: int
    capped: bool  # max_steps cut the run short of `epochs`
    test_loader: Any = None
    test_metadata: Optional[DatasetMetadata] = None
    evaluators: list = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # schedule warnings (summary.json's warnings)

    @property
    def train_dataset(self) -> Any:
        return self.train_loader.dataset


def schedule_warnings(cfg: PretrainConfig, epoch_steps: int, total_steps: int) -> list[str]:
    """What in the step schedule is likely not what was meant: ``max_steps`` that another limit (``epochs``)
    ends first, and a run that ends inside its lr warmup (the lr never reaches ``lr``)."""
    out = []
    if cfg.max_steps is not None and cfg.max_steps > epoch_steps:
        out.append(
            f"max_steps={cfg.max_steps} is not reached: epochs={cfg.epochs} ends the run first, at step "
            f"{epoch_steps} (raise epochs= to train longer)"
        )
    if total_steps <= cfg.lr_warmup_steps:
        out.append(
            f"the run ends inside its lr warmup ({total_steps} steps <= lr_warmup_steps="
            f"{cfg.lr_warmup_steps}): the lr never reaches lr={cfg.lr:g}; lower lr_warmup_steps= or train "
            "longer"
        )
    return out


def _step_plan(cfg: PretrainConfig, train_loader: Any, metadata: Any, batches: int, say: Any) -> RunData:
    """The run's steps: ``epochs`` passes over the training groups, capped by ``max_steps``."""
    dataset = train_loader.dataset
    if batches <= 0:
        raise ConfigError(f"{cfg.data_paths}: fewer training examples than global_batch_size={cfg.global_batch_size}")
    passes = int(dataset.passes_per_epoch(0))
    total = max(1, math.ceil(cfg.epochs * batches / passes))
    if passes > 1:
        say(
            f"[train] one pass over the {cfg.max_train_groups or 'selected'} training groups is smaller than "
            f"global_batch_size={cfg.global_batch_size}: each loader epoch packs {passes} passes ({batches} "
            f"batch(es)); {cfg.epochs} epochs = {total} steps"
        )
    capped = cfg.max_steps is not None and cfg.max_steps < total
    data = RunData(train_loader, metadata, batches, passes, int(cfg.max_steps) if capped else total, capped)
    for w in schedule_warnings(cfg, total, data.total_steps):
        say(f"[train] WARNING: {w}")
        data.warnings.append(w)
    return data


def build_run_data(cfg: PretrainConfig, info: Any, eval_output_dir: str, say: Any = print) -> RunData:
    """Loaders and evaluators of a run (``info``: the rank / world size). Step accounting comes from the real
    number of samples (pitfall 7): one global batch per step; when the active groups are smaller than one global
    batch the loader packs several passes into one of its epochs, and ``epochs`` keeps meaning passes."""
    encoder_mode = cfg.encoder is not None
    common = dict(
        global_batch_size=cfg.global_batch_size,
        seed=cfg.seed,
        rank=info.rank,
        world_size=info.world_size,
        encoder_mode=encoder_mode,
        max_demos=cfg.max_demos,
        num_workers=cfg.num_workers,
    )
    train_loader, metadata = create_dataloader(
        PuzzleDatasetConfig(
            data_paths=cfg.data_paths,
            test_mode=False,
            max_groups=cfg.max_train_groups,
            group_pattern=cfg.train_group_pattern,
            translate_augment=cfg.translate_augment,
            **common,
        ),
        "train",
    )
    if encoder_mode and metadata.test_demos_in_train and not cfg.allow_test_demos_in_train:
        raise ConfigError(
            f"{cfg.data_paths}: metadata test_demos_in_train=true (a --mode trm build): the test puzzles' demo "
            f"pairs are in train/, so an encoder model would not be evaluated few-shot. Build the data with "
            f"--mode etrm, or pass allow_test_demos_in_train=true to accept it."
        )
    dataset = train_loader.dataset
    batches = int(dataset.num_batches(0))
    if cfg.max_steps == 0:  # the initial weights only (a from-scratch start): no batch is drawn, none is needed
        data = RunData(train_loader, metadata, batches, 1, 0, batches > 0)
    else:
        data = _step_plan(cfg, train_loader, metadata, batches, say)
    if eval_needed(cfg):
        data.test_loader, data.test_metadata = create_dataloader(
            PuzzleDatasetConfig(data_paths=cfg.test_paths, test_mode=True, max_groups=cfg.max_eval_groups, **common),
            "test",
        )
        check_split_matches(metadata, data.test_metadata, f"{cfg.test_paths[0]}: test split", "the train split")
        if cfg.evaluators:  # construction failures raise (pitfall 14)
            data.evaluators = build_evaluators(
                [{"name": e.name, **e.kwargs} for e in cfg.evaluators],
                data_path=cfg.test_paths[0] if len(cfg.test_paths) == 1 else cfg.test_paths,
                metadata=data.test_metadata,
                output_dir=eval_output_dir,
            )
    return data


def stop_iterator(it: Any) -> None:
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


def eval_needed(cfg: PretrainConfig) -> bool:
    """Evaluate when evaluators are configured, or when an eval is scheduled and every test path has a test
    split."""
    if cfg.evaluators:
        return True
    if cfg.eval_interval is None and cfg.eval_interval_steps is None and not cfg.eval_at_end:
        return False
    return all(os.path.isfile(os.path.join(p, "test", "dataset.json")) for p in cfg.test_paths)


def build_rule_table(cfg: PretrainConfig, device: Any, say: Any = print) -> Optional[torch.Tensor]:
    """The rule-readout labels per puzzle identifier of the training data (``rule_labels``;
    dataset.rule_labels.rule_label_table) on ``device``, or None without the readout."""
    if not cfg.rule_labels:
        return None
    table = rule_label_table(cfg.data_paths[0], cfg.rule_labels)
    say(
        f"[train] rule readout: labels of {int((table[:, 0] >= 0).sum())} training identifiers from "
        f"{cfg.rule_labels} (readout weight {cfg.encoder.rule_readout}, oracle context {cfg.encoder.oracle_context})"
    )
    return torch.as_tensor(table, device=device)


def with_rule_targets(batch: Dict[str, torch.Tensor], table: Optional[torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``batch`` plus ``rule_targets`` (the labels of each example's puzzle identifier) when ``table`` is given."""
    if table is None:
        return batch
    return {**batch, "rule_targets": table[batch["puzzle_identifiers"].long()]}


# ---------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------
def build_act_model(cfg: PretrainConfig, metadata: DatasetMetadata, batch_size: int) -> nn.Module:
    """The ACT model of ``cfg`` for data described by ``metadata`` (local batch ``batch_size``)."""
    check_data_matches_arch(cfg.arch, metadata, cfg.data_paths[0])
    if cfg.encoder is not None:
        return build_etrm_model(cfg, metadata, batch_size=batch_size)
    return build_model(
        cfg.arch,
        vocab_size=metadata.vocab_size,
        seq_len=metadata.seq_len,
        num_puzzle_identifiers=metadata.num_puzzle_identifiers,
        batch_size=batch_size,
    )


def build_etrm_model(
    cfg: PretrainConfig, metadata: DatasetMetadata, *, batch_size: Optional[int] = None, verbose: bool = True
) -> ETRM:
    """ETRM from a validated training config (its ``arch``, ``encoder``, ``encoder_cache``,
    ``load_pretrained_decoder``, ``global_batch_size``) and the train split's metadata."""
    enc_cfg = cfg.encoder
    if not enc_cfg:
        raise ConfigError("build_etrm_model: cfg.encoder is empty (choose one with encoder=<name>)")
    arch = parse_arch_config(cfg.arch).for_encoder(parse_encoder_config(enc_cfg).hidden_size)
    bs = batch_size or cfg.global_batch_size
    core = build_model(
        etrm_core_arch(arch),
        vocab_size=metadata.vocab_size,
        seq_len=metadata.seq_len,
        num_puzzle_identifiers=metadata.num_puzzle_identifiers,
        batch_size=bs,
    )
    encoder = build_encoder(
        enc_cfg,
        hidden_size=core.hidden_size,
        vocab_size=metadata.vocab_size,
        seq_len=metadata.seq_len,
        puzzle_emb_len=core.puzzle_emb_len,
        verbose=verbose,
    )
    model = ETRM(core, encoder, encoder_cache=cfg.encoder_cache)
    if model.extra_loss_weights:  # the config carries the KL / rule-readout weights in its loss section
        model.config = core.config = etrm_core_arch(arch, model.extra_loss_weights)
    path = cfg.load_pretrained_decoder
    if path:
        load_pretrained_decoder(model, path, arch=etrm_core_arch(arch).model_dump(exclude={"loss"}), verbose=verbose)
    return model


def build_loss_head(model: nn.Module, loss_type: Optional[str] = None) -> ACTLossHead:
    """ACTLossHead configured from the model's ``arch.loss`` section (``loss_type`` overrides it)."""
    overrides = {"loss_type": loss_type} if loss_type else {}
    if getattr(getattr(model, "config", None), "loss", None) is not None:
        return build_model_loss_head(model, None, **overrides)
    return ACTLossHead(model, **overrides)


# ---------------------------------------------------------------------------------------------------
# Optimizers
# ---------------------------------------------------------------------------------------------------
def is_encoder_param(name: str) -> bool:
    return name.startswith("encoder.") or ".encoder." in f".{name}"


def split_params(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """(every trainable parameter, the encoder's, the rest): the loop's gradient-norm groups and the optimizer's."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return (
        [p for _, p in named],
        [p for n, p in named if is_encoder_param(n)],
        [p for n, p in named if not is_encoder_param(n)],
    )


def sparse_embedding(model: nn.Module) -> Optional[SparsePuzzleEmbedding]:
    """The model's puzzle embedding, if any."""
    return next((m for m in model.modules() if isinstance(m, SparsePuzzleEmbedding)), None)


def build_optimizers(cfg: PretrainConfig, model: nn.Module, world_size: int) -> dict[str, torch.optim.Optimizer]:
    """``adam``: AdamATan2 over every trainable parameter (encoder params in their own group when
    ``encoder_lr`` is set); ``puzzle_emb``: SignSGDSparse over the puzzle-embedding buffer (if any). Every group
    records its ``base_lr`` (the schedule scales it)."""
    _, enc, rest = split_params(model)
    groups: list[dict[str, Any]] = []
    if rest:
        groups.append({"params": rest, "lr": cfg.lr, "base_lr": cfg.lr, "name": "inner"})
    if enc:
        base = cfg.encoder_lr if cfg.encoder_lr is not None else cfg.lr
        groups.append({"params": enc, "lr": base, "base_lr": base, "name": "encoder"})
    opts: dict[str, torch.optim.Optimizer] = {}
    if groups:
        opts["adam"] = AdamATan2(
            groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay, impl=cfg.optimizer_impl
        )
    emb = sparse_embedding(model)
    if emb is not None:
        opts["puzzle_emb"] = SignSGDSparse(
            list(emb.buffers()), lr=cfg.puzzle_emb_lr, weight_decay=cfg.puzzle_emb_weight_decay, world_size=world_size
        )
        for g in opts["puzzle_emb"].param_groups:
            g["base_lr"] = cfg.puzzle_emb_lr
    return opts


# ---------------------------------------------------------------------------------------------------
# Checkpoints -> models
# ---------------------------------------------------------------------------------------------------
def load_model_for_inference(
    path: "str | dict[str, Any]", use_ema: bool = True, device: Any = "cpu", batch_size: Optional[int] = None
) -> Tuple[nn.Module, PretrainConfig, DatasetMetadata]:
    """Rebuild the model of a checkpoint (file or run dir, or a state already loaded by
    ``training.checkpoint.load_checkpoint_file``) for evaluation -> ``(model, cfg, metadata)``.

    ``cfg`` is the run's PretrainConfig; ``metadata`` its train-split DatasetMetadata. With ``use_ema`` and
    an EMA present, the EMA weights are loaded (the puzzle-embedding buffer is always the live one).
    """
    state = path if isinstance(path, dict) else load_checkpoint_file(path)
    cfg = PretrainConfig.model_validate(state["config"])
    metadata = DatasetMetadata.model_validate(state["metadata"])
    bs = batch_size or int(state.get("local_batch_size") or cfg.global_batch_size)
    # the checkpoint holds every weight: do not re-load init-time sources (they may no longer exist)
    build_cfg = cfg.model_copy(update={"load_pretrained_decoder": None, "load_checkpoint": None})
    model = build_act_model(build_cfg, metadata, batch_size=bs)
    sd = dict(state["model"])
    if use_ema and state.get("ema"):
        sd.update(state["ema"]["shadow"])
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:  # torch's multi-line "Error(s) in loading state_dict": the file is inconsistent
        lines = [ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()]
        raise CheckpointError(
            f"{state.get('_path', 'checkpoint')}: its weights do not fit the architecture its own "
            f"config describes ({'; '.join(lines[:3])}{'; ...' if len(lines) > 3 else ''})"
        ) from None
    model.to(device).eval()
    return model, cfg, metadata


_DECODER_IGNORED_ARCH_KEYS = (
    "puzzle_emb_ndim",
    "halt_exploration_prob",
    "forward_dtype",
    "loss",
    "halt_max_steps",
    "halt_early_in_eval",
    "no_ACT_continue",
)


def _load_original_layout(path: str) -> Tuple[Dict[str, torch.Tensor], Optional[Dict[str, Any]]]:
    """State dict (keys ``inner.*``) and our-format arch of a checkpoint written by the original TRM code; the
    arch comes from ``all_config.yaml`` beside the file (None when absent)."""
    sd = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: neither a trm-platform checkpoint nor an original TRM state dict")
    sd = compat.normalise_original_keys(sd)
    cfg_path = os.path.join(os.path.dirname(os.path.abspath(path)), "all_config.yaml")
    arch = None
    if os.path.isfile(cfg_path):
        raw = read_omegaconf_yaml(cfg_path, CheckpointError)
        if isinstance(raw, dict) and isinstance(raw.get("arch"), dict):
            arch = compat.original_arch_to_ours(raw["arch"])
    if arch is None:
        warnings.warn(
            f"{path}: no all_config.yaml beside the original TRM checkpoint; the architecture cannot be "
            f"checked (pitfall 10: e.g. L_cycles must match the training run)",
            stacklevel=3,
        )
    return sd, arch


def _decoder_state(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any], str]:
    """(state dict, stored arch, source) of a TRM checkpoint: ours (EMA weights when present) or the original
    layout."""
    try:
        state = load_checkpoint_file(path)
    except CheckpointError as e:
        if "not a trm-platform checkpoint" not in str(e):
            raise
        sd, saved_arch = _load_original_layout(path)
        return sd, saved_arch or {}, path
    sd = dict(state["model"])
    if state.get("ema"):
        sd.update(state["ema"].get("shadow", {}))
    return sd, state.get("arch") or {}, state["_path"]


def load_pretrained_decoder(
    model: ETRM, path: str, *, arch: Optional[Dict[str, Any]] = None, verbose: bool = True
) -> Dict[str, Any]:
    """Initialise ``model.inner`` from a TRM checkpoint: ours (training.checkpoint format, EMA weights when
    present) or the original TRM layout (``models.compat`` key normalisation; arch from ``all_config.yaml``).
    The architecture must match (pitfall 10: structural keys such as L_cycles are refused when different) except
    for the puzzle embedding (dropped: ETRM's prefix comes from the encoder) and halting settings."""
    sd, saved_arch, source = _decoder_state(path)
    if arch is None:
        arch = model.config.model_dump()
    if saved_arch:

        def _cmp(d: Dict[str, Any]) -> Dict[str, Any]:
            return {k: v for k, v in dict(d).items() if k not in _DECODER_IGNORED_ARCH_KEYS}

        check_arch_compatible(_cmp(saved_arch), _cmp(arch), source=f"pretrained decoder {source}")
    inner_sd = {
        k[len("inner.") :]: v for k, v in sd.items() if k.startswith("inner.") and not k.startswith("inner.puzzle_emb")
    }
    if not inner_sd:
        raise CheckpointError(f"{source}: no 'inner.*' weights found in the checkpoint")
    own = model.inner.state_dict()
    bad = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in inner_sd.items()
        if k in own and tuple(v.shape) != tuple(own[k].shape)
    ]
    missing = [k for k in own if k not in inner_sd and not k.startswith("puzzle_emb")]
    unexpected = [k for k in inner_sd if k not in own]
    if bad or missing or unexpected:
        raise CheckpointError(
            f"{source}: decoder weights do not match the ETRM core; shape mismatches={bad[:4]} "
            f"missing={missing[:8]} unexpected={unexpected[:8]}"
        )
    model.inner.load_state_dict(inner_sd, strict=False)
    if verbose:
        print(f"[etrm] decoder initialised from {source} ({len(inner_sd)} tensors; puzzle embedding dropped)")
    return {"source": source, "tensors": len(inner_sd)}
