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
import inspect
import logging
import math
import os
import time
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import torch
from tqdm.auto import tqdm

from evaluators import dist as edist
from models.losses import get_loss_fn
from models.rollout import Rollout, act_model_of, halt_max_steps, rollout

log = logging.getLogger(__name__)

METRIC_KEYS = ("accuracy", "exact_accuracy", "lm_loss", "q_halt_accuracy", "steps")
IGNORE = -100


def resolve_autocast_dtype(
    autocast_dtype: Union[None, str, torch.dtype], device: torch.device
) -> Optional[torch.dtype]:
    """``None``/"none"/"fp32" -> no autocast; "auto" -> bf16 on CUDA, none on CPU (pitfall 24);
    "bf16"/"fp16" or a torch dtype -> that dtype."""
    if autocast_dtype is None or isinstance(autocast_dtype, torch.dtype):
        return autocast_dtype
    name = str(autocast_dtype).lower()
    table = {
        "none": None,
        "fp32": None,
        "float32": None,
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
    }
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else None
    if name not in table:
        raise ValueError(f"autocast_dtype={autocast_dtype!r}: expected auto, none, fp32, bf16 or fp16")
    return table[name]


def per_sample_lm_loss(
    logits: torch.Tensor, labels: torch.Tensor, loss_type: str = "softmax_cross_entropy"
) -> torch.Tensor:
    """Mean token loss over each sample's supervised tokens ([b] float32; 0 for samples with none).

    The token losses are the loss head's own functions (``models.losses.get_loss_fn``), so the metrics recomputed
    here and the head's metric sums cannot drift apart."""
    mask = labels != IGNORE
    tok = get_loss_fn(loss_type)(logits, labels, ignore_index=IGNORE)
    return (tok.sum(-1) / mask.sum(-1).clamp_min(1)).float()


def per_sample_metrics(
    preds: torch.Tensor,
    labels: torch.Tensor,
    q_halt_logits: torch.Tensor,
    steps: torch.Tensor,
    lm_loss: Optional[torch.Tensor],
) -> dict[str, torch.Tensor]:
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


def _unpack(item: Any) -> tuple[str, dict, Optional[int]]:
    """-> (set name, batch, the global batch's real example count when the loader gives it, else None)."""
    if isinstance(item, dict):
        return "all", item, None
    if isinstance(item, (tuple, list)) and len(item) >= 2 and isinstance(item[1], dict):
        effective = item[2] if len(item) >= 3 else None
        return str(item[0]), item[1], (int(effective) if effective is not None else None)
    raise TypeError(f"loader must yield (set_name, batch, global_batch_size) or a batch dict, got {type(item)}")


def _loss_type(model: Any) -> str:
    for m in (model, getattr(model, "_orig_mod", None)):
        lt = getattr(m, "loss_type", None)
        if isinstance(lt, str):
            return lt
    return "softmax_cross_entropy"


def as_logged(metrics: dict[str, Any]) -> dict[str, float]:
    """An evaluation's metrics under the names they are logged with (the training loop's eval hook and
    evaluate.py's W&B run, so that both land on the same charts): a name without ``/`` gets ``eval/``
    (``all.accuracy`` -> ``eval/all.accuracy``); ``ARC/pass@K`` and ``eval/…`` keep theirs."""
    return {(k if "/" in k else f"eval/{k}"): float(v) for k, v in metrics.items()}


