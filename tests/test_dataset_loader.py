"""dataset.loader: DDP sharding, test-mode exactly-once, max_groups, resume, encoder mode, translation,
multiple data paths, original-TRM directories, worker processes."""

import gc
import json
import multiprocessing as mp
import os

import numpy as np
import pytest
import torch

from dataset.canvas import content_extents, find_content_extent, translate_canvas
from dataset.errors import DatasetError
from dataset.loader import PuzzleDataset, PuzzleDatasetConfig, create_dataloader
from dataset.tokens import IGNORE_LABEL_ID
from tests.toy_data import built_synthetic_arc, write_toy_dataset


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("synth")
    built, _ = built_synthetic_arc(
        root, num_train=24, num_test=6, num_aug=3, mode="etrm", max_grid=7, seed=3, canvas=30, prefix="syn"
    )
    return built


def cfg(path, **kw) -> PuzzleDatasetConfig:
    base = dict(data_paths=[path], global_batch_size=8, seed=0)
    base.update(kw)
    return PuzzleDatasetConfig(**base)


def take(ds, n):
    it = iter(ds)
    return [next(it) for _ in range(n)]


def test_batch_keys_dtypes_and_label_mapping(synth_dir):
    name, b, eff = take(PuzzleDataset(cfg(synth_dir, translate_augment=False), "train"), 1)[0]
    assert name == "all" and eff == 8
    assert b["inputs"].dtype == torch.int32 and b["inputs"].shape == (8, 900)
    assert b["labels"].dtype == torch.int64 and b["puzzle_identifiers"].dtype == torch.int32
    assert b["example_index"].dtype == torch.int64
    # disk labels: PAD(0) -> -100, everything else kept; rows match the stored example exactly
    raw = np.load(os.path.join(synth_dir, "train", "all__labels.npy"))
    raw_in = np.load(os.path.join(synth_dir, "train", "all__inputs.npy"))
    for k in range(8):
        e = int(b["example_index"][k])
        expect = raw[e].astype(np.int64)
        expect[expect == 0] = IGNORE_LABEL_ID
        assert np.array_equal(b["labels"][k].numpy(), expect)
        assert np.array_equal(b["inputs"][k].numpy(), raw_in[e])
    assert (b["labels"] == IGNORE_LABEL_ID).any() and (b["labels"] == 1).any()  # PAD ignored, EOS supervised


def test_ddp_sharding_disjoint_union_is_global(synth_dir):
    glob = take(PuzzleDataset(cfg(synth_dir, global_batch_size=8), "train"), 6)
    r0 = take(PuzzleDataset(cfg(synth_dir, global_batch_size=8, rank=0, world_size=2), "train"), 6)
    r1 = take(PuzzleDataset(cfg(synth_dir, global_batch_size=8, rank=1, world_size=2), "train"), 6)
    for (_, g, eg), (_, a, ea), (_, b, eb) in zip(glob, r0, r1):
        assert eg == ea == eb == 8
        ia, ib = set(a["example_index"].tolist()), set(b["example_index"].tolist())
        assert len(a["example_index"]) == len(b["example_index"]) == 4
        assert not ia & ib
        assert torch.equal(torch.cat([a["example_index"], b["example_index"]]), g["example_index"])
        # translation is drawn for the global batch: a rank's rows equal the single-process rows
        assert torch.equal(torch.cat([a["inputs"], b["inputs"]]), g["inputs"])


def test_epochs_reshuffle_and_are_seeded(synth_dir):
    ds = PuzzleDataset(cfg(synth_dir), "train")
    n0 = ds.num_batches(0)
    batches = take(ds, n0 + 2)
    e0 = torch.cat([b["example_index"] for _, b, _ in batches[:n0]])
    assert len(set(e0.tolist())) == len(e0)  # one epoch: no example twice
    again = take(PuzzleDataset(cfg(synth_dir), "train"), n0 + 2)
    assert all(torch.equal(a[1]["inputs"], b[1]["inputs"]) for a, b in zip(batches, again))
    other = take(PuzzleDataset(cfg(synth_dir, seed=1), "train"), 2)
    assert not torch.equal(other[0][1]["example_index"], batches[0][1]["example_index"])
    assert ds.state_dict()["epoch"] == 1


