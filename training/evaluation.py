"""The body of ``evaluate.py``: evaluate one checkpoint on a built dataset (the entry point composes the Hydra
config, calls :func:`run` and maps errors to one line).

Why in training/: evaluating a *checkpoint* needs what training owns (its file format, the model rebuilt from the
stored ``PretrainConfig``, the loss head, the rule-label targets, the run's W&B identity, the process group), and
evaluators/ (the inference path and scoring, ``evaluators.inference.evaluate``) sits below training/; both this and
the training loop's eval hook call ``evaluators.inference.evaluate``.

:class:`EvaluateConfig` is the validated config (its field defaults are the only defaults; evaluate.py registers
them with Hydra). :func:`run` loads the checkpoint (ours, or an original TRM state dict with ``arch``), builds the
evaluation loader, picks the scoring from the data's kind (:func:`uses_arc_voting`), evaluates and writes
``metrics.json`` (and, through the ARC evaluator, ``submission.json`` / ``predictions.json`` / ``pictures/``) to
``output_dir``. See docs/evaluation.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import time
from typing import Any, Optional

import torch

import models
from core.io import atomic_write, read_json, read_omegaconf_yaml, write_json_atomic
from core.nn import compile_module
from dataset.augment import Augmentation
from dataset.metadata import load_metadata
from dataset.rule_labels import rule_label_table
from evaluators import ARCEvaluator
from evaluators.data import build_eval_loader
from evaluators.inference import as_logged, evaluate
from evaluators.ttt import TestTimeTraining
from models.compat import load_original_trm_checkpoint
from models.ttt import TTTSettings
from training.build import build_loss_head, check_split_matches, load_model_for_inference, with_rule_targets
from training.checkpoint import CheckpointError, load_checkpoint_file
from training.distributed import process_group
from training.evaluate_config import EvaluateConfig, EvaluateError
from training.logging import resolve_wandb_mode, wandb_identity

log = logging.getLogger("evaluate")


def run(cfg: EvaluateConfig) -> dict[str, float]:
    """Evaluate ``cfg.checkpoint`` on ``cfg.data_path``; returns the metrics (rank 0; {} elsewhere)."""
    with contextlib.ExitStack() as stack:
        dist_info = stack.enter_context(process_group(cfg.device))
        device = dist_info.device
        meta = load_metadata(os.path.join(cfg.data_path, "test"))
        state = None if cfg.original_trm_checkpoint else _load_checkpoint_state(cfg.checkpoint)
        gbs = _global_batch_size(cfg, state, dist_info.world_size)
        head, encoder_mode, max_demos, info = load_model(cfg, meta, gbs // dist_info.world_size, device, state)
        del state  # the model holds the weights now
        rule_table = _oracle_labels(cfg, info)
        _configure_latent_search(head, cfg)
        ttt = _test_time_training(cfg, head)
        model = compile_module(head) if cfg.compile else head
        loader, meta = build_eval_loader(
            cfg.data_path,
            gbs,
            num_augmentations=_num_augmentations(cfg),
            rank=dist_info.rank,
            world_size=dist_info.world_size,
            max_groups=cfg.max_groups,
            encoder_mode=encoder_mode or ttt is not None,
            max_demos=max_demos,
            num_workers=cfg.num_workers,
            # the run's seed: max_groups=N picks the groups of its max_eval_groups=N
            seed=int(info.get("seed", 0)),
            whole_groups=ttt is not None and ttt.settings.fits_weights,  # one fit per puzzle: all its copies
        )
        if rule_table is not None:
            loader = _LabelledLoader(loader, rule_table)
        out_dir = cfg.output_dir or default_output_dir(cfg.checkpoint)
        if dist_info.is_main:
            created = _ensure_writable(out_dir)  # before the evaluation, not after it
            stack.callback(_remove_if_empty, created)  # a failed call leaves no empty output dirs behind
        arc = _arc_scoring(cfg, meta, say=dist_info.is_main)
        evaluators = (
            [
                ARCEvaluator(
                    cfg.data_path,
                    meta,
                    out_dir,
                    pass_ks=cfg.pass_ks,
                    strict_decode=cfg.strict_decode,
                    rank_malformed=cfg.rank_malformed,
                    num_pictures=cfg.num_pictures,
                    submission_k=cfg.submission_k,
                    seed=cfg.seed,
                )
            ]
            if arc
            else []
        )
        run_wandb = _start_wandb(cfg, info, out_dir) if dist_info.is_main else None
        t0 = time.time()
        metrics = evaluate(
            model,
            loader,
            evaluators,
            device=device,
            autocast_dtype=cfg.autocast,
            halt_early=cfg.halt_early,
            progress=cfg.progress and dist_info.is_main,
            save_path=out_dir,
            ttt=ttt,
        )
        if not dist_info.is_main:
            return {}
        if ttt is not None:  # per fitted puzzle copy: demo fit before / after, steps, seconds
            write_json_atomic(
                os.path.join(out_dir, "ttt.json"),
                {"settings": dataclasses.asdict(ttt.settings), "puzzles": ttt.records},
            )
        metrics["eval/wall_seconds"] = time.time() - t0
        config = cfg.model_dump()
        if not cfg.original_trm_checkpoint:  # unused: the checkpoint's arch is in checkpoint_info
            config["arch"] = None
        record = {
            "metrics": metrics,
            "config": config,
            "checkpoint_info": info,
            "checkpoint_file": info.get("file"),
            "checkpoint_step": info.get("step"),
            "world_size": dist_info.world_size,
            "device": str(device),
        }
        atomic_write(os.path.join(out_dir, "metrics.json"), lambda f: json.dump(record, f, indent=1))
        if run_wandb is not None:  # the training loop's eval keys, at the checkpoint's step
            run_wandb.log(as_logged(metrics), step=int(info.get("step") or 0))
            run_wandb.finish()
        return metrics


def _test_time_training(cfg: EvaluateConfig, head: Any) -> Optional[TestTimeTraining]:
    """The ``ttt_*`` options as the evaluation's test-time training (None when ``ttt_steps`` is 0)."""
    if cfg.ttt_steps == 0:
        return None
    if cfg.ttt_pool and _num_augmentations(cfg) == 1:  # a pool of one copy would be the per-copy fit
        raise EvaluateError("ttt_pool=true: only the original copy is evaluated; pool copies with ttt_augment=K >= 1")
    try:
        settings = TTTSettings(
            steps=cfg.ttt_steps,
            lr=cfg.ttt_lr,
            weight_lr=cfg.ttt_weight_lr,
            params=cfg.ttt_params,
            pool=cfg.ttt_pool,
        )
        return TestTimeTraining(head, settings, pool_of=base_puzzle_index(cfg.data_path) if cfg.ttt_pool else None)
    except ValueError as e:
        raise EvaluateError(f"ttt_params={cfg.ttt_params}: {e}") from None


