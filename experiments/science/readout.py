"""What a rule-readout run's encoder reads: per family, how often the readout head names the rule of a puzzle.

A run trained with ``encoder.rule_readout > 0`` (``python -m experiments.science --rule-readout W``) has a linear
head on its context that names each sample's rule in the slots of :data:`dataset.rule_labels.RULE_SLOTS`. This
asks that head, on every augmented copy of the held-out puzzles (``--split test``: rule instances the run never
saw) or the training puzzles (``--split train``), how often it names the family, each of the family's parameters,
and the whole rule. It separates the two halves of a miss in the science table: a family whose rule the context
carries (readout right) but whose answers are wrong is limited by the core *applying* it; one whose rule the context
does not carry is limited by the encoder *reading* it. On the 8 families at 2000 steps the context named
colour_map's colour table, gravity's direction and the repeat factors of held-out puzzles while those families
scored 0.00-0.03: limited by the core (fe3d729, docs/record/2026-11-25-rule-readout-dihedral-views.md).

    python -m experiments.science.readout runs/s/runs/standard/checkpoint --data runs/s/data/built \\
        --rules runs/s/data/raw/synth_rules.json [--split test] [--json out.json]

The science command runs it for every run trained with the readout and adds the table to science.md. The context
is the one ``ETRM.forward`` computes at a sample's first ACT step; an ``oracle_context`` run is refused (its context
is the labels themselves).
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

import numpy as np
import torch

from core.errors import user_errors
from core.io import write_json_atomic
from dataset.families import ALL_FAMILIES
from dataset.loader import create_dataloader
from dataset.rule_labels import RULE_SLOTS, rule_label_table
from training.build import load_model_for_inference

SLOTS = list(RULE_SLOTS)


def _load(checkpoint: str, need_head: bool):
    model, _, _ = load_model_for_inference(checkpoint, device="cpu")
    if getattr(model, "encoder", None) is None:
        raise ValueError(f"{checkpoint}: not an ETRM checkpoint (no demo encoder)")
    if need_head and not model.encoder.capabilities.rule_readout:
        raise ValueError(f"{checkpoint}: the run has no rule-readout head (train with encoder.rule_readout > 0)")
    if model.encoder.capabilities.rule_oracle:
        raise ValueError(
            f"{checkpoint}: an oracle_context run's context is the rule labels themselves; reading them "
            "back measures nothing"
        )
    model.latent_search_steps = 0  # the context the head was trained on: the encoder's, first ACT step
    return model


@torch.no_grad()
def _labelled_contexts(model, data_dir: str, rules_path: str, split: str, max_examples: int, batch_size: int):
    """Yields (context [n, P, D], rule labels [n, slots]) of the first ``max_examples`` labelled examples of
    ``split``: the context ``ETRM.forward`` computes at a sample's first ACT step."""
    table = torch.as_tensor(rule_label_table(data_dir, rules_path, split=split))
    loader, _ = create_dataloader(
        dict(data_paths=[data_dir], global_batch_size=batch_size, test_mode=True, encoder_mode=True), split=split
    )
    n = 0
    for _, batch, _ in loader:
        ids = torch.as_tensor(batch["puzzle_identifiers"]).long()
        keep = (table[ids, 0] >= 0).nonzero().squeeze(-1)[: max_examples - n]  # padding rows of the last batch
        if keep.numel() == 0:
            continue
        rows = {k: torch.as_tensor(v)[keep] for k, v in batch.items()}
        _, ctx = model.encode(model.refill(model.initial_carry(rows), rows))  # the path ETRM.forward takes
        yield ctx, table[ids[keep]]
        n += len(keep)
        if n >= max_examples:
            break
    if n == 0:
        raise ValueError(f"{data_dir}: no labelled {split} examples (rules {rules_path})")


def readout_accuracy(
    checkpoint: str,
    data_dir: str,
    rules_path: str,
    split: str = "test",
    max_examples: int = 4096,
    batch_size: int = 256,
) -> dict:
    """{"families": {family: {"n", "exact", "slots": {slot: accuracy}}}, "all": {"n", "exact"}} over the first
    ``max_examples`` examples of ``split`` (every augmented copy is its own sample; "exact" = every labelled slot
    named right). The checkpoint must have a readout head (``encoder.rule_readout > 0``). The context is the one
    ``ETRM.forward`` computes at a sample's first ACT step (a recurrent encoder refines it at later steps)."""
    model = _load(checkpoint, need_head=True)
    right, seen, exact, fams = [], [], [], []
    for ctx, t in _labelled_contexts(model, data_dir, rules_path, split, max_examples, batch_size):
        ok = model.encoder.rule_head.predict(ctx) == t
        labelled = t >= 0
        right.append((ok & labelled).numpy())
        seen.append(labelled.numpy())
        exact.append((ok | ~labelled).all(-1).numpy())
        fams.append(t[:, 0].numpy())
    right, seen, exact, fams = (np.concatenate(a) for a in (right, seen, exact, fams))
    families = {}
    for i, fam in enumerate(ALL_FAMILIES):
        rows = fams == i
        if rows.any():
            cols = seen[rows].any(0)
            families[fam] = {
                "n": int(rows.sum()),
                "exact": float(exact[rows].mean()),
                "slots": {
                    s: float(right[rows][:, j].sum() / seen[rows][:, j].sum()) for j, s in enumerate(SLOTS) if cols[j]
                },
            }
    return {"split": split, "families": families, "all": {"n": int(len(exact)), "exact": float(exact.mean())}}


