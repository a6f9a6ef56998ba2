"""Per-puzzle embedding table trained by sparse sign-SGD (pitfall 23).

The table is a **buffer** (``weights``, persistent, fp32, zero-initialised by default), not a parameter: it is
not seen by AdamATan2, weight decay of the dense optimizer or the EMA. In training, ``forward`` copies the
rows of the batch into a small local buffer ``local_weights`` [batch, dim] that requires grad; after backward
:class:`SignSGDSparse` reads its gradient together with ``local_ids`` and updates only the touched rows:

    g_r   = sum of the gradients of all occurrences of row r in the *global* batch (all ranks)
    w_r  <- w_r * (1 - lr * weight_decay) - lr * sign(g_r)        (decoupled weight decay, touched rows only)

Under ``torch.distributed`` the ids and gradients of every rank are all-gathered, so every rank applies the
same update and the replicated tables stay identical. Use ``broadcast_buffers=False`` if the model is wrapped
in DDP (the table can be large).
"""

from __future__ import annotations

from typing import Iterable, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from models.layers import trunc_normal_init_


class SparsePuzzleEmbedding(nn.Module):
    """Embedding table as a buffer with a per-batch local copy that receives the gradient.

    Args:
        num_embeddings: rows (number of puzzle identifiers, id 0 = blank).
        embedding_dim: width of a row (``puzzle_emb_ndim``).
        batch_size: local (per-rank) batch size; training batches must have exactly this many rows.
        init_std: 0 gives the zero init of TRM.
        cast_to: dtype of the returned embeddings.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        batch_size: int,
        init_std: float = 0.0,
        cast_to: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.cast_to = cast_to
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.batch_size = batch_size
        self.register_buffer(
            "weights", trunc_normal_init_(torch.empty(num_embeddings, embedding_dim), std=init_std), persistent=True
        )
        self.register_buffer(
            "local_weights", torch.zeros(batch_size, embedding_dim, requires_grad=True), persistent=False
        )
        self.register_buffer("local_ids", torch.zeros(batch_size, dtype=torch.int32), persistent=False)

    def _apply(self, fn, recurse: bool = True):  # keep local_weights a grad-requiring leaf after .to()/.cuda()
        out = super()._apply(fn, recurse)
        if not self.local_weights.is_leaf or not self.local_weights.requires_grad:
            self.local_weights = self.local_weights.detach().requires_grad_(True)
        return out

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.ndim > 1:
            ids = ids.squeeze(-1)
        if not self.training:
            return self.weights[ids].to(self.cast_to)
        if ids.shape[0] != self.batch_size:
            raise ValueError(
                f"SparsePuzzleEmbedding was built for a local batch of {self.batch_size} rows but got "
                f"{ids.shape[0]} in training mode (training batches must have the configured size)"
            )
        with torch.no_grad():
            self.local_weights.copy_(self.weights[ids])
            self.local_ids.copy_(ids)
        return self.local_weights.to(self.cast_to)


class SignSGDSparse(torch.optim.Optimizer):
    """Sign-SGD with decoupled weight decay on the rows touched in the (global) batch.

    ``params``: a :class:`SparsePuzzleEmbedding`, or its three buffers (``module.buffers()``: local_weights,
    local_ids, weights), or a list of param-group dicts whose ``params`` are such triples.
    ``lr`` may be a float or a 0-dim tensor; the training loop may overwrite ``param_groups[i]["lr"]`` each step.
    ``world_size``: None = ``torch.distributed`` world size when initialised, else 1.
    """

    def __init__(
        self,
        params: Union[SparsePuzzleEmbedding, Iterable],
        lr: Union[float, torch.Tensor] = 1e-2,
        weight_decay: float = 0.1,
        world_size: Optional[int] = None,
    ) -> None:
        if not float(lr) >= 0.0:
            raise ValueError(f"SignSGDSparse: invalid lr {lr}")
        if not weight_decay >= 0.0:
            raise ValueError(f"SignSGDSparse: invalid weight_decay {weight_decay}")
        if isinstance(params, SparsePuzzleEmbedding):
            params = [params.local_weights, params.local_ids, params.weights]
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, world_size=world_size))

    @staticmethod
    def _split(group_params):
        grads_holder = ids = weights = None
        for p in group_params:
            if p.requires_grad:
                grads_holder = p
            elif p.ndim == 1:
                ids = p
            elif p.ndim == 2:
                weights = p
        if grads_holder is None or ids is None or weights is None or len(group_params) != 3:
            raise ValueError(
                "SignSGDSparse expects each param group to hold a SparsePuzzleEmbedding's three buffers "
                "(local_weights requiring grad, local_ids [b], weights [N, D])"
            )
        return grads_holder, ids, weights

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            local, ids, weights = self._split(group["params"])
            if local.grad is None:
                continue
            world = group["world_size"]
            if world is None:
                world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
            sparse_sign_sgd_update_(
                weights, local.grad, ids, lr=group["lr"], weight_decay=group["weight_decay"], world_size=world
            )
        return loss


def sparse_sign_sgd_update_(
    weights: torch.Tensor,
    local_grad: torch.Tensor,
    local_ids: torch.Tensor,
    *,
    lr: Union[float, torch.Tensor],
    weight_decay: float,
    world_size: int = 1,
) -> None:
    """In-place sign-SGD update of ``weights`` rows named by ``local_ids`` (gathered over ranks if world_size > 1)."""
    grad, ids = local_grad, local_ids
    if world_size > 1:
        n, d = local_grad.shape
        grad = torch.empty(world_size * n, d, dtype=local_grad.dtype, device=local_grad.device)
        ids = torch.empty(world_size * n, dtype=local_ids.dtype, device=local_ids.device)
        dist.all_gather_into_tensor(grad, local_grad.contiguous())
        dist.all_gather_into_tensor(ids, local_ids.contiguous())
    rows, inverse = torch.unique(ids.long(), return_inverse=True)
    summed = torch.zeros(rows.shape[0], grad.shape[1], dtype=grad.dtype, device=grad.device)
    summed.index_add_(0, inverse, grad)
    updated = weights[rows] * (1.0 - lr * weight_decay) - lr * torch.sign(summed).to(weights.dtype)
    weights[rows] = updated.to(weights.dtype)