def base_puzzle_index(data_path: str) -> list[int]:
    """Per puzzle identifier of a built dataset (``identifiers.json``), the index of its original puzzle: the
    augmented copies of one puzzle (``name|||t<k>|||<colours>``) share it."""
    path = os.path.join(data_path, "identifiers.json")
    names = read_json(path)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise EvaluateError(f"{path}: expected a list of puzzle names (ttt_pool groups the copies by name)")
    index: dict[str, int] = {}
    out = []
    for i, name in enumerate(names):
        try:
            base = Augmentation.parse_name(name)[0]
        except ValueError as e:
            raise EvaluateError(f"{path}[{i}]: {e}") from None
        out.append(index.setdefault(base, len(index)))
    return out


def _num_augmentations(cfg: EvaluateConfig) -> Optional[int]:
    """The augmented copies evaluated: ``num_augmentations``, or ``ttt_augment`` + 1 (the two must agree)."""
    if cfg.ttt_augment is None:
        return cfg.num_augmentations
    if cfg.ttt_steps == 0:
        raise EvaluateError(
            f"ttt_augment={cfg.ttt_augment} applies with test-time training (ttt_steps > 0); "
            "num_augmentations=N picks the copies of a plain evaluation"
        )
    if cfg.num_augmentations is not None and cfg.num_augmentations != cfg.ttt_augment + 1:
        raise EvaluateError(
            f"ttt_augment={cfg.ttt_augment} evaluates the original + {cfg.ttt_augment} copies, but "
            f"num_augmentations={cfg.num_augmentations}; set one of them"
        )
    return cfg.ttt_augment + 1


def _global_batch_size(cfg: EvaluateConfig, state: Optional[dict[str, Any]], world_size: int) -> int:
    """``batch_size``, else the checkpoint's training batch size (original TRM checkpoints: 256); divisible by the
    world size."""
    if cfg.batch_size is not None:
        gbs = cfg.batch_size
    elif state is None:
        gbs = 256
    else:
        gbs = int(state["config"]["global_batch_size"])
    if gbs % world_size:
        raise EvaluateError(f"batch_size={gbs} must be divisible by the world size {world_size}")
    return gbs