def within_class_share(x: torch.Tensor, labels: torch.Tensor) -> float:
    """sum over classes of the squared deviations from the class mean / those from the overall mean, of the rows
    of ``x`` [n, D] (NaN when every row is the same)."""
    x = x.double()
    total = (x - x.mean(0)).square().sum()
    within = sum((x[labels == c] - x[labels == c].mean(0)).square().sum() for c in labels.unique())
    return float(within / total) if total > 0 else float("nan")


def context_separation(
    checkpoint: str,
    data_dir: str,
    rules_path: str,
    split: str = "train",
    max_examples: int = 4096,
    batch_size: int = 256,
) -> dict:
    """How categorical the context is, per rule slot: {"n", "norm", "slots": {slot: {"classes", "within"}}}.
    ``within`` is the share of the context's variance (over the examples where the slot is labelled, at the
    decoder's scale: context * sqrt(hidden)) left inside the slot's classes: 0 when every sample of a class gets
    the same context (the rule oracle's table), ~1 when the context ignores the slot. ``norm``: the mean per-sample
    context norm at that scale. Needs no readout head; works on any ETRM run of labelled data."""
    model = _load(checkpoint, need_head=False)
    scale = float(model.inner.embed_scale)
    parts = list(_labelled_contexts(model, data_dir, rules_path, split, max_examples, batch_size))
    ctx = torch.cat([c.flatten(1).double() for c, _ in parts]) * scale
    t = torch.cat([t for _, t in parts])
    slots = {}
    for j, slot in enumerate(SLOTS):
        rows = t[:, j] >= 0
        if t[rows, j].unique().numel() >= 2:  # one class: nothing to separate
            slots[slot] = {
                "classes": int(t[rows, j].unique().numel()),
                "within": within_class_share(ctx[rows], t[rows, j]),
            }
    return {"split": split, "n": int(len(ctx)), "norm": float(ctx.norm(dim=1).mean()), "slots": slots}


def format_table(heldout: dict, train: Optional[dict] = None) -> list[str]:
    """Markdown rows: per family, whole-rule readout (held-out / train) and each slot's held-out accuracy."""
    lines = [
        "| family | n | rule named: held-out" + (" / train" if train else "") + " | per slot (held-out) |",
        "|---|---:|---:|---|",
    ]
    for fam, r in heldout["families"].items():
        tr = (train or {}).get("families", {}).get(fam)
        cell = f"{r['exact']:.2f}" + (f" / {tr['exact']:.2f}" if tr else (" / -" if train else ""))
        slots = ", ".join(f"{s} {a:.2f}" for s, a in r["slots"].items())
        lines.append(f"| {fam} | {r['n']} | {cell} | {slots} |")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> dict:
    ap = argparse.ArgumentParser(
        prog="python -m experiments.science.readout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "checkpoint",
        help="a checkpoint file or run directory (trained with encoder.rule_readout > 0, except for --separation)",
    )
    ap.add_argument("--data", required=True, help="the built dataset (the science --out's data/built)")
    ap.add_argument("--rules", required=True, help="the synthetic builder's rules.json")
    ap.add_argument("--split", choices=("test", "train"), default="test")
    ap.add_argument("--max-examples", type=int, default=4096)
    ap.add_argument(
        "--separation",
        action="store_true",
        help="instead: how categorical the context is per slot (the within-class share of its variance; "
        "any ETRM run, no readout head needed)",
    )
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    with user_errors(code=2):
        if args.separation:
            res = context_separation(args.checkpoint, args.data, args.rules, args.split, args.max_examples)
        else:
            res = readout_accuracy(args.checkpoint, args.data, args.rules, args.split, args.max_examples)
    if args.separation:
        print(
            f"{res['n']} {res['split']} examples, context norm {res['norm']:.1f}; within-class share of the "
            "context's variance per slot (0 = one context per class):"
        )
        for slot, r in res["slots"].items():
            print(f"  {slot}: {r['within']:.3f} ({r['classes']} classes)")
    else:
        print("\n".join(format_table(res)))
        print(f"all: {res['all']['n']} examples, rule named {res['all']['exact']:.3f}")
    if args.json:
        write_json_atomic(args.json, res)
    return res


if __name__ == "__main__":
    main()
