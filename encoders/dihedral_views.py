"""`dihedral_views` encoder: the standard encoder whose aligned tokens also see the demo's dihedral views -- for
every dihedral map d, each output cell gets an embedding of the input colour d sends there (PAD where none;
core.ops.dihedral_sources) and of whether the output agrees with it (none / differs / equal), so "the output is
the input flipped / rotated by d" is a per-cell comparison the pooling can count. With the rule readout and a
normalised context, the first ETRM run to solve held-out puzzles of a spatial rule: 0.98 / 1.00 of the map probe's
fresh puzzles at the halting step, training seeds 0 / 1 (e88a31a, 8e3842c,
docs/record/2026-11-25-context-size-steps-halting.md). Aligned pair layout and square canvases only.

A variant of :mod:`encoders.standard`: one module, one registry line (``encoder=dihedral_views``). Before it was
an encoder, the same model was ``encoder=standard encoder.dihedral_views=true``; those checkpoints load as this
encoder (encoders.config.upgrade_encoder_config; the same parameter names).
"""

from __future__ import annotations

from typing import List, Literal, Optional

import pydantic
import torch
import torch.nn.functional as F
from torch import nn

from core.nn import trunc_normal_init_
from core.ops import VIEW_KINDS, view_agreement

from .config import ENCODER_REGISTRY
from .standard import StandardEncoder, StandardEncoderConfig
from .trunk import DemoTrunk


class DihedralViewsEncoderConfig(StandardEncoderConfig):
    name: Literal["dihedral_views"] = "dihedral_views"
    # which grid views each output cell is compared with (core.ops.view_sources): the 8 dihedral maps, and also the
    # 48 shifts by up to 3 cells (shift: content moved, background coming in; roll: wrapped)
    views: List[Literal["dihedral", "shift", "roll", "scale", "tile"]] = pydantic.Field(["dihedral"], min_length=1)

    @pydantic.model_validator(mode="after")
    def _aligned(self):
        if self.pair_layout != "aligned":
            raise ValueError(
                f"encoder dihedral_views: needs pair_layout=aligned (one token per output cell), got "
                f"pair_layout={self.pair_layout}"
            )
        return self


class DihedralViewsTrunk(DemoTrunk):
    """The per-demo trunk plus the dihedral-view embeddings (``view_tok`` [8, vocab, d]: the colour map d sends to a
    cell; ``view_eq`` [8, 3, d]: none / differs / equal), summed into each aligned token; with ``views`` naming
    shift / roll too, a per-demo summary of those views (``view_summary``: for each shift, the fraction of the
    demo's output cells with a source that equal it and that differ from it, projected to the width) added to every
    token of the demo -- a per-cell table of 96 more views would cost 2.3x the science step."""

    def init_cell_features(self, vocab_size: int, d: int, std: float) -> None:
        self.side = self.square_side("dihedral_views")
        self.per_cell = "dihedral" in self.cfg.views
        self.summarised = tuple(k for k in self.cfg.views if k != "dihedral")
        if self.per_cell:
            self.view_tok = nn.Parameter(trunc_normal_init_(torch.empty(8, vocab_size, d), std / 2, std_of="normal"))
            self.view_eq = nn.Parameter(trunc_normal_init_(torch.empty(8, 3, d), std / 2, std_of="normal"))
        if self.summarised:
            k = sum(VIEW_KINDS[v] for v in self.summarised)
            self.view_summary = nn.Parameter(trunc_normal_init_(torch.empty(2 * k, d), std, std_of="normal"))

    def cell_features(self, inp: torch.Tensor, out: torch.Tensor) -> Optional[torch.Tensor]:
        """[n, S, d] of full canvases inp / out [n, S]: for each dihedral map, the embedding of the input colour the
        map sends to the cell plus that of the agreement (core.ops.view_agreement); plus the demo's summary of the
        shift / roll views."""
        n, S = inp.shape
        feats = 0
        if self.per_cell:
            colour, agreement = view_agreement(inp, out, self.side, ("dihedral",))  # [n, 8, S] each
            V = self.view_tok.shape[1]
            maps = torch.arange(8, device=inp.device)[None, :, None]
            # one bag of 16 rows per cell of one table (never an [n, 8, S, d] tensor)
            rows = torch.cat((maps * V + colour, 8 * V + maps * 3 + agreement), 1).permute(0, 2, 1).reshape(n * S, 16)
            table = torch.cat((self.view_tok.flatten(0, 1), self.view_eq.flatten(0, 1)))
            feats = F.embedding_bag(rows, table, mode="sum").view(n, S, -1)
        if self.summarised:
            _, agreement = view_agreement(inp, out, self.side, self.summarised)  # [n, K, S]
            seen = (agreement > 0).sum(-1).clamp_min(1).float()
            frac = torch.cat(((agreement == 2).sum(-1) / seen, (agreement == 1).sum(-1) / seen), -1)  # [n, 2K]
            feats = feats + (frac.to(self.view_summary.dtype) @ self.view_summary)[:, None, :]
        return feats


@ENCODER_REGISTRY.register("dihedral_views", config=DihedralViewsEncoderConfig)
class DihedralViewsEncoder(StandardEncoder):
    trunk_cls = DihedralViewsTrunk