def test_one_puzzle_per_group_per_epoch(synth_dir):
    ds = PuzzleDataset(cfg(synth_dir, global_batch_size=2), "train")
    s = ds.sets[0]
    plan = ds._epoch_plan(0, 0).reshape(-1)
    puzzles = s.example_puzzle[plan]
    groups = np.searchsorted(s.group_indices, puzzles, side="right") - 1
    # every puzzle seen belongs to a distinct group (one augmented copy per group per epoch)
    per_group = {}
    for g, p in zip(groups, puzzles):
        per_group.setdefault(int(g), set()).add(int(p))
    assert all(len(v) == 1 for v in per_group.values())
    assert len(per_group) >= s.num_groups - 2  # only the dropped last partial batch may miss groups


@pytest.mark.parametrize("world_size,gbs", [(1, 8), (2, 8), (3, 6), (1, 5), (2, 12), (4, 32)])
def test_whole_groups_never_straddle_a_local_batch_and_visit_every_example_once(synth_dir, world_size, gbs):
    pidx = np.load(os.path.join(synth_dir, "test", "all__puzzle_indices.npy"))
    gidx = np.load(os.path.join(synth_dir, "test", "all__group_indices.npy"))
    sizes = np.diff(pidx[gidx])  # examples per group (original puzzle): 4 and 8 here
    group_of = np.repeat(np.arange(len(sizes)), sizes)
    local = gbs // world_size

    def slots(whole: bool) -> tuple[list, dict]:
        runs = [
            list(
                PuzzleDataset(
                    cfg(synth_dir, global_batch_size=gbs, test_mode=True, rank=r, world_size=world_size, **whole),
                    "test",
                )
            )
            for r in range(world_size)
        ]
        assert len({len(b) for b in runs}) == 1  # same number of batches on every rank (no DDP hang)
        seen, where = [], {}
        for j in range(len(runs[0])):
            for r in range(world_size):
                idx = runs[r][j][1]["example_index"]
                ex = idx[idx >= 0].tolist()
                assert (idx[: len(ex)] >= 0).all()  # a local batch's real rows first, padding after
                seen += ex
                for g in set(group_of[ex].tolist()):
                    where.setdefault(g, []).append((j, r))
        return seen, where

    seen, where = slots({"whole_groups": True})
    assert seen == list(range(int(pidx[-1])))  # every example exactly once, in order
    # a group fills exactly the local batches it needs: one when it fits, else ceil(size / local), never more
    assert {g: len(w) for g, w in where.items()} == {g: -(-int(n) // local) for g, n in enumerate(sizes)}
    seen, dense = slots({})
    assert seen == list(range(int(pidx[-1])))
    split = [g for g, w in dense.items() if len(w) > -(-int(sizes[g]) // local)]
    # the case it fixes: densely packed local batches of 5 or 8 split a group (of 4 or 8 examples) that would fit
    assert bool(split) == (local in (5, 8))


@pytest.mark.parametrize("world_size,gbs", [(1, 8), (2, 8), (3, 6), (4, 32)])
def test_test_mode_exactly_once_in_order(synth_dir, world_size, gbs):
    n_examples = int(np.load(os.path.join(synth_dir, "test", "all__puzzle_indices.npy"))[-1])
    seen, per_rank_batches = [], []
    for rank in range(world_size):
        ds = PuzzleDataset(
            cfg(synth_dir, global_batch_size=gbs, test_mode=True, rank=rank, world_size=world_size), "test"
        )
        batches = list(ds)
        per_rank_batches.append(len(batches))
        for j, (_, b, eff) in enumerate(batches):
            idx = b["example_index"]
            real = idx >= 0
            seen.append((j, rank, idx[real].tolist()))
            assert (b["puzzle_identifiers"][~real] == 0).all()
            assert (b["labels"][~real] == IGNORE_LABEL_ID).all() and (b["inputs"][~real] == 0).all()
            assert eff <= gbs
    assert len(set(per_rank_batches)) == 1  # same number of batches on every rank (no DDP hang)
    order = [e for _, _, ex in sorted(seen) for e in ex]
    assert order == list(range(n_examples))  # every example exactly once, in order


def test_max_groups_seeded_choice(synth_dir):
    a = PuzzleDataset(cfg(synth_dir, max_groups=5, test_mode=True), "train")
    b = PuzzleDataset(cfg(synth_dir, max_groups=5, test_mode=True), "train")
    c = PuzzleDataset(cfg(synth_dir, max_groups=5, test_mode=True, seed=7), "train")
    assert np.array_equal(a.active_groups[0], b.active_groups[0]) and len(a.active_groups[0]) == 5
    assert not np.array_equal(a.active_groups[0], c.active_groups[0])
    s = a.sets[0]
    ex = torch.cat([bt["example_index"] for _, bt, _ in a])
    ex = ex[ex >= 0].numpy()
    groups = set((np.searchsorted(s.group_indices, s.example_puzzle[ex], side="right") - 1).tolist())
    assert groups == set(a.active_groups[0].tolist())
    # all examples of the chosen groups
    g = a.active_groups[0]
    expected = sum(int(s.puzzle_indices[s.group_indices[k + 1]] - s.puzzle_indices[s.group_indices[k]]) for k in g)
    assert len(ex) == expected
    tr = PuzzleDataset(cfg(synth_dir, max_groups=5), "train")
    ex = torch.cat([bt["example_index"] for _, bt, _ in take(tr, 6)]).numpy()
    assert set((np.searchsorted(s.group_indices, s.example_puzzle[ex], side="right") - 1).tolist()) <= set(g.tolist())


def test_resume_exact_without_reading_data(synth_dir, monkeypatch):
    ds = PuzzleDataset(cfg(synth_dir), "train")
    n = ds.num_batches(0) + 3
    ref = take(ds, n + 4)
    ds2 = PuzzleDataset(cfg(synth_dir), "train")
    take(ds2, n)
    state = ds2.state_dict()
    assert state["epoch"] == 1 and state["batch"] == 3
    ds3 = PuzzleDataset(cfg(synth_dir), "train")
    calls = []
    orig = ds3.sets[0].inputs.take
    ds3.sets[0].inputs.take = lambda idx: calls.append(len(idx)) or orig(idx)
    ds3.load_state_dict(json.loads(json.dumps(state)))
    resumed = take(ds3, 4)
    assert len(calls) == 4  # skipping needed no data reads: one read per served batch
    for (_, a, _), (_, b, _) in zip(ref[n:], resumed):
        assert torch.equal(a["example_index"], b["example_index"]) and torch.equal(a["inputs"], b["inputs"])
    with pytest.raises(DatasetError, match="seed"):
        PuzzleDataset(cfg(synth_dir, seed=5), "train").load_state_dict(state)


def test_translation_same_offset_for_input_and_label(synth_dir):
    ds = PuzzleDataset(cfg(synth_dir, global_batch_size=16), "train")
    assert ds.translate  # metadata.translate_augment is true for ARC train splits
    raw_in = np.load(os.path.join(synth_dir, "train", "all__inputs.npy"))
    raw_lab = np.load(os.path.join(synth_dir, "train", "all__labels.npy"))
    shifted = 0
    for _, b, _ in take(ds, 3):
        for k in range(16):
            e = int(b["example_index"][k])
            x = b["inputs"][k].numpy().reshape(30, 30)
            y = b["labels"][k].numpy().copy()
            y[y == IGNORE_LABEL_ID] = 0
            y = y.reshape(30, 30)
            nz = np.argwhere(x >= 2)
            dr, dc = nz[:, 0].min(), nz[:, 1].min()
            shifted += (dr, dc) != (0, 0)
            # exactly the stored canvases shifted by one offset (EOS past the edge dropped)
            assert np.array_equal(x.reshape(-1), translate_canvas(raw_in[e], dr, dc))
            assert np.array_equal(y.reshape(-1), translate_canvas(raw_lab[e], dr, dc))
            h = max(find_content_extent(raw_in[e])[0], find_content_extent(raw_lab[e])[0])
            w = max(find_content_extent(raw_in[e])[1], find_content_extent(raw_lab[e])[1])
            assert dr + h <= 30 and dc + w <= 30  # legal: no colour pushed off the canvas
            # label sits at the same offset as the input
            assert np.argwhere(y >= 2)[:, 0].min() == dr and np.argwhere(y >= 2)[:, 1].min() == dc
    assert shifted > 20
    # redrawn per epoch: the same example gets another offset in another epoch (with high probability)
    assert not PuzzleDataset(cfg(synth_dir, translate_augment=False), "train").translate
    assert not PuzzleDataset(cfg(synth_dir, test_mode=True), "test").translate


def test_content_extents_matches_common(synth_dir):
    raw = np.load(os.path.join(synth_dir, "train", "all__inputs.npy"))[:50]
    r, c = content_extents(raw)
    assert [(int(a), int(b)) for a, b in zip(r, c)] == [find_content_extent(x) for x in raw]


def test_encoder_mode_demos_masks_no_self(synth_dir):
    for split, test_mode in (("train", False), ("test", True)):
        ds = PuzzleDataset(cfg(synth_dir, encoder_mode=True, test_mode=test_mode, translate_augment=False), split)
        d = os.path.join(synth_dir, split)
        demo_in = np.load(os.path.join(d, "all__demo_inputs.npy"))
        demo_idx = np.load(os.path.join(d, "all__demo_indices.npy"))
        pidx = np.load(os.path.join(d, "all__puzzle_indices.npy"))
        inputs = np.load(os.path.join(d, "all__inputs.npy"))
        m = ds.max_demos
        for _, b, _ in take(ds, 3):
            assert b["demo_inputs"].shape == (8, m, 900) and b["demo_mask"].dtype == torch.bool
            for k in range(8):
                e = int(b["example_index"][k])
                if e < 0:
                    assert not b["demo_mask"][k].any()
                    continue
                p = int(np.searchsorted(pidx, e, side="right") - 1)
                own = demo_in[demo_idx[p] : demo_idx[p + 1]]
                n_avail = len(own) - (1 if split == "train" else 0)
                nreal = int(b["demo_mask"][k].sum())
                assert nreal == min(m, n_avail)
                assert bool(b["demo_mask"][k, :nreal].all()) and not b["demo_mask"][k, nreal:].any()
                assert (b["demo_inputs"][k, nreal:] == 0).all()
                served = b["demo_inputs"][k, :nreal].numpy().astype(np.uint8)
                own_set = {r.tobytes() for r in own}
                assert all(r.tobytes() in own_set for r in served)  # demos of its own puzzle (same augmentation)
                assert inputs[e].tobytes() not in {r.tobytes() for r in served}  # never itself
    assert "demo_inputs" not in take(PuzzleDataset(cfg(synth_dir), "train"), 1)[0][1]


def test_encoder_truncation_counted(synth_dir, caplog):
    with caplog.at_level("WARNING"):
        ds = PuzzleDataset(cfg(synth_dir, encoder_mode=True, max_demos=2), "train")
    s = ds.sets[0]
    avail = np.diff(s.demo_indices)[s.example_puzzle] - 1
    assert ds.num_truncated_examples == int((avail > 2).sum()) > 0
    assert "truncated" in caplog.text
    for _, b, _ in take(ds, 2):
        assert b["demo_mask"].sum(1).max() == 2
    assert ds.truncated_rows_served > 0


def test_multiple_data_paths_offsets_and_mismatch(synth_dir, tmp_path):
    ds1 = PuzzleDataset(cfg(synth_dir, test_mode=True), "train")
    ds2 = PuzzleDataset(cfg(synth_dir, test_mode=True, data_paths=[synth_dir, synth_dir]), "train")
    n_ids = ds1.metadata.num_puzzle_identifiers
    assert ds2.metadata.num_puzzle_identifiers == 2 * n_ids - 1
    assert ds2.metadata.total_groups == 2 * ds1.metadata.total_groups
    n = ds1.sets[0].num_examples
    ids = torch.cat([b["puzzle_identifiers"] for _, b, _ in ds2])
    ex = torch.cat([b["example_index"] for _, b, _ in ds2])
    ids, ex = ids[ex >= 0], ex[ex >= 0]
    assert len(ex) == 2 * n
    assert torch.equal(ids[n:], ids[:n] + (n_ids - 1))
    # vocabulary / seq_len mismatch is refused with the path and field named
    bad = tmp_path / "bad"
    os.makedirs(bad / "train")
    meta = json.load(open(os.path.join(synth_dir, "train", "dataset.json")))
    meta["seq_len"] = 81
    json.dump(meta, open(bad / "train" / "dataset.json", "w"))
    with pytest.raises(DatasetError, match="seq_len"):
        PuzzleDataset(cfg(synth_dir, data_paths=[synth_dir, str(bad)]), "train")


def test_loads_original_trm_directory(tmp_path):
    """Published-TRM layout: no demo store, metadata without our fields, identifiers.json a list."""
    d = tmp_path / "trm"
    rng = np.random.default_rng(0)
    for split, n_puz in (("train", 6), ("test", 3)):
        os.makedirs(d / split)
        sizes = rng.integers(1, 4, size=n_puz)
        pidx = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
        n = int(pidx[-1])
        np.save(d / split / "all__inputs.npy", rng.integers(0, 12, size=(n, 900)).astype(np.uint8))
        np.save(d / split / "all__labels.npy", rng.integers(0, 12, size=(n, 900)).astype(np.uint8))
        np.save(d / split / "all__puzzle_identifiers.npy", np.arange(1, n_puz + 1, dtype=np.int32))
        np.save(d / split / "all__puzzle_indices.npy", pidx)
        np.save(d / split / "all__group_indices.npy", np.arange(0, n_puz + 1, 1, dtype=np.int32))
        json.dump(
            {
                "pad_id": 0,
                "ignore_label_id": 0,
                "blank_identifier_id": 0,
                "vocab_size": 12,
                "seq_len": 900,
                "num_puzzle_identifiers": 7,
                "total_groups": n_puz,
                "mean_puzzle_examples": float(sizes.mean()),
                "sets": ["all"],
            },
            open(d / split / "dataset.json", "w"),
        )
    json.dump(["<blank>"] + [f"p{i}" for i in range(6)], open(d / "identifiers.json", "w"))
    loader, meta = create_dataloader(cfg(str(d), global_batch_size=4, test_mode=True), "test")
    assert meta.total_puzzles == 3 and not meta.has_demos
    ex = torch.cat([b["example_index"] for _, b, _ in loader])
    assert sorted(ex[ex >= 0].tolist()) == list(range(int(np.load(d / "test" / "all__puzzle_indices.npy")[-1])))
    _, b, _ = take(PuzzleDataset(cfg(str(d), global_batch_size=4), "train"), 1)[0]
    assert b["inputs"].shape == (4, 900)
    with pytest.raises(DatasetError, match="has_demos"):
        PuzzleDataset(cfg(str(d), encoder_mode=True), "train")


def test_workers_deterministic_order_and_state(synth_dir):
    ref = take(PuzzleDataset(cfg(synth_dir), "train"), 7)
    loader, _ = create_dataloader(cfg(synth_dir, num_workers=2), "train")
    it = iter(loader)
    got = [next(it) for _ in range(7)]
    for (_, a, _), (_, b, _) in zip(ref, got):
        assert torch.equal(a["example_index"], b["example_index"]) and torch.equal(a["inputs"], b["inputs"])
    ref_ds = PuzzleDataset(cfg(synth_dir), "train")
    take(ref_ds, 7)
    assert loader.dataset.state_dict() == ref_ds.state_dict()  # main-process position tracks consumed batches
    assert len(mp.active_children()) == 2
    it.close()  # consumer stops: workers must be gone
    assert mp.active_children() == []
    # test mode with workers: still exactly once, in order
    tl, _ = create_dataloader(cfg(synth_dir, num_workers=2, test_mode=True), "test")
    ex = torch.cat([b["example_index"] for _, b, _ in tl])
    ex = ex[ex >= 0]
    assert ex.tolist() == list(range(len(ex)))


def test_config_is_strict():
    with pytest.raises(Exception, match="unknown_key"):
        PuzzleDatasetConfig(data_paths=["x"], global_batch_size=8, unknown_key=1)
    with pytest.raises(Exception, match="divisible"):
        PuzzleDatasetConfig(data_paths=["x"], global_batch_size=6, world_size=4)
    with pytest.raises(DatasetError, match="dataset.json"):
        PuzzleDataset(PuzzleDatasetConfig(data_paths=["/nonexistent"], global_batch_size=8), "train")


def test_pin_memory_follows_cuda(synth_dir):
    loader, _ = create_dataloader(cfg(synth_dir), "train")
    assert loader.pin_memory == torch.cuda.is_available()
    forced, _ = create_dataloader(cfg(synth_dir, pin_memory=True), "train")
    assert forced.pin_memory == torch.cuda.is_available()  # never pins without CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_pinned_on_cuda(synth_dir):
    loader, _ = create_dataloader(cfg(synth_dir, encoder_mode=True, num_workers=1), "train")
    it = iter(loader)
    _, b, _ = next(it)
    assert all(v.is_pinned() for v in b.values())
    it.close()


def test_dropping_iterator_stops_workers(synth_dir):
    loader, _ = create_dataloader(cfg(synth_dir, num_workers=2), "train")
    it = iter(loader)
    next(it)
    assert len(mp.active_children()) == 2
    del it
    gc.collect()
    assert mp.active_children() == []


def test_small_group_subset_packs_passes_into_full_batches(synth_dir):
    """The overfit phase (few groups, big batch): an epoch packs whole passes until one global batch is full;
    each pass still takes exactly one augmented puzzle of every chosen group."""
    big = 64
    ds = PuzzleDataset(cfg(synth_dir, max_groups=3, global_batch_size=big), "train")
    s = ds.sets[0]
    one_pass = ds._one_pass(0, 0, 0)
    assert 0 < len(one_pass) < big  # the situation that used to make training refuse to start
    passes = ds.passes_per_epoch(0)
    assert passes == ds._passes[(0, 0)] and passes >= 2
    chunks = [ds._one_pass(0, 0, p) for p in range(passes)]
    assert sum(map(len, chunks[:-1])) < big <= sum(map(len, chunks))  # the smallest number of passes
    plan = ds._epoch_plan(0, 0)
    assert plan.shape == (sum(map(len, chunks)) // big, big)  # full batches only
    assert np.array_equal(plan.reshape(-1), np.concatenate(chunks)[: plan.size])
    for chunk in chunks:  # one puzzle per chosen group per pass
        groups = np.searchsorted(s.group_indices, s.example_puzzle[chunk], side="right") - 1
        assert sorted(set(groups.tolist())) == sorted(ds.active_groups[0].tolist())
    _, batch, eff = next(iter(ds))
    assert eff == big and (batch["example_index"] >= 0).all()
    # a normal-sized batch keeps one pass per epoch and the published semantics
    assert PuzzleDataset(cfg(synth_dir, global_batch_size=2), "train").passes_per_epoch(0) == 1


def _reference_demos(ds, s, ex, real, key, row0):
    """Per-row reference of the demo packing: own puzzle's demos in order, self excluded, truncated rows take the
    first m (test mode) or a seeded sorted subset per global row (training)."""
    m, nloc = ds.max_demos, len(real)
    din = np.zeros((nloc, m, 900), np.int32)
    dlab = np.zeros((nloc, m, 900), np.int32)
    mask = np.zeros((nloc, m), bool)
    for k, e in zip(np.nonzero(real)[0], ex):
        p = s.example_puzzle[e]
        cand = np.arange(s.demo_indices[p], s.demo_indices[p + 1])
        if s.example_demo_slot[e] >= 0:
            cand = np.delete(cand, s.example_demo_slot[e])
        if len(cand) > m:
            if ds.config.test_mode:
                cand = cand[:m]
            else:
                r = np.random.default_rng(list(key) + [row0 + int(k), 0xDE40])
                cand = np.sort(r.choice(cand, size=m, replace=False))
        din[k, : len(cand)] = s.demo_inputs.take(cand)
        dlab[k, : len(cand)] = s.demo_labels.take(cand)
        mask[k, : len(cand)] = True
    return din, dlab, mask


@pytest.mark.parametrize(
    "split, test_mode, max_demos, rank",
    [("train", False, 2, 1), ("train", False, None, 0), ("test", True, 1, 0), ("test", True, None, 1)],
)
def test_vectorised_demo_packing_equals_per_row_reference(synth_dir, split, test_mode, max_demos, rank):
    ds = PuzzleDataset(
        cfg(
            synth_dir,
            encoder_mode=True,
            test_mode=test_mode,
            max_demos=max_demos,
            rank=rank,
            world_size=2,
            translate_augment=False,
        ),
        split,
    )
    s = ds.sets[0]
    for pos in [(0, 0, b) for b in range(ds.num_batches())] if test_mode else [(0, 0, 0), (1, 0, 1), (2, 0, 0)]:
        _, b, _ = ds._make_batch(pos)
        rows = b["example_index"].numpy()
        real = rows >= 0
        din, dlab, mask = _reference_demos(ds, s, rows[real], real, (0,) + pos, rank * ds.local_batch_size)
        assert np.array_equal(b["demo_mask"].numpy(), mask)
        assert np.array_equal(b["demo_inputs"].numpy(), din) and np.array_equal(b["demo_labels"].numpy(), dlab)


def test_token_ids_outside_the_vocabulary_are_refused_at_load(tmp_path):
    """A token id >= vocab_size (or a puzzle id out of range) would crash the embedding lookup mid-run, after
    checkpoints were written: refused when the data is loaded, naming file, value and vocab_size."""
    data = write_toy_dataset(str(tmp_path / "toy"))
    path = os.path.join(data, "train", "all__inputs.npy")
    arr = np.load(path)
    arr[3, 2] = 12  # vocab_size is 12: ids 0..11
    np.save(path, arr)
    cfg = PuzzleDatasetConfig(data_paths=[data], global_batch_size=4)
    with pytest.raises(
        DatasetError,
        match=r"all__inputs\.npy: token id 12 at index \[3, 2\] is outside the "
        r"vocabulary \[0, 12\)",
    ):
        PuzzleDataset(cfg, "train")
    arr[3, 2] = 5
    np.save(path, arr)
    ids_path = os.path.join(data, "train", "all__puzzle_identifiers.npy")
    ids = np.load(ids_path)
    ids[0] = 10_000
    np.save(ids_path, ids)
    with pytest.raises(DatasetError, match=r"all__puzzle_identifiers\.npy: ids must be in \[0, "):
        PuzzleDataset(cfg, "train")


def _family_groups(path: str, families: tuple[str, ...]) -> set[int]:
    """Group indices of the train split whose puzzle name ends in one of ``families`` (read independently)."""
    names = json.load(open(os.path.join(path, "identifiers.json")))
    ids = np.load(os.path.join(path, "train", "all__puzzle_identifiers.npy"))
    gi = np.load(os.path.join(path, "train", "all__group_indices.npy"))
    return {g for g in range(len(gi) - 1) if names[int(ids[gi[g]])].split("|||")[0].endswith(families)}


def test_group_pattern_keeps_the_matching_groups_only(synth_dir):
    want = _family_groups(synth_dir, ("gravity", "translate"))
    assert 0 < len(want) < 24
    ds = PuzzleDataset(cfg(synth_dir, group_pattern="gravity|translate", test_mode=True), "train")
    assert set(ds.active_groups[0].tolist()) == want
    s = ds.sets[0]
    ex = torch.cat([bt["example_index"] for _, bt, _ in ds])
    ex = ex[ex >= 0].numpy()
    served = set((np.searchsorted(s.group_indices, s.example_puzzle[ex], side="right") - 1).tolist())
    assert served == want
    expected = sum(int(s.puzzle_indices[s.group_indices[k + 1]] - s.puzzle_indices[s.group_indices[k]]) for k in want)
    assert len(ex) == expected  # every example of every matching group, once
    # the training stream: fewer batches per epoch, only matching groups
    full, part = PuzzleDataset(cfg(synth_dir), "train"), PuzzleDataset(cfg(synth_dir, group_pattern="gravity"), "train")
    assert part.num_batches(0) < full.num_batches(0)
    ex = torch.cat([bt["example_index"] for _, bt, _ in take(part, 4)]).numpy()
    got = set((np.searchsorted(s.group_indices, s.example_puzzle[ex], side="right") - 1).tolist())
    assert got <= _family_groups(synth_dir, ("gravity",))
    # max_groups chooses among the matching groups
    few = PuzzleDataset(cfg(synth_dir, group_pattern="gravity|translate", max_groups=2, test_mode=True), "train")
    assert len(few.active_groups[0]) == 2 and set(few.active_groups[0].tolist()) <= want
    # two data paths: names offset like the identifiers, both copies match
    two = PuzzleDataset(
        PuzzleDatasetConfig(data_paths=[synth_dir, synth_dir], global_batch_size=8, group_pattern="gravity|translate"),
        "train",
    )
    assert len(two.active_groups[0]) == 2 * len(want)


def test_group_pattern_errors_name_the_pattern(synth_dir):
    with pytest.raises(DatasetError, match=r"group_pattern 'no_such_family': no group .* like 'syn-train-00000"):
        PuzzleDataset(cfg(synth_dir, group_pattern="no_such_family"), "train")
    with pytest.raises(ValueError, match=r"group_pattern '\(' is not a regular expression"):
        cfg(synth_dir, group_pattern="(")


def test_train_group_pattern_reaches_the_training_loader(synth_dir, tmp_path):
    from tests.toy_data import toy_train_config
    from training.build import build_run_data
    from training.config import config_from_dict
    from training.distributed import DistInfo

    base = toy_train_config(synth_dir, str(tmp_path / "run"), global_batch_size=8)
    full = build_run_data(config_from_dict(base), DistInfo(), str(tmp_path / "e1"), say=lambda *_: None)
    part = build_run_data(
        config_from_dict(dict(base, train_group_pattern="gravity")),
        DistInfo(),
        str(tmp_path / "e2"),
        say=lambda *_: None,
    )
    assert set(part.train_dataset.active_groups[0].tolist()) == _family_groups(synth_dir, ("gravity",))
    assert part.total_steps < full.total_steps  # an epoch (and the step count) is of the matching groups only


def test_a_canvas_split_whose_seq_len_disagrees_is_named_by_its_cause_not_translate_augment(tmp_path):
    """ARC-kind data (translate_augment on in its train split) whose dataset.json seq_len disagrees: with the arrays,
    the arrays are named; with its own grid_size, the grid_size / seq_len pair is; translate_augment is blamed only
    when it was asked for on data that is no canvas."""

    def variant(name, **fields):
        d = write_toy_dataset(str(tmp_path / name), seq_len=16)
        p = os.path.join(d, "train", "dataset.json")
        meta = json.load(open(p))
        meta.update(kind="arc", translate_augment=True, **fields)
        json.dump(meta, open(p, "w"))
        return d

    def refusal(d, **kw):
        with pytest.raises(DatasetError) as e:
            PuzzleDataset(PuzzleDatasetConfig(data_paths=[d], global_batch_size=4, **kw), "train")
        return str(e.value)

    msg = refusal(variant("rows", grid_size=5, seq_len=25))
    assert "seq_len 25 but all__inputs.npy has rows of 16" in msg and "translate" not in msg, msg
    msg = refusal(variant("grid", grid_size=5))
    assert "grid_size=5 but seq_len=16 (a 5x5 canvas has 25 tokens)" in msg and "translate" not in msg, msg
    plain = write_toy_dataset(str(tmp_path / "plain"), seq_len=8)
    msg = refusal(plain, translate_augment=True)
    assert "translate_augment=true moves grids inside a square canvas" in msg and "seq_len=8" in msg, msg
    assert PuzzleDataset(PuzzleDatasetConfig(data_paths=[variant("ok", grid_size=4)], global_batch_size=4), "train")
