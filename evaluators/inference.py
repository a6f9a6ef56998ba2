"""The single inference path (docs/evaluation.md): used by training/loop.py's eval hook and by evaluate.py.

Per test batch: one ``initial_carry`` (all slots start halted, so the first step loads the batch), then
ACT supervision steps under ``torch.inference_mode`` (optionally autocast). Each sample's outputs are
frozen at the first step where it halts; every slot of an eval-mode TRM halts at ``halt_max_steps``.
With ``halt_early=True`` a sample also counts as halted as soon as ``q_halt_logits > 0`` (the learned
halting rule, no exploration) and the batch stops when all its samples are done.

Per-copy metrics ``<set>.{accuracy, exact_accuracy, lm_loss, q_halt_accuracy, steps}`` are sums over
real examples divided by their count (padding rows, ``example_index == -1``, excluded). With a loss head
and ``halt_early=False`` they are the loss head's own metric sums at the halting step; otherwise (a raw
ACT model, or halt_early) they are computed here from the frozen per-sample outputs with the same
definitions.
"""
from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Iterable, Optional, Sequence, Union

import torch

from evaluators import dist as edist

log = logging.getLogger(__name__)

METRIC_KEYS = ("accuracy", "exact_accuracy", "lm_loss", "q_halt_accuracy", "steps")
IGNORE = -100


def resolve_autocast_dtype(autocast_dtype: Union[None, str, torch.dtype], device: torch.device
                           ) -> Optional[torch.dtype]:
    """``None``/"none"/"fp32" -> no autocast; "auto" -> bf16 on CUDA, none on CPU (pitfall 24);
    "bf16"/"fp16" or a torch dtype -> that dtype."""
    if autocast_dtype is None or isinstance(autocast_dtype, torch.dtype):
        return autocast_dtype
    name = str(autocast_dtype).lower()
    table = {"none": None, "fp32": None, "float32": None, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp16": torch.float16, "float16": torch.float16}
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else None
    if name not in table:
        raise ValueError(f"autocast_dtype={autocast_dtype!r}: expected auto, none, fp32, bf16 or fp16")
    return table[name]


def _wrapped_chain(model: Any):
    """``model`` and the modules it wraps (``.model``, ``._orig_mod``, ``.module``, ``.inner``), breadth-first,
    each once: loss head -> compiled module -> ACT model -> inner model."""
    seen, todo = set(), [model]
    while todo:
        m = todo.pop(0)
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        yield m
        todo.extend(getattr(m, a, None) for a in ("model", "_orig_mod", "module", "inner"))


def find_halt_max_steps(model: Any) -> int:
    """halt_max_steps of an ACT model or loss head (looks at ``.config`` / ``.model`` / ``._orig_mod``)."""
    for m in _wrapped_chain(model):
        for holder in (m, getattr(m, "config", None)):
            v = getattr(holder, "halt_max_steps", None) if holder is not None else None
            if isinstance(v, int) and v > 0:
                return v
    raise ValueError(f"cannot find halt_max_steps on {type(model).__name__}; pass max_steps=")


def _find_attr_owner(model: Any, attr: str) -> Any:
    return next((m for m in _wrapped_chain(model) if hasattr(m, attr)), None)


def per_sample_lm_loss(logits: torch.Tensor, labels: torch.Tensor, loss_type: str = "softmax_cross_entropy"
                       ) -> torch.Tensor:
    """Mean token loss over each sample's supervised tokens ([b] float32; 0 for samples with none).

    The token losses are the loss head's own functions (``models.losses.get_loss_fn``), so the metrics recomputed
    here and the head's metric sums cannot drift apart."""
    from models.losses import get_loss_fn

    mask = labels != IGNORE
    tok = get_loss_fn(loss_type)(logits, labels, ignore_index=IGNORE)
    return (tok.sum(-1) / mask.sum(-1).clamp_min(1)).float()


def per_sample_metrics(preds: torch.Tensor, labels: torch.Tensor, q_halt_logits: torch.Tensor,
                       steps: torch.Tensor, lm_loss: Optional[torch.Tensor]) -> dict[str, torch.Tensor]:
    """TRM metric definitions per sample: token accuracy over supervised tokens, exact match, whether
    q_halt >= 0 agrees with exact match, steps taken, lm loss."""
    mask = labels != IGNORE
    n = mask.sum(-1)
    correct = (preds == labels) & mask
    exact = (correct.sum(-1) == n) & (n > 0)
    out = {
        "accuracy": correct.sum(-1).float() / n.clamp_min(1),
        "exact_accuracy": exact.float(),
        "q_halt_accuracy": ((q_halt_logits.float() >= 0) == exact).float(),
        "steps": steps.float(),
    }
    if lm_loss is not None:
        out["lm_loss"] = lm_loss.float()
    return out


def _to_device(batch: dict, device: torch.device) -> dict:
    return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}