def _arc_scoring(cfg: EvaluateConfig, meta: Any, *, say: bool) -> bool:
    """Whether ARC voting pass@K runs: the data's kind (:func:`uses_arc_voting`) unless ``arc_voting`` says
    otherwise (true on data that is not ARC-format is refused)."""
    arc = uses_arc_voting(cfg.data_path, meta)
    if cfg.arc_voting is not None:
        if cfg.arc_voting and not arc:
            raise EvaluateError(
                f"arc_voting=true: {cfg.data_path} is not ARC-format data (kind "
                f"{getattr(meta, 'kind', None)!r}; no test_puzzles.json / identifiers.json)"
            )
        arc = cfg.arc_voting
    if say:
        why = "arc_voting=false" if cfg.arc_voting is False else "not ARC-format data"
        log.info(
            "data_path=%s (kind %s): %s",
            cfg.data_path,
            meta.kind or "unset",
            "ARC voting pass@K + per-copy accuracy"
            if arc
            else f"per-copy exact / token accuracy and halting steps (no ARC voting: {why})",
        )
    return arc


def load_model(
    cfg: EvaluateConfig, metadata: Any, batch_size: int, device: Any, state: Optional[dict[str, Any]] = None
):
    """-> (loss head on ``device`` in eval mode, encoder_mode, max_demos, info dict). ``state``: our checkpoint,
    already loaded by :func:`_load_checkpoint_state` (loaded here when None)."""
    if not os.path.exists(cfg.checkpoint):
        raise EvaluateError(f"checkpoint={cfg.checkpoint!r}: no such file or directory")
    if cfg.original_trm_checkpoint:
        if cfg.arch is None:
            raise EvaluateError("original_trm_checkpoint=true needs an arch (the format stores no config): arch=trm")
        original_arch = None
        if cfg.original_arch_config:
            raw = read_omegaconf_yaml(cfg.original_arch_config, EvaluateError)
            original_arch = raw.get("arch", raw) if isinstance(raw, dict) else None
            if not isinstance(original_arch, dict):
                raise EvaluateError(f"original_arch_config={cfg.original_arch_config!r}: no arch section")
        model = models.build_model(
            cfg.arch,
            vocab_size=metadata.vocab_size,
            seq_len=metadata.seq_len,
            num_puzzle_identifiers=metadata.num_puzzle_identifiers,
            batch_size=batch_size,
        )
        info = load_original_trm_checkpoint(
            model, cfg.checkpoint, original_arch=original_arch, allow=cfg.allow_arch_mismatch
        )
        head = models.build_loss_head(model)
        return (
            head.to(device).eval(),
            False,
            None,
            {
                "format": "original_trm",
                "loaded_keys": len(info["loaded"]),
                "file": os.path.abspath(cfg.checkpoint),
                "step": None,
            },
        )

    state = state if state is not None else _load_checkpoint_state(cfg.checkpoint)
    model, pcfg, train_meta = load_model_for_inference(state, use_ema=cfg.use_ema, device=device, batch_size=batch_size)
    check_split_matches(
        train_meta, metadata, f"data_path={cfg.data_path!r}: test split", "the checkpoint's training data"
    )
    if (
        getattr(train_meta, "num_puzzle_identifiers", None) not in (None, metadata.num_puzzle_identifiers)
        and getattr(pcfg, "encoder", None) is None
    ):
        raise EvaluateError(
            f"data_path={cfg.data_path!r}: num_puzzle_identifiers={metadata.num_puzzle_identifiers} "
            f"differs from the checkpoint's ({train_meta.num_puzzle_identifiers}); puzzle embeddings "
            "would address the wrong puzzles"
        )
    encoder_mode = getattr(pcfg, "encoder", None) is not None
    ck_file, step = os.path.abspath(state["_path"]), state.get("step")
    step = int(step) if step is not None else None
    _check_identifiers(cfg.data_path, metadata, train_meta, ck_file, refuse=not encoder_mode)
    head = build_loss_head(model, pcfg.loss_type).to(device).eval()
    return (
        head,
        encoder_mode,
        getattr(pcfg, "max_demos", None),
        {
            "format": "ours",
            "global_batch_size": int(pcfg.global_batch_size),
            "seed": int(pcfg.seed),
            "file": ck_file,
            "step": step,
            "identifiers_sha256": getattr(train_meta, "identifiers_sha256", None),
            "config": pcfg.model_dump(mode="json"),
            # the training run's names (older checkpoints store them beside the config only)
            "run_name": state.get("run_name") or pcfg.run_name,
            "project_name": state.get("project_name") or pcfg.project_name,
            # the model evaluated (the checkpoint's own config; the evaluation config's arch does not apply)
            "arch": pcfg.arch.model_dump(mode="json"),
            "encoder": None if pcfg.encoder is None else pcfg.encoder.model_dump(mode="json"),
        },
    )