def evaluate(
    model: torch.nn.Module,
    loader: Iterable,
    evaluators: Sequence[Any],
    *,
    device: Union[str, torch.device],
    autocast_dtype: Union[None, str, torch.dtype] = None,
    halt_early: bool = False,
    progress: bool = True,
    return_keys: Sequence[str] = (),
    max_steps: Optional[int] = None,
    save_path: Optional[str] = None,
    ttt: Any = None,
) -> dict[str, float]:
    """Run inference over ``loader`` (test mode), feed every evaluator, return the metrics.

    ``model``: an ACT loss head (``forward(carry, batch, return_keys) -> (carry, loss, metrics, outputs,
    all_halted)``) or a bare ACT model (``forward(carry, batch) -> (carry, outputs)``).
    Returns ``<set>.<metric>`` per-copy metrics (all ranks) plus the evaluators' metrics (rank 0), and
    ``eval/num_examples``, ``eval/seconds``, ``eval/examples_per_second``.

    ``return_keys``: extra per-example tensors to keep (model outputs such as ``logits``, or batch keys such as
    ``inputs``; ``steps`` = halting step); with ``save_path`` they are written, padding rows removed, with
    their ``example_index``, to ``<save_path>/outputs.rank<r>.pt``. Evaluators' ``required_outputs`` missing
    from the model's outputs raise ``KeyError``. ``max_steps`` overrides ``halt_max_steps`` (benchmarks).
    ``ttt``: an ``evaluators.ttt.TestTimeTraining``: each batch is fitted to its own demos before it is rolled out
    (its ``ttt/*`` metrics are added).
    ``progress``: rank 0's bar of evaluated examples over all ranks, on a terminal only (:func:`_progress_bar`).
    """
    device = torch.device(device)
    amp_dtype = resolve_autocast_dtype(autocast_dtype, device)
    amp = (
        torch.autocast(device_type=device.type, dtype=amp_dtype) if amp_dtype is not None else contextlib.nullcontext()
    )
    need = {"preds", "q_halt_logits"}
    for ev in evaluators:
        need |= set(getattr(ev, "required_outputs", set()))
        ev.begin_eval()
    totals = _Totals(_loss_type(model), tuple(k for k in return_keys if k))
    plan = _StepPlan(
        model,
        need | {"logits"} | set(totals.extra_keys),
        halt_early,
        int(max_steps) if max_steps is not None else halt_max_steps(model),
    )
    t0 = time.perf_counter()
    bar = _progress_bar(loader, progress)
    try:
        with plan.eval_mode(), torch.inference_mode():
            for item in loader:
                set_name, cpu_batch, global_real = _unpack(item)
                batch = _to_device(cpu_batch, device)
                with amp:
                    r = plan.run(batch, device) if ttt is None else ttt.run(plan, batch, device)
                missing = need - set(r.outputs) - {"steps"}
                if missing:
                    raise KeyError(f"model outputs lack {sorted(missing)} required by the evaluators")
                n_real = totals.add(set_name, cpu_batch, batch, r, use_head=not halt_early)
                cpu_out = {k: v.detach().cpu() for k, v in r.outputs.items() if k in need}
                cpu_out["steps"] = r.steps.cpu()
                for ev in evaluators:
                    ev.update(cpu_batch, cpu_out)
                bar.update(global_real if global_real is not None else n_real)
        metrics = totals.reduce(device, time.perf_counter() - t0)
    finally:
        bar.close()
    totals.save_outputs(save_path)
    if ttt is not None:
        ttt.gather()
        metrics.update(ttt.summary())
    for ev in evaluators:
        res = ev.result(save_path)
        if res is not None:
            metrics.update(res)
    return metrics


class _StepPlan:
    """How one test batch is rolled out with ``model`` (models.rollout.rollout): a loss head returns its metric
    sums, a bare ACT model only outputs. ``halt_early``: the ACT model's own Q-halting rule when it has the switch
    (``halt_early_in_eval``), else ``q_halt_logits > 0`` applied by the rollout; the batch stops when all its
    samples are done."""

    def __init__(self, model: Any, want: set[str], halt_early: bool, max_steps: int):
        self.model, self.halt_early, self.max_steps = model, bool(halt_early), max_steps
        self.want = tuple(sorted(want))
        self.bare = _is_bare(model)
        act = act_model_of(model)
        self.act = act if hasattr(act, "halt_early_in_eval") else None

    @contextlib.contextmanager
    def eval_mode(self) -> Iterator[None]:
        was_training = self.model.training
        old_flag = getattr(self.act, "halt_early_in_eval", None)
        self.model.eval()
        if self.act is not None:
            self.act.halt_early_in_eval = self.halt_early
        try:
            yield
        finally:
            self.model.train(was_training)
            if self.act is not None:
                self.act.halt_early_in_eval = old_flag

    def _step(self, batch: dict, kw: dict) -> Callable[[Any], tuple]:
        if self.bare:
            return lambda carry: self.model(carry=carry, batch=batch, **kw)

        def head_step(carry: Any) -> tuple:
            res = self.model(carry=carry, batch=batch, return_keys=self.want, **kw)
            if len(res) != 5:
                raise TypeError(f"model forward returned {len(res)} values; expected 5 (loss head) or 2")
            new_carry, _loss, metrics, outs, _all_halted = res
            return new_carry, outs, metrics

        return head_step

    def run(self, batch: dict, device: torch.device, **model_kwargs: Any) -> Rollout:
        """Roll ``batch`` out; ``model_kwargs`` go to every forward (test-time training: ``prefix_context``)."""
        with torch.device(device):
            carry = self.model.initial_carry(batch)
        return rollout(
            self._step(batch, model_kwargs),
            carry,
            max_steps=self.max_steps,
            keep=self.want,
            q_halt_rule=self.halt_early and self.act is None,
            stop_when_done=self.halt_early,
        )


