"""SparsePuzzleEmbedding + SignSGDSparse: exact update, lazy decay on touched rows, 2-process gloo equality."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from models.sparse_embedding import SignSGDSparse, SparsePuzzleEmbedding

N, D = 6, 3
LR, WD = 0.1, 0.5


def _init_table(emb: SparsePuzzleEmbedding) -> None:
    with torch.no_grad():
        emb.weights.copy_(torch.arange(N * D, dtype=torch.float32).view(N, D) / 10 - 0.8)


def _one_step(ids: torch.Tensor, coeff: torch.Tensor, world_size=None) -> SparsePuzzleEmbedding:
    emb = SparsePuzzleEmbedding(N, D, batch_size=ids.shape[0])
    _init_table(emb)
    opt = SignSGDSparse(emb, lr=LR, weight_decay=WD, world_size=world_size)
    emb.train()
    (emb(ids) * coeff).sum().backward()
    opt.step()
    return emb


def test_buffers_not_parameters_and_eval_lookup():
    emb = SparsePuzzleEmbedding(N, D, batch_size=2)
    assert list(emb.parameters()) == []
    assert set(emb.state_dict()) == {"weights"}
    assert emb.weights.abs().sum() == 0  # zero init
    _init_table(emb)
    emb.eval()
    out = emb(torch.tensor([4, 1]))
    assert torch.equal(out, emb.weights[[4, 1]]) and not out.requires_grad
    emb.train()
    with pytest.raises(ValueError, match="local batch of 2"):
        emb(torch.tensor([1, 2, 3]))


def test_sign_sgd_update_exact_with_duplicates():
    ids = torch.tensor([2, 5, 2, 0], dtype=torch.int32)
    coeff = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.3, -0.3], [-3.0, 1.0, 0.25], [1.0, 1.0, 1.0]])
    emb = _one_step(ids, coeff, world_size=1)
    ref = SparsePuzzleEmbedding(N, D, batch_size=1)
    _init_table(ref)
    w0 = ref.weights
    expected = w0.clone()
    grad_row2 = coeff[0] + coeff[2]  # duplicates are summed before the sign: [-2, -1, 0.75]
    for row, g in ((2, grad_row2), (5, coeff[1]), (0, coeff[3])):
        expected[row] = w0[row] * (1 - LR * WD) - LR * torch.sign(g)
    assert torch.allclose(emb.weights, expected, atol=1e-7)
    untouched = [1, 3, 4]
    assert torch.equal(emb.weights[untouched], w0[untouched])  # lazy decay: untouched rows unchanged


def test_lr_can_be_tensor_and_changed_per_step():
    ids = torch.tensor([1, 3])
    emb = SparsePuzzleEmbedding(N, D, batch_size=2)
    opt = SignSGDSparse(list(emb.buffers()), lr=torch.tensor(0.5), weight_decay=0.0, world_size=1)
    emb.train()
    emb(ids).sum().backward()
    opt.step()
    assert torch.allclose(emb.weights[1], torch.full((D,), -0.5))
    opt.zero_grad()
    for g in opt.param_groups:
        g["lr"] = 0.25
    emb(ids).sum().backward()
    opt.step()
    assert torch.allclose(emb.weights[3], torch.full((D,), -0.75))


def test_local_weights_stay_a_grad_leaf_after_to():
    emb = SparsePuzzleEmbedding(N, D, batch_size=2).to(torch.device("cpu"), dtype=torch.float32)
    emb = emb.to(torch.float64).to(torch.float32)
    assert emb.local_weights.is_leaf and emb.local_weights.requires_grad


def _worker(
    rank: int, world: int, init_file: str, out_dir: str, ids_all: torch.Tensor, coeff_all: torch.Tensor
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        per = ids_all.shape[0] // world
        sl = slice(rank * per, (rank + 1) * per)
        emb = _one_step(ids_all[sl], coeff_all[sl], world_size=None)  # world size from the process group
        torch.save(emb.weights, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_equal_one_process_on_concatenated_batch(tmp_path):
    ids_all = torch.tensor([2, 5, 1, 5, 2, 0], dtype=torch.int32)  # row 5 and 2 appear on both ranks
    coeff_all = torch.tensor(
        [[1.0, -2.0, 0.5], [0.3, 0.3, -0.3], [-3.0, 1.0, 0.25], [-1.0, -1.0, 1.0], [-2.0, 3.0, -1.0], [1.0, 1.0, 1.0]]
    )
    single = _one_step(ids_all, coeff_all, world_size=1).weights
    mp.start_processes(
        _worker,
        args=(2, str(tmp_path / "init"), str(tmp_path), ids_all, coeff_all),
        nprocs=2,
        join=True,
        start_method="fork",
    )  # fork: no re-import of torch in the children
    w0 = torch.load(tmp_path / "rank0.pt")
    w1 = torch.load(tmp_path / "rank1.pt")
    assert torch.equal(w0, w1)  # every rank applies the same update
    assert torch.allclose(w0, single, atol=1e-7)
    # and that differs from what one rank alone would have done
    alone = _one_step(ids_all[:3], coeff_all[:3], world_size=1).weights
    assert not torch.allclose(alone, single)