def _unpack(item: Any) -> tuple[str, dict]:
    if isinstance(item, dict):
        return "all", item
    if isinstance(item, (tuple, list)) and len(item) >= 2 and isinstance(item[1], dict):
        return str(item[0]), item[1]
    raise TypeError(f"loader must yield (set_name, batch, global_batch_size) or a batch dict, got {type(item)}")


def _loss_type(model: Any) -> str:
    for m in (model, getattr(model, "_orig_mod", None)):
        lt = getattr(m, "loss_type", None)
        if isinstance(lt, str):
            return lt
    return "softmax_cross_entropy"


def evaluate(model: torch.nn.Module, loader: Iterable, evaluators: Sequence[Any], *,
             device: Union[str, torch.device], autocast_dtype: Union[None, str, torch.dtype] = None,
             halt_early: bool = False, progress: bool = True, return_keys: Sequence[str] = (),
             max_steps: Optional[int] = None, save_path: Optional[str] = None) -> dict[str, float]:
    """Run inference over ``loader`` (test mode), feed every evaluator, return the metrics.

    ``model``: an ACT loss head (``forward(carry, batch, return_keys) -> (carry, loss, metrics, outputs,
    all_halted)``) or a bare ACT model (``forward(carry, batch) -> (carry, outputs)``).
    Returns ``<set>.<metric>`` per-copy metrics (all ranks) plus the evaluators' metrics (rank 0), and
    ``eval/num_examples``, ``eval/seconds``, ``eval/examples_per_second``.

    ``return_keys``: extra per-example tensors to keep (model outputs such as ``logits``, or batch keys such as
    ``inputs``; ``steps`` = halting step); with ``save_path`` they are written, padding rows removed, with
    their ``example_index``, to ``<save_path>/outputs.rank<r>.pt``. Evaluators' ``required_outputs`` missing
    from the model's outputs raise ``KeyError``. ``max_steps`` overrides ``halt_max_steps`` (benchmarks).
    """
    import time

    from tqdm.auto import tqdm

    device = torch.device(device)
    amp_dtype = resolve_autocast_dtype(autocast_dtype, device)
    steps_max = int(max_steps) if max_steps is not None else find_halt_max_steps(model)
    need = {"preds", "q_halt_logits"}
    extra_keys = tuple(k for k in return_keys if k)
    for ev in evaluators:
        need |= set(getattr(ev, "required_outputs", set()))
        ev.begin_eval()
    loss_type = _loss_type(model)
    bare = _is_bare(model)
    was_training = model.training
    model.eval()
    # halt_early: let the ACT model apply its own Q-halting rule in eval when it has the switch
    # (models.act.ACTModel.halt_early_in_eval); otherwise q_halt_logits > 0 is applied here.
    act_owner = _find_attr_owner(model, "halt_early_in_eval")
    old_flag = getattr(act_owner, "halt_early_in_eval", None)
    if act_owner is not None:
        act_owner.halt_early_in_eval = bool(halt_early)

    sums: dict[str, dict[str, float]] = {}
    saved: dict[str, list[torch.Tensor]] = {}
    warned = False
    counts: dict[str, float] = {}
    n_examples = 0
    t0 = time.perf_counter()
    total = None
    with contextlib.suppress(TypeError):
        total = len(loader)  # type: ignore[arg-type]
    if total is None:  # IterableDataset: ask the dataset (dataset.loader.PuzzleDataset.num_batches)
        nb = getattr(getattr(loader, "dataset", loader), "num_batches", None)
        with contextlib.suppress(Exception):
            total = int(nb()) if callable(nb) else None
    bar = tqdm(loader, total=total, desc="eval", unit="batch", disable=not progress or edist.rank() != 0,
               dynamic_ncols=True)
    amp = (torch.autocast(device_type=device.type, dtype=amp_dtype) if amp_dtype is not None
           else contextlib.nullcontext())
    try:
        with torch.inference_mode():
            for item in bar:
                set_name, cpu_batch = _unpack(item)
                batch = _to_device(cpu_batch, device)
                b = batch["inputs"].shape[0]
                real = (batch["example_index"] >= 0) if "example_index" in batch else torch.ones(
                    b, dtype=torch.bool, device=device)
                with torch.device(device):
                    carry = model.initial_carry(batch)
                done = torch.zeros(b, dtype=torch.bool, device=device)
                done_step = torch.zeros(b, dtype=torch.int32, device=device)
                frozen: dict[str, torch.Tensor] = {}
                head_sums: Optional[dict[str, torch.Tensor]] = None
                head_ok = True
                want = need | {"logits"} | set(extra_keys)
                for step in range(1, steps_max + 1):
                    with amp:
                        res = model(carry=carry, batch=batch) if bare else \
                            model(carry=carry, batch=batch, return_keys=tuple(sorted(want)))
                    if len(res) == 5:
                        carry, _loss, head_metrics, outs, _all_halted = res
                    elif len(res) == 2:
                        carry, outs = res
                        head_metrics = None
                    else:
                        raise TypeError(f"model forward returned {len(res)} values; expected 5 (loss head) or 2")
                    if "preds" not in outs and "logits" in outs:
                        outs = dict(outs, preds=outs["logits"].argmax(-1))
                    halted = carry.halted.to(device).bool()
                    if halt_early and act_owner is None:
                        halted = halted | (outs["q_halt_logits"].float() > 0)
                    if step == steps_max:
                        halted = torch.ones_like(halted)
                    newly = halted & ~done
                    # one host transfer per step: "did any slot halt for the first time / again"
                    any_new, rerun = torch.stack([newly.any(), (carry.halted.to(device).bool() & done).any()]).tolist()
                    if head_metrics is not None and not halt_early:
                        if rerun:
                            head_ok = False  # a re-run slot halted again: head sums would double count
                        if any_new:
                            hm = {k: v.detach().float().sum() for k, v in head_metrics.items()}
                            head_sums = hm if head_sums is None else {k: head_sums[k] + hm.get(k, 0) for k in head_sums}
                    if any_new:
                        for k in want:
                            if k not in outs:
                                continue
                            v = outs[k]
                            if k not in frozen:
                                frozen[k] = v.detach().clone()
                            else:
                                sel = newly.view(-1, *([1] * (v.dim() - 1)))
                                frozen[k] = torch.where(sel, v.detach(), frozen[k])
                        done_step = torch.where(newly, torch.full_like(done_step, step), done_step)
                        done = done | newly
                    if halt_early and bool(done.all()):
                        break
                missing = need - set(frozen) - {"steps"}
                if missing:
                    raise KeyError(f"model outputs lack {sorted(missing)} required by the evaluators")

                # ---- per-copy metrics
                s = sums.setdefault(set_name, {k: 0.0 for k in METRIC_KEYS})
                n_real = int(real.sum())
                use_head = head_sums is not None and head_ok and not halt_early and "count" in head_sums
                if use_head and int(head_sums["count"].item()) != n_real:
                    use_head = False  # head counted something else (e.g. padding rows); fall back
                if head_sums is not None and not use_head and not halt_early and not warned:
                    warned = True
                    log.warning("eval: the loss head's metric sums do not cover each example exactly once (a slot "
                                "halted before halt_max_steps, or padding counted); per-copy metrics are "
                                "recomputed from the frozen outputs")
                if use_head:
                    for k in METRIC_KEYS:
                        if k in head_sums:
                            s[k] += float(head_sums[k])
                    counts[set_name] = counts.get(set_name, 0.0) + n_real
                else:
                    labels = batch["labels"]
                    lm = (per_sample_lm_loss(frozen["logits"], labels, loss_type) if "logits" in frozen else None)
                    ps = per_sample_metrics(frozen["preds"], labels, frozen["q_halt_logits"], done_step, lm)
                    for k, v in ps.items():
                        s[k] += float(v[real].sum())
                    if lm is None:
                        s["lm_loss"] = math.nan
                    counts[set_name] = counts.get(set_name, 0.0) + n_real
                n_examples += n_real

                cpu_out = {k: v.detach().cpu() for k, v in frozen.items() if k in need}
                cpu_out["steps"] = done_step.cpu()
                if extra_keys:  # saved outputs (TRM's eval_save_outputs): model outputs, else batch keys
                    keep = real.cpu()
                    for k in extra_keys:
                        src = frozen.get(k, cpu_batch.get(k))
                        if src is None and k == "steps":
                            src = done_step
                        if src is not None:
                            saved.setdefault(k, []).append(src.detach().cpu()[keep])
                    saved.setdefault("example_index", []).append(cpu_batch["example_index"][keep]
                                                                 if "example_index" in cpu_batch else
                                                                 torch.arange(int(keep.sum())))
                for ev in evaluators:
                    ev.update(cpu_batch, cpu_out)
                if progress:
                    bar.set_postfix(examples=n_examples)
    finally:
        if was_training:
            model.train()
        if act_owner is not None:
            act_owner.halt_early_in_eval = old_flag
        bar.close()

    # ---- reduce per-copy metrics over ranks
    metrics: dict[str, float] = {}
    for set_name in sorted(sums):
        vec = torch.tensor([sums[set_name][k] for k in METRIC_KEYS] + [counts[set_name]], dtype=torch.float64,
                           device=device if edist.dist_active() else "cpu")
        edist.all_reduce_sum_(vec)
        cnt = float(vec[-1])
        for i, k in enumerate(METRIC_KEYS):
            metrics[f"{set_name}.{k}"] = float(vec[i]) / cnt if cnt > 0 else math.nan
    n_tot = torch.tensor([float(n_examples)], dtype=torch.float64, device=device if edist.dist_active() else "cpu")
    edist.all_reduce_sum_(n_tot)
    secs = time.perf_counter() - t0
    metrics["eval/num_examples"] = float(n_tot.item())
    metrics["eval/seconds"] = secs
    metrics["eval/examples_per_second"] = float(n_tot.item()) / secs if secs > 0 else math.nan
    if saved and save_path:
        import os

        os.makedirs(save_path, exist_ok=True)
        torch.save({k: torch.cat(v) for k, v in saved.items()},
                   os.path.join(save_path, f"outputs.rank{edist.rank()}.pt"))
    for ev in evaluators:
        r = ev.result(save_path)
        if r is not None:
            metrics.update(r)
    return metrics


def _is_bare(model: Any) -> bool:
    """A bare ACT model has no ``return_keys`` parameter in its forward."""
    import inspect

    fwd = getattr(model, "forward", None)
    try:
        params = inspect.signature(fwd).parameters
    except (TypeError, ValueError):
        return False
    return "return_keys" not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values())