def _check_identifiers(data_path: str, metadata: Any, train_meta: Any, ck_file: str, *, refuse: bool) -> None:
    """Refuse (``refuse``: a puzzle-embedding model) or warn about evaluation data whose identifiers.json is not
    the training data's: puzzle ids would name other puzzles. Checkpoints without the hash only warn."""
    want = getattr(train_meta, "identifiers_sha256", None)
    have = getattr(metadata, "identifiers_sha256", None)
    if want is None:
        log.warning(
            "%s: the checkpoint records no identifiers.json hash (written by an older version); cannot check "
            "that data_path=%s is the data it was trained on",
            ck_file,
            data_path,
        )
        return
    if have == want:
        return
    msg = (
        f"data_path={data_path!r}: identifiers.json (sha256 {str(have)[:12]}) differs from the training data's "
        f"(sha256 {want[:12]}, recorded in {ck_file})"
    )
    if refuse:
        raise EvaluateError(
            msg + "; the puzzle embeddings would address other puzzles. Evaluate on the dataset the run was trained on"
        )
    log.warning("%s; the encoder model does not use puzzle ids, evaluating anyway", msg)


def _load_checkpoint_state(path: str) -> dict[str, Any]:
    """Our checkpoint's state, loaded once (``weights_only=True``; a run directory gives its newest loadable
    ``step_*.pt``, skipping corrupt newer files loudly). Errors are one line naming the file."""
    if not os.path.exists(path):
        raise EvaluateError(f"checkpoint={path!r}: no such file or directory")
    try:
        return load_checkpoint_file(path)
    except CheckpointError as e:
        raise EvaluateError(
            f"checkpoint={path!r}: {e} (original TRM files need original_trm_checkpoint=true)"
        ) from None


def _configure_latent_search(head: Any, cfg: EvaluateConfig) -> None:
    """Apply ``latent_search_steps`` / ``latent_search_lr`` to an ETRM model (error for any other model)."""
    if cfg.latent_search_steps is None and cfg.latent_search_lr is None:
        return
    model = getattr(head, "model", head)
    if not hasattr(model, "latent_search_steps"):
        raise EvaluateError(
            f"latent_search_steps={cfg.latent_search_steps}: the checkpoint's model "
            f"({type(model).__name__}) has no demonstration encoder to search"
        )
    encoder = getattr(model, "encoder", None)
    if cfg.latent_search_steps and not encoder.capabilities.latent_search:
        raise EvaluateError(
            f"latent_search_steps={cfg.latent_search_steps}: test-time latent search needs an "
            f"LPN-style encoder (encoder=lpn); this checkpoint's encoder is "
            f"{type(encoder).__name__}"
        )
    if cfg.latent_search_steps is not None:
        model.latent_search_steps = int(cfg.latent_search_steps)
    if cfg.latent_search_lr is not None:
        model.latent_search_lr = float(cfg.latent_search_lr)


def default_output_dir(checkpoint: str) -> str:
    ck = os.path.abspath(checkpoint)
    if os.path.isdir(ck):
        return os.path.join(ck, "evaluate", "latest")
    return os.path.join(os.path.dirname(ck), "evaluate", os.path.splitext(os.path.basename(ck))[0])


def _oracle_labels(cfg: EvaluateConfig, info: dict[str, Any]) -> Optional[torch.Tensor]:
    """The rule labels of the evaluated puzzles, per identifier, for an ``encoder.oracle_context`` checkpoint
    (``rule_labels``); None for any other run. Either half without the other is refused: an oracle run's context
    without labels would be zeros, and no other run reads labels in evaluation."""
    oracle = bool((info.get("encoder") or {}).get("oracle_context"))
    if cfg.rule_labels and not oracle:
        raise EvaluateError(
            f"rule_labels={cfg.rule_labels!r}: only an encoder.oracle_context run reads rule labels "
            f"in evaluation; checkpoint={cfg.checkpoint!r} is not one"
        )
    if oracle and not cfg.rule_labels:
        raise EvaluateError(
            f"checkpoint={cfg.checkpoint!r} is an encoder.oracle_context run (its context is the true "
            "rule): evaluating it needs rule_labels=<the synthetic builder's rules.json>"
        )
    if not oracle:
        return None
    table = torch.as_tensor(rule_label_table(cfg.data_path, cfg.rule_labels, split="test"))
    log.info(
        "oracle context: rule labels of %d evaluated identifiers from %s",
        int((table[:, 0] >= 0).sum()),
        cfg.rule_labels,
    )
    return table


