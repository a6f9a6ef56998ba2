"""TRM that reads the demonstrations cell by cell (``arch=trm_memory``): demo memory.

The pooled context slots carry rules that have a name (a dihedral map, a gravity direction, a colour table) but not
relational ones (a shift, a size threshold): the slots are 2 x 64 numbers. Here every cell of the core can also
attend to the encoder's per-cell states of every demonstration (:class:`encoders.interface.DemoMemory`: one token
per demo cell, holding its input and its output colour after the encoder's per-demo layers), beside the pooled
slots. Each memory token is keyed by its state, its offsets from the edges of its demo's input grid and of its
output grid (``core.ops.grid_coordinates``, the core's own kind of position) and which demo slot it belongs to, so a
query cell can look up "the demo cells that sit where I sit" or "the demo cells whose input colour is mine" and
read what they became.

One read (:class:`MemoryRead`) is a multi-head cross-attention from a state of the core to the memory plus a
learned null key (its value is zero: a sample without demos reads nothing, never NaN); its output is added to the
latent update's injection (``z_L = net(z_L, z_H + x + read)``). ``memory_read`` chooses where in the recursion:

=========  ====================================================================================================
``once``   once per supervision step, from the input embedding ``x`` (the read is the same for every cycle)
``cycle``  once per H cycle, from ``z_H + x`` (the default)
``step``   at every latent update, from ``z_L + z_H + x``
=========  ====================================================================================================

The memory's keys and values are projected once per supervision step. Built inside an ETRM whose encoder gives the
memory (:attr:`encoders.interface.DemoEncoder.gives_memory`: ``aggregation: tokens``, ``pair_layout: aligned``);
``memory_width`` (the encoder's width) is filled from the encoder when left null. Square canvas only (the grid
offsets of ``trm_grid``, which this variant extends). ``arch=trm_pointer_memory``: the same memory on the
pointer-RoPE core of ``trm_pointer`` (where a cell copies from is pointed by the context; what the demos show cell by
cell is read from the memory).
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from core.nn import rms_norm
from encoders.interface import DemoMemory
from models.layers import CastedEmbedding, CastedLinear, trunc_normal_init_
from models.variants.trm_grid import GridCoordEmbedding, TRMGrid, TRMGridConfig, TRMGridInner
from models.variants.trm_pointer import TRMPointer, TRMPointerConfig, TRMPointerInner


class MemoryFields(BaseModel):
    """Where the core reads the demo memory and the memory's sizes (the fields every memory core adds)."""

    model_config = ConfigDict(extra="forbid")
    memory_read: Literal["once", "cycle", "step"] = "cycle"
    memory_width: Optional[int] = Field(None, gt=0)  # the encoder's width; null: filled from the encoder
    memory_max_demos: int = Field(16, gt=0)  # demo-slot embeddings (a batch with more demo slots is refused)

    def for_encoder(self, encoder_hidden_size: int):
        """This config with ``memory_width`` filled from the encoder it reads (when null)."""
        if self.memory_width is not None:
            return self
        return self.model_copy(update={"memory_width": int(encoder_hidden_size)})


class TRMMemoryConfig(MemoryFields, TRMGridConfig):
    """``trm_grid``'s fields plus the memory's (:class:`MemoryFields`)."""

    name: Literal["trm_memory"] = "trm_memory"  # type: ignore[assignment]


class TRMPointerMemoryConfig(MemoryFields, TRMPointerConfig):
    """``trm_pointer``'s fields plus the memory's: pointer RoPE for where a cell copies from, the memory for what
    the demos show cell by cell."""

    name: Literal["trm_pointer_memory"] = "trm_pointer_memory"  # type: ignore[assignment]


