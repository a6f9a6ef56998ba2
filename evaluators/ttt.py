"""Test-time training in the evaluation path: each test batch is fitted to its own demonstration pairs
(``models.ttt``) before it is predicted, with the same rollout, voting and metrics as plain evaluation.

``TestTimeTraining(model, settings).run(plan, batch, device)`` replaces ``plan.run(batch, device)`` in
``evaluators.inference.evaluate``:

* ``context`` / ``embedding``: one per-sample tensor per row of the batch, fitted side by side (a row's fit does not
  depend on the other rows), then the batch is rolled out with that prefix context;
* ``all`` / ``gather`` (the core's gather forms only): the rows are grouped by puzzle (``puzzle_identifiers``: one
  augmented copy of one puzzle); per group the model's weights are fitted on that group's demos, the group is
  predicted, and the weights are restored exactly before the next group, so nothing learned on one puzzle reaches
  another.

Per fitted group it records the demo fit (fraction of demos reproduced exactly) before and after, the steps and
the seconds: ``summary()`` gives the ``ttt/*`` metrics, ``records`` the per-puzzle list (evaluate.py writes it to
``ttt.json``).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

from evaluators import dist as edist
from models.rollout import Rollout, act_model_of
from models.ttt import (
    GATHER_PARAMS,
    DemoSet,
    TTTSettings,
    WeightsSnapshot,
    demo_set,
    embedding_init,
    fit,
    frozen_weights,
    loo_demos,
)


class TestTimeTraining:
    def __init__(self, model: Any, settings: TTTSettings, pool_of: Optional[Sequence[int]] = None):
        """``pool_of`` (``settings.pool``): per puzzle identifier, the index of its original puzzle; the rows whose
        identifiers share it are fitted together."""
        self.settings = settings
        if settings.pool and pool_of is None:
            raise ValueError("pooling the augmented copies needs each identifier's original puzzle (pool_of)")
        self.pool_of = None if not settings.pool else torch.as_tensor(list(pool_of), dtype=torch.long)
        self.act = act_model_of(model)
        self.encoder = getattr(self.act, "encoder", None)
        if settings.params == "context" and self.encoder is None:
            raise ValueError(
                "ttt_params=context refines a demo encoder's context; this model has no encoder "
                "(TRM): use ttt_params=embedding (a fresh puzzle embedding) or all"
            )
        if self.encoder is not None and self.encoder.capabilities.recurrent:
            raise ValueError(
                "test-time training is not supported for the recurrent encoder (its context changes at every ACT "
                "step, a fitted context or copy of the weights has no fixed encoding to start from)"
            )
        if self.encoder is None and getattr(self.act, "puzzle_emb", None) is None:
            raise ValueError(
                "a model without a demo encoder is fitted through its puzzle embedding, and this one has "
                "none (arch.puzzle_emb_ndim=0)"
            )
        if settings.params == "gather":
            WeightsSnapshot(self.act, GATHER_PARAMS)  # refuses a core without a learned gather, before any batch
        self.records: list[dict[str, Any]] = []

    # -- the evaluation hook ---------------------------------------------------------------------------------
    def run(self, plan: Any, batch: dict, device: torch.device) -> Rollout:
        if self.settings.fits_weights:
            return self._run_groups(plan, batch, device)
        with torch.inference_mode(False), torch.enable_grad(), frozen_weights(self.act):
            prefix = self._fit_rows(batch, ids=batch["puzzle_identifiers"])
        return plan.run(batch, device, prefix_context=prefix)

    def gather(self) -> None:
        """Every rank's records on every call's rank 0 (distributed evaluation: each rank fitted its own rows)."""
        parts = edist.gather_to_rank0(self.records)
        if parts is not None:
            self.records = [r for part in parts for r in part]

    def summary(self) -> dict[str, float]:
        """``ttt/fit_before``, ``ttt/fit_after`` (mean over fits of puzzles with demos), ``ttt/steps``,
        ``ttt/num_puzzles`` (puzzle copies fitted), ``ttt/num_fits`` (fits: a copy whose test inputs fall in two
        batches is fitted in each) and ``ttt/seconds_per_puzzle`` (all fitting time over the puzzle copies, so a
        copy fitted twice costs both); call :meth:`gather` first on several ranks."""
        recs = [r for r in self.records if r["num_demos"] > 0]
        mean = lambda k: sum(r[k] for r in recs) / len(recs) if recs else math.nan  # noqa: E731
        seconds = sum(r["seconds"] for r in self.records)
        puzzles = len({r["puzzle_identifier"] for r in self.records})
        return {
            "ttt/fit_before": mean("fit_before"),
            "ttt/fit_after": mean("fit_after"),
            "ttt/steps": float(self.settings.steps),
            "ttt/num_puzzles": float(puzzles),
            "ttt/num_fits": float(len(self.records)),
            "ttt/seconds_per_puzzle": seconds / puzzles if puzzles else math.nan,
        }

    # -- context / embedding: per-row tensors ----------------------------------------------------------------
    def _fit_rows(self, batch: dict, ids: torch.Tensor, extra: tuple = ()) -> torch.Tensor:
        """Fit the batch's per-row tensor (and ``extra`` parameters); returns the prefix [b, P, H] to predict with."""
        s, act = self.settings, self.act
        demos = demo_set(batch)
        # a core that reads the demo memory sees, for demo j, the memory of the demos the encoder may see
        visible = loo_demos(batch, demos, s.leave_one_out) if act.reads_memory else None
        if self.encoder is None:  # TRM: a puzzle embedding per row (its own if trained, else the trained mean)
            theta0 = embedding_init(act, batch["puzzle_identifiers"])
            res = fit(
                act,
                demos,
                theta0,
                lambda th: th.index_select(0, demos.owner),
                steps=s.steps,
                lr=self._theta_lr,
                extra_params=extra,
                extra_lr=self._extra_lr,
            )
            final = res.theta
        elif s.params == "embedding":
            with torch.no_grad():
                theta0 = self._encode(batch["demo_inputs"], batch["demo_labels"], batch["demo_mask"])
            res = fit(
                act, demos, theta0, lambda th: th.index_select(0, demos.owner), steps=s.steps, lr=s.lr, visible=visible
            )
            final = res.theta
        else:
            res, final = self._fit_offset(batch, demos, extra, visible)
        self._record(batch, ids, demos, res)
        return final.to(next(act.parameters()).dtype)

    @property
    def _theta_lr(self) -> float:
        """The per-row tensor's learning rate: ``ttt_lr``; 0 for ``gather`` (only the forms move)."""
        return 0.0 if self.settings.params == "gather" else self.settings.lr

    @property
    def _extra_lr(self) -> float:
        """The fitted weights' learning rate: ``ttt_weight_lr`` for ``all``; ``ttt_lr`` for ``gather``'s forms."""
        return self.settings.lr if self.settings.params == "gather" else self.settings.weight_lr

    def _fits_encoder(self, extra: tuple) -> bool:
        """Whether the encoder's weights move in this fit (``all``), so the demos must be re-encoded at every step."""
        return bool(extra) and self.settings.params == "all"

    def _fit_offset(self, batch: dict, demos: DemoSet, extra: tuple, visible: Optional[tuple]):
        """ETRM ``context`` (and ``all``): an offset on the encoder's output (its latent, for lpn); leave-one-out
        encodings for the demos, all demos for the test input."""
        s, enc = self.settings, self.encoder
        loo = visible if visible is not None else loo_demos(batch, demos, s.leave_one_out)
        full = (batch["demo_inputs"].clone(), batch["demo_labels"].clone(), batch["demo_mask"].clone().bool())
        latent = hasattr(enc, "encode_latent") and hasattr(enc, "context_from_latent")
        space = (lambda d: enc.encode_latent(*d)[0]) if latent else (lambda d: enc(*d).context)
        to_ctx = enc.context_from_latent if latent else (lambda x: x)
        with torch.no_grad():
            base_full = space(full)
            base_loo = None if self._fits_encoder(extra) else space(loo)  # else re-encoded at each step
        theta0 = torch.zeros_like(base_full)

        def prefix_of(th: torch.Tensor) -> torch.Tensor:
            base = base_loo if base_loo is not None else space(loo)
            return to_ctx(base + th.index_select(0, demos.owner))

        res = fit(
            self.act,
            demos,
            theta0,
            prefix_of,
            steps=s.steps,
            lr=self._theta_lr,
            extra_params=extra,
            extra_lr=self._extra_lr,
            visible=visible,
            encoder_fixed=not self._fits_encoder(extra),
        )
        with torch.no_grad():
            final = to_ctx((space(full) if self._fits_encoder(extra) else base_full) + res.theta)
        return res, final

    def _encode(self, di, dl, dm) -> torch.Tensor:
        return self.encoder(di.clone(), dl.clone(), dm.clone().bool()).context.detach()

    # -- all: one copy of the weights per puzzle ---------------------------------------------------------------
    def _run_groups(self, plan: Any, batch: dict, device: torch.device) -> Rollout:
        """One fit per group of rows: a puzzle copy (its identifier), or with ``pool`` a puzzle (every copy of it
        in the batch: the weights see all their demos, each copy keeps its own per-row tensor)."""
        ids = batch["puzzle_identifiers"]
        keys = ids if self.pool_of is None else self.pool_of.to(ids.device).index_select(0, ids.long())
        parts, order = [], []
        only = GATHER_PARAMS if self.settings.params == "gather" else None
        snap = WeightsSnapshot(self.act, only)  # the weights every group starts from, restored after each
        for key in torch.unique(keys).tolist():
            rows = (keys == key).nonzero().squeeze(-1)
            sub = {
                k: (v.index_select(0, rows) if torch.is_tensor(v) and v.shape[:1] == ids.shape else v)
                for k, v in batch.items()
            }
            try:
                with torch.inference_mode(False), torch.enable_grad():
                    prefix = self._fit_rows(sub, ids=sub["puzzle_identifiers"], extra=tuple(snap.trainable()))
                for p in snap.params:
                    p.requires_grad_(False)
                parts.append(plan.run(sub, device, prefix_context=prefix))
            finally:
                snap.restore()
            order.append(rows)
        return merge_rollouts(parts, torch.cat(order))

    # -- bookkeeping ---------------------------------------------------------------------------------------------
    def _record(self, batch: dict, ids: torch.Tensor, demos: DemoSet, res: Any) -> None:
        real = batch["example_index"] >= 0 if "example_index" in batch else torch.ones_like(ids, dtype=torch.bool)
        seen: dict[int, int] = {}
        for row, pid in enumerate(ids.tolist()):
            if bool(real[row]) and pid not in seen:
                seen[pid] = row
        share = res.seconds / max(1, len(seen))
        for pid, row in seen.items():
            self.records.append(
                {
                    "puzzle_identifier": int(pid),
                    "num_demos": int(demos.per_row[row]),
                    "fit_before": _num(res.fit_before[row]),
                    "fit_after": _num(res.fit_after[row]),
                    "steps": res.steps,
                    "seconds": share,
                }
            )


def _num(x: torch.Tensor) -> float:
    v = float(x)
    return v if math.isfinite(v) else 0.0


def merge_rollouts(parts: list[Rollout], rows: torch.Tensor) -> Rollout:
    """One Rollout of the batch from those of its row groups (``rows``: the batch row of each concatenated row)."""
    inv = torch.empty_like(rows)
    inv[rows] = torch.arange(rows.numel(), device=rows.device)
    outs = {k: torch.cat([p.outputs[k] for p in parts]).index_select(0, inv) for k in parts[0].outputs}
    sums: Optional[dict] = None
    if all(p.metric_sums is not None for p in parts):
        sums = {k: sum(p.metric_sums[k] for p in parts) for k in parts[0].metric_sums}
    return Rollout(
        carry=None,
        outputs=outs,
        steps=torch.cat([p.steps for p in parts]).index_select(0, inv),
        num_steps=max(p.num_steps for p in parts),
        metric_sums=sums,
        metrics_exact=all(p.metrics_exact for p in parts),
    )


__all__ = ["TestTimeTraining", "merge_rollouts"]