class _LabelledLoader:
    """The evaluation loader with each batch's ``rule_targets`` (an oracle run's context) added."""

    def __init__(self, loader: Any, table: torch.Tensor) -> None:
        self.loader, self.table = loader, table
        self.dataset = getattr(loader, "dataset", None)  # the progress bar's total (evaluators.inference)

    def __iter__(self):
        for set_name, batch, n in self.loader:
            yield set_name, with_rule_targets(batch, self.table.to(batch["puzzle_identifiers"].device)), n


def eval_wandb_target(cfg: EvaluateConfig, info: dict[str, Any]) -> tuple[Optional[str], str]:
    """``(project, mode)`` of the evaluation's W&B run: ``wandb_project``, else the training run's project (from
    the checkpoint; an original TRM checkpoint has none: no W&B run); ``wandb_mode``, else (``auto``) the
    environment's ``WANDB_MODE``, else the training run's ``wandb.mode`` (a run trained offline or disabled is
    evaluated so), else online with a login and offline without."""
    trained = info.get("config") or {}
    project = cfg.wandb_project or info.get("project_name") or trained.get("project_name")
    mode = cfg.wandb_mode
    if mode == "auto" and not os.environ.get("WANDB_MODE"):
        mode = (trained.get("wandb") or {}).get("mode") or "auto"
    return (str(project) if project else None), resolve_wandb_mode(mode)


def _start_wandb(cfg: EvaluateConfig, info: dict[str, Any], out_dir: str) -> Any:
    """A W&B run (job_type eval) in the training run's project (or ``wandb_project``) and group with its tags,
    named ``<run>-eval-<checkpoint>``, whose config is the checkpoint's own (the evaluation's settings under
    ``evaluate``), so that it sits beside the training run on the same charts; its mode:
    :func:`eval_wandb_target`. None when there is no project or the mode is disabled."""
    project, mode = eval_wandb_target(cfg, info)
    if project is None or mode == "disabled":
        return None
    import wandb  # optional at run time: only when logging to W&B

    trained = info.get("config") or {}
    ck_file = info.get("file") or out_dir
    run_name = str(info.get("run_name") or trained.get("run_name") or os.path.basename(os.path.dirname(ck_file)))
    ident = wandb_identity(trained, run_name)
    settings = cfg.model_dump()
    if not cfg.original_trm_checkpoint:  # the evaluation config's arch group is unused: the checkpoint has its own
        settings.pop("arch", None)
    name = cfg.wandb_run_name or f"{run_name}-eval-{os.path.splitext(os.path.basename(ck_file))[0]}"
    return wandb.init(
        project=project,
        name=name,
        job_type="eval",
        group=ident["group"],
        tags=ident["tags"],
        mode=mode,
        dir=out_dir,
        config={**ident["config"], "evaluate": settings},
    )


def uses_arc_voting(data_path: str, metadata: Any) -> bool:
    """Whether ARC voting pass@K applies, from the split's dataset.json ``kind``: ``arc`` (ARC-AGI, ConceptARC,
    synthetic rules: augmented copies named in identifiers.json, the original puzzles in test_puzzles.json) yes;
    ``sudoku`` / ``maze`` no (scored by the per-copy exact / token accuracy and halting steps alone:
    ``all.exact_accuracy``, ``all.accuracy``, ``all.steps``). A directory without a kind (the published TRM
    layout) is ARC-format when it has both test_puzzles.json and identifiers.json."""
    kind = getattr(metadata, "kind", None)
    if kind is not None:
        return kind == "arc"
    return all(os.path.isfile(os.path.join(data_path, f)) for f in ("test_puzzles.json", "identifiers.json"))


def _ensure_writable(out_dir: str) -> Optional[str]:
    """Create ``out_dir`` (checking it is writable); returns the top-most directory this call created, or None."""
    top, d = None, os.path.abspath(out_dir)
    while not os.path.exists(d):
        top, d = d, os.path.dirname(d)
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise EvaluateError(
            f"output_dir={out_dir!r}: not writable ({e.strerror or e}); choose another output_dir="
        ) from None
    return top


def _remove_if_empty(top: Optional[str]) -> None:
    """Remove the directories :func:`_ensure_writable` created when nothing was written into them."""
    if top is None or not os.path.isdir(top):
        return
    for d, _dirs, files in sorted(os.walk(top), key=lambda x: -len(x[0])):
        if files or os.listdir(d):
            return
        os.rmdir(d)