class MemoryRead(nn.Module):
    """Cross-attention of the core's cells over a :class:`DemoMemory` (see the module docstring).

    ``keys(memory, demo_inputs, demo_labels)`` -> (k, v, mask) once per supervision step; ``forward(h, kv)`` ->
    [b, s, hidden], the read of every position of ``h`` [b, s, hidden]."""

    def __init__(
        self, hidden: int, num_heads: int, width: int, side: int, max_demos: int, vocab: int, init_std: float, cast_to
    ) -> None:
        super().__init__()
        self.hidden, self.num_heads, self.max_demos = hidden, num_heads, max_demos
        self.embed_scale = hidden**0.5
        self.in_proj = CastedLinear(width, hidden)
        self.coords_in = GridCoordEmbedding(side, hidden, init_std, cast_to)  # where the cell sits in the demo input
        self.coords_out = GridCoordEmbedding(side, hidden, init_std, cast_to)  # ... and in the demo output
        self.demo = CastedEmbedding(max_demos, hidden, init_std=init_std, cast_to=cast_to)
        self.colour_out = CastedEmbedding(vocab, hidden, init_std=init_std, cast_to=cast_to)  # the cell's output colour
        self.q_proj = CastedLinear(hidden, hidden)
        self.kv_proj = CastedLinear(hidden, 2 * hidden)
        self.o_proj = CastedLinear(hidden, hidden)
        self.null_key = nn.Parameter(trunc_normal_init_(torch.empty(hidden), std=1.0))

    def keys(self, memory: DemoMemory, demo_inputs, demo_labels, colour_in: nn.Module, dtype: torch.dtype):
        b, D, S = demo_inputs.shape
        if D > self.max_demos:
            raise ValueError(
                f"arch=trm_memory: {D} demo slots but arch.memory_max_demos={self.max_demos} (raise it, or set "
                f"max_demos)"
            )
        cin = self.coords_in(demo_inputs.reshape(b * D, S)).view(b, D, S, -1)
        cout = self.coords_out(demo_labels.reshape(b * D, S)).view(b, D, S, -1)
        cells = (
            cin
            + cout
            + colour_in(demo_inputs.reshape(b * D, S)).view(b, D, S, -1)
            + self.colour_out(demo_labels.reshape(b * D, S).to(torch.int32)).view(b, D, S, -1)
        )
        rows = torch.arange(b, device=cells.device)[:, None]
        where = cells[rows, memory.demo[None, :], memory.cell] + self.demo(memory.demo)  # [b, M, hidden]
        m = rms_norm(self.in_proj(memory.states.to(dtype)) + self.embed_scale * where.to(dtype), 1e-5)
        k, v = self.kv_proj(m).chunk(2, dim=-1)
        null_k = self.null_key.to(dtype).expand(b, 1, -1)
        k = torch.cat([null_k, k], dim=1)
        v = torch.cat([torch.zeros_like(null_k), v], dim=1)
        mask = torch.cat([memory.mask.new_ones(b, 1), memory.mask.bool()], dim=1)
        heads = lambda t: t.view(b, t.shape[1], self.num_heads, -1).transpose(1, 2)  # noqa: E731
        return heads(k), heads(v), mask[:, None, None, :]

    def forward(self, h: torch.Tensor, kv) -> torch.Tensor:
        k, v, mask = kv
        b, s, _ = h.shape
        q = self.q_proj(h).view(b, s, self.num_heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.hidden))


class TRMMemoryInner(TRMGridInner):
    reads_memory = True  # models.etrm.ETRM passes the encoder's DemoMemory to forward()

    def __init__(self, config: MemoryFields, **kw) -> None:
        super().__init__(config, **kw)
        if config.memory_width is None:
            raise ValueError(
                "arch=trm_memory: memory_width is null; the model is built inside an ETRM, which fills it from the "
                "encoder's hidden_size (training.build.build_etrm_model)"
            )
        self.memory_read = MemoryRead(
            config.hidden_size,
            config.num_heads,
            config.memory_width,
            self.canvas_side("arch=trm_memory"),
            config.memory_max_demos,
            self.vocab_size,
            init_std=self.embed_init_std,
            cast_to=self.forward_dtype,
        )

    def embed_inputs(self, batch, prefix_context: Optional[torch.Tensor], memory: DemoMemory) -> torch.Tensor:
        """The input embedding of a step (a variant that also reads the demos there overrides it)."""
        return self.input_embeddings(batch["inputs"], batch["puzzle_identifiers"], prefix_context)

    def recursion(self, z_H, z_L, x, cos_sin, read):
        """One outer cycle with the memory read where ``memory_read`` puts it (see the module docstring)."""
        where = self.config.memory_read
        inj = z_H + x
        if where == "cycle":
            inj = inj + read(inj)
        for _ in range(self.config.L_cycles):
            z_L = self.L_level(z_L, inj + read(z_L + inj) if where == "step" else inj, cos_sin)
        z_H = self.L_level(z_H, z_L, cos_sin)
        return z_H, z_L

    def forward(self, carry, batch, prefix_context: Optional[torch.Tensor] = None, memory: Optional[DemoMemory] = None):
        if memory is None:
            raise ValueError(
                "arch=trm_memory reads the demonstrations' per-cell states: run it as an ETRM (pretrain_encoder.py) "
                "whose encoder gives them (aggregation=tokens, pair_layout=aligned)"
            )
        cos_sin = self.cos_sin(batch["inputs"])
        x = self.embed_inputs(batch, prefix_context, memory)
        kv = self.memory_read.keys(memory, batch["demo_inputs"], batch["demo_labels"], self.token_embeddings, x.dtype)
        read = lambda h: self.memory_read(h, kv)  # noqa: E731
        if self.config.memory_read == "once":
            x = x + read(x)
        z_H, z_L = carry.z_H, carry.z_L
        with torch.no_grad():
            for _ in range(self.config.H_cycles - 1):
                z_H, z_L = self.recursion(z_H, z_L, x, cos_sin, read)
        z_H, z_L = self.recursion(z_H, z_L, x, cos_sin, read)  # the only cycle with gradient
        logits, q_halt, q_continue = self.heads(z_H)
        return type(carry)(z_H=z_H.detach(), z_L=z_L.detach()), logits, (q_halt, q_continue)


class TRMMemory(TRMGrid):
    inner_cls = TRMMemoryInner


class TRMPointerMemoryInner(TRMMemoryInner, TRMPointerInner):
    """The memory read of :class:`TRMMemoryInner` on the pointer-RoPE stem of ``trm_pointer`` (its hooks)."""


class TRMPointerMemory(TRMPointer):
    inner_cls = TRMPointerMemoryInner