class _Totals:
    """Per-copy metric sums (``<set>.<metric>``), the example count and the saved outputs of one evaluation."""

    def __init__(self, loss_type: str, extra_keys: tuple[str, ...]):
        self.loss_type, self.extra_keys = loss_type, extra_keys
        self.sums: dict[str, dict[str, float]] = {}
        self.counts: dict[str, float] = {}
        self.saved: dict[str, list[torch.Tensor]] = {}
        self.n_examples = 0
        self.warned = False

    def add(self, set_name: str, cpu_batch: dict, batch: dict, r: Rollout, *, use_head: bool) -> int:
        """Metrics of one batch: the loss head's own sums at the halting step when they cover every real
        example exactly once, else recomputed from the frozen per-sample outputs (same definitions). Returns the
        batch's real (non-padding) example count on this rank."""
        b = batch["inputs"].shape[0]
        real = (
            (batch["example_index"] >= 0)
            if "example_index" in batch
            else torch.ones(b, dtype=torch.bool, device=batch["inputs"].device)
        )
        s = self.sums.setdefault(set_name, {k: 0.0 for k in METRIC_KEYS})
        n_real = int(real.sum())
        head = r.metric_sums if use_head else None
        if head is not None and (not r.metrics_exact or "count" not in head or int(head["count"].item()) != n_real):
            head = None  # a re-run slot halted again, or the head counted something else (e.g. padding rows)
            if not self.warned:
                self.warned = True
                log.warning(
                    "eval: the loss head's metric sums do not cover each example exactly once (a slot "
                    "halted before halt_max_steps, or padding counted); per-copy metrics are "
                    "recomputed from the frozen outputs"
                )
        if head is not None:
            for k in METRIC_KEYS:
                if k in head:
                    s[k] += float(head[k])
        else:
            frozen, labels = r.outputs, batch["labels"]
            lm = per_sample_lm_loss(frozen["logits"], labels, self.loss_type) if "logits" in frozen else None
            for k, v in per_sample_metrics(frozen["preds"], labels, frozen["q_halt_logits"], r.steps, lm).items():
                s[k] += float(v[real].sum())
            if lm is None:
                s["lm_loss"] = math.nan
        self.counts[set_name] = self.counts.get(set_name, 0.0) + n_real
        self.n_examples += n_real
        if self.extra_keys:
            self._keep(cpu_batch, r, real.cpu())
        return n_real

    def _keep(self, cpu_batch: dict, r: Rollout, keep: torch.Tensor) -> None:
        """TRM's eval_save_outputs: model outputs, else batch keys, of the real rows."""
        for k in self.extra_keys:
            src = r.outputs.get(k, cpu_batch.get(k))
            if src is None and k == "steps":
                src = r.steps
            if src is not None:
                self.saved.setdefault(k, []).append(src.detach().cpu()[keep])
        self.saved.setdefault("example_index", []).append(
            cpu_batch["example_index"][keep] if "example_index" in cpu_batch else torch.arange(int(keep.sum()))
        )

    def reduce(self, device: torch.device, seconds: float) -> dict[str, float]:
        """Per-copy means over every rank, plus eval/num_examples, eval/seconds, eval/examples_per_second."""
        where = device if edist.dist_active() else "cpu"
        metrics: dict[str, float] = {}
        for set_name in sorted(self.sums):
            vec = torch.tensor(
                [self.sums[set_name][k] for k in METRIC_KEYS] + [self.counts[set_name]],
                dtype=torch.float64,
                device=where,
            )
            edist.all_reduce_sum_(vec)
            cnt = float(vec[-1])
            for i, k in enumerate(METRIC_KEYS):
                metrics[f"{set_name}.{k}"] = float(vec[i]) / cnt if cnt > 0 else math.nan
        n_tot = torch.tensor([float(self.n_examples)], dtype=torch.float64, device=where)
        edist.all_reduce_sum_(n_tot)
        metrics["eval/num_examples"] = float(n_tot.item())
        metrics["eval/seconds"] = seconds
        metrics["eval/examples_per_second"] = float(n_tot.item()) / seconds if seconds > 0 else math.nan
        return metrics

    def save_outputs(self, save_path: Optional[str]) -> None:
        if self.saved and save_path:
            os.makedirs(save_path, exist_ok=True)
            torch.save(
                {k: torch.cat(v) for k, v in self.saved.items()},
                os.path.join(save_path, f"outputs.rank{edist.rank()}.pt"),
            )


def _progress_bar(loader: Any, progress: bool) -> tqdm:
    """The evaluation's progress bar, counting test examples over ALL ranks: each update is the global batch's real
    example count the loader yields (the number ``eval/num_examples`` and the training loop's ``[eval]`` line
    report; a loader that yields bare batch dicts: this rank's real rows). Shown on rank 0 only, and only on a
    terminal: ``disable=None`` lets tqdm turn itself off when stderr is not a TTY (a log file, the queue, SLURM),
    so no carriage-return lines land in logs; ``progress=False`` turns it off everywhere."""
    return tqdm(
        total=_num_examples(loader),
        desc="eval",
        unit="example",
        dynamic_ncols=True,
        disable=None if progress and edist.rank() == 0 else True,
    )


def _num_examples(loader: Any) -> Optional[int]:
    """Real examples in one test pass over all ranks: the dataset's ``num_examples()`` (dataset.loader.PuzzleDataset),
    else None (the bar then shows a count without a total)."""
    n = getattr(getattr(loader, "dataset", loader), "num_examples", None)
    with contextlib.suppress(Exception):
        return int(n()) if callable(n) else None
    return None


def _is_bare(model: Any) -> bool:
    """A bare ACT model has no ``return_keys`` parameter in its forward."""
    fwd = getattr(model, "forward", None)
    try:
        params = inspect.signature(fwd).parameters
    except (TypeError, ValueError):
        return False
    return "return_keys" not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values())
