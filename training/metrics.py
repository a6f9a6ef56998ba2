"""Training metrics of a log window (docs/metrics.md): the TRM semantics of every ``train/*`` number."""

from __future__ import annotations

from typing import Collection, Optional


def reduce_window(
    acc: dict[str, float], n_steps: int, *, global_batch_size: int, extra_loss_keys: Collection[str] = ()
) -> dict[str, float]:
    """Raw metric sums of ``n_steps`` steps (rank-summed) -> logged values: loss terms (``*loss`` and the
    per-sample ``extra_loss_keys``, e.g. kl) / (global batch * steps); accuracies and steps / count (halted
    samples); gradient norms and ``train/decoder_*`` averaged over steps; ``train/count`` per step."""
    out: dict[str, float] = {}
    n, count = max(n_steps, 1), acc.get("count", 0.0)
    for k, v in acc.items():
        if k in ("loss", "new_examples"):
            continue
        if k.startswith("grad/") or k.startswith("train/decoder"):
            out[k] = v / n
        elif k == "count":
            out["train/count"] = v / n
        elif k.endswith("loss") or k in extra_loss_keys:
            out[f"train/{k}"] = v / (global_batch_size * n)
        else:
            out[f"train/{k}"] = v / max(count, 1.0)
    out["train/loss"] = acc.get("loss", 0.0) / (global_batch_size * n)
    return out


_LOSS_TERMS = ("kl", "rule_readout")  # per-sample loss terms the head adds (docs/metrics.md)
_HIGHER_IS_BETTER = ("rule_exact",)


def metric_direction(name: str) -> Optional[str]:
    """Which way a logged metric improves, the one declaration of it (``python -m training.compare_runs``; meant for
    summary.json's ``best`` too): ``"max"`` for accuracies (``accuracy``, ``exact_accuracy``, ``q_halt_accuracy``,
    ``ARC/pass@K``, ``train/rule_exact``), ``"min"`` for losses (``loss``, ``*_loss``, ``eval/<set>.lm_loss``, the
    per-sample loss terms ``train/kl`` and ``train/rule_readout``), ``None`` for the rest (lr, counts, epochs, ACT
    steps, gradient norms, encoder statistics, ``ARC/malformed_frac``: bookkeeping or diagnostics)."""
    leaf = name.rsplit("/", 1)[-1].rsplit(".", 1)[-1]  # train/lm_loss -> lm_loss, eval/all.accuracy -> accuracy
    if leaf.endswith("accuracy") or leaf.startswith("pass@") or leaf in _HIGHER_IS_BETTER:
        return "max"
    if leaf == "loss" or leaf.endswith("_loss") or leaf in _LOSS_TERMS:
        return "min"
    return None
