"""Guards for pitfalls (docs/pitfalls.md) that no other test pinned down exactly. Each test is CPU-sized
(a few seconds at most) and fails if the corresponding defect comes back:

- pitfall 3: freezing the decoder of an ETRM (one AdamATan2 holding decoder AND encoder groups) still trains
  the encoder;
- pitfall 4: gradients are clipped AFTER the cross-rank sum (global norm), and the logged norm is the pre-clip one;
- pitfall 7: total steps come from the batches the loader really serves, and no batch is drawn after the last step;
- pitfall 9: the model that is built is the one the (composed Hydra) config names, for every arch / encoder;
- pitfall 19: training-time translation is drawn at load time and re-drawn every epoch (not baked at build time);
- pitfall 21: the ACT carry takes new data only into halted slots, and ``examples_seen`` counts exactly those;
- pitfall 24: the training loop and a default (``forward_dtype: auto``) model run in fp32 on CPU.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from dataset.metadata import DatasetMetadata
from dataset.tokens import COLOR_OFFSET, EOS_ID, PAD_ID
from dataset.writer import atomic_output_dir, save_split
from tests.toy_data import built_synthetic_arc, tiny_metadata, toy_train_config, write_tiny_recolour


def _no_explore(**kw):
    return {"halt_exploration_prob": 0.0, **kw}


# ------------------------------------------------------------------------------------------------ pitfall 3
def test_freezing_the_decoder_keeps_training_the_encoder_with_a_single_optimizer(tmp_path):
    from dataset.metadata import load_metadata
    from experiments.science.recolour import science_config
    from training import checkpoint as ckpt
    from training import distributed as D
    from training.build import build_act_model
    from training.config import config_from_dict
    from training.loop import train

    data = str(tmp_path / "data")
    write_tiny_recolour(data)
    cfg = science_config(
        data,
        str(tmp_path / "frz"),
        steps=2,
        global_batch_size=8,
        freeze_decoder_steps=2,
        log_interval=1,
        arch=dict(hidden_size=32, num_heads=2, H_cycles=1, L_cycles=1),
        encoder={"hidden_size": 32, "num_heads": 2, "num_layers": 1},
    )
    s = train(cfg)
    assert s["steps"] == 2 and s["final"]["train/decoder_frozen"] == 1.0
    D.seed_everything(cfg["seed"], 0)  # the loop's construction seed: the same initial weights
    init = build_act_model(config_from_dict(cfg), load_metadata(os.path.join(data, "train")), 8).state_dict()
    state = ckpt.load_checkpoint_file(ckpt.find_latest_checkpoint(cfg["checkpoint_path"]))
    final = state["model"]
    assert set(state["optimizers"]) == {"adam"}  # one optimizer for decoder and encoder
    enc = [k for k in init if k.startswith("encoder.") and init[k].is_floating_point()]
    dec = [k for k in init if k.startswith("inner.") and init[k].is_floating_point()]
    assert enc and dec
    assert all(torch.equal(init[k], final[k]) for k in dec), "a decoder weight moved while frozen"
    moved = [k for k in enc if not torch.equal(init[k], final[k])]
    assert len(moved) >= 0.9 * len(enc), f"encoder weights left at init: {sorted(set(enc) - set(moved))}"


# ------------------------------------------------------------------------------------------------ pitfall 4
def test_clip_is_applied_to_the_global_gradient_after_the_all_reduce(toy, tmp_path, monkeypatch):
    """Simulate a second, identical rank: the (patched) all-reduce doubles every gradient. A per-rank clip
    (before the reduce) would hand the reduce clipped gradients and leave 2 x clip after it; the global clip
    hands the reduce raw gradients and the optimizer exactly ``grad_clip``."""
    from training import distributed as D
    from training import optim as O
    from training.loop import train

    clip = 1e-3
    seen = {}

    def fake_reduce(params):
        params = list(params)
        seen["at_reduce"] = float(
            torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        )
        for p in params:
            if p.grad is not None:
                p.grad.mul_(2.0)  # the sum over two ranks holding the same gradient

    orig_step = O.AdamATan2.step

    def spy_step(self, *a, **k):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        seen["at_step"] = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
        return orig_step(self, *a, **k)

    monkeypatch.setattr(D, "all_reduce_grads_", fake_reduce)
    monkeypatch.setattr(O.AdamATan2, "step", spy_step)
    s = train(
        toy_train_config(
            toy,
            str(tmp_path / "clip"),
            max_steps=1,
            grad_clip=clip,
            log_interval=1,
            eval_at_end=False,
            arch=_no_explore(),
        )
    )
    assert s["steps"] == 1
    assert seen["at_reduce"] > 10 * clip  # the reduce received the raw (unclipped) local gradient
    assert s["final"]["grad/total_norm"] == pytest.approx(2 * seen["at_reduce"], rel=1e-4)  # logged pre-clip
    assert seen["at_step"] == pytest.approx(clip, rel=1e-3)  # the optimizer sees the global clip, not 2 x clip


# ------------------------------------------------------------------------------------------------ pitfall 7
def _write_uneven(path: str, sizes=(5, 9, 2, 7), seq_len: int = 8) -> str:
    """One puzzle per group with very different example counts; metadata statistics deliberately useless
    (mean_puzzle_examples=1), so a step count derived from groups / metadata would be wrong."""
    rng = np.random.default_rng(0)
    with atomic_output_dir(path) as tmp:
        for split in ("train", "test"):
            inputs, pidx, gidx = [], [0], [0]
            for n in sizes:
                for _ in range(n):
                    x = np.full(seq_len, PAD_ID, dtype=np.uint8)
                    x[:4] = rng.integers(0, 10, size=4) + COLOR_OFFSET
                    x[4] = EOS_ID
                    inputs.append(x)
                pidx.append(pidx[-1] + n)
                gidx.append(gidx[-1] + 1)
            arr = {
                "inputs": np.stack(inputs),
                "labels": np.stack(inputs),
                "puzzle_identifiers": np.arange(1, len(sizes) + 1, dtype=np.int32),
                "puzzle_indices": np.asarray(pidx, dtype=np.int32),
                "group_indices": np.asarray(gidx, dtype=np.int32),
            }
            meta = DatasetMetadata(
                pad_id=PAD_ID,
                ignore_label_id=PAD_ID,
                blank_identifier_id=0,
                vocab_size=12,
                seq_len=seq_len,
                num_puzzle_identifiers=len(sizes) + 1,
                total_groups=len(sizes),
                mean_puzzle_examples=1.0,
                sets=["all"],
            )
            save_split(os.path.join(tmp, split), arr, meta)
        with open(os.path.join(tmp, "identifiers.json"), "w") as f:
            json.dump(["<blank>"] + [f"u{i}" for i in range(len(sizes))], f)
    return path


def test_steps_come_from_served_batches_and_no_batch_is_drawn_after_the_last_step(tmp_path, monkeypatch):
    from dataset.loader import PuzzleDataset, PuzzleDatasetConfig
    from training.loop import train

    data = _write_uneven(str(tmp_path / "uneven"))
    gbs, epochs = 4, 3
    # the loader's own epoch, counted by iterating it until its position reaches epoch 1
    ds = PuzzleDataset(PuzzleDatasetConfig(data_paths=[data], global_batch_size=gbs, seed=0), "train")
    it, per_epoch = iter(ds), 0
    while ds.state_dict()["epoch"] == 0:
        next(it)
        per_epoch += 1
    assert per_epoch == sum((5, 9, 2, 7)) // gbs == 5  # real samples, last partial batch dropped
    assert per_epoch != (4 * 1) // gbs  # what total_groups x mean_puzzle_examples / batch would give

    served = []
    orig = PuzzleDataset._make_batch

    def counting(self, pos):
        if not self.config.test_mode:
            served.append(pos)
        return orig(self, pos)

    monkeypatch.setattr(PuzzleDataset, "_make_batch", counting)
    s = train(
        toy_train_config(
            data, str(tmp_path / "run"), global_batch_size=gbs, epochs=epochs, eval_at_end=False, arch=_no_explore()
        )
    )
    assert s["total_steps"] == s["steps"] == epochs * per_epoch
    assert len(served) == s["steps"]  # one batch per optimizer step, none loaded and thrown away at the end
    assert s["epochs_completed"] == pytest.approx(epochs)


def test_group_subset_smaller_than_a_batch_trains_and_epochs_stay_passes(tmp_path):
    """The overfit phase: the chosen groups hold fewer examples than one global batch (23 < 32). Training starts
    (the loader packs passes into full batches) and `epochs` still counts passes over the data."""
    from training.loop import train

    data = _write_uneven(str(tmp_path / "uneven"))  # 23 examples in one pass
    s = train(
        toy_train_config(
            data, str(tmp_path / "run"), global_batch_size=32, epochs=6, eval_at_end=False, arch=_no_explore()
        )
    )
    # 2 passes (46 examples) fill one batch of 32 per loader epoch -> 6 passes = 3 steps
    assert s["total_steps"] == s["steps"] == 3
    assert s["epochs_completed"] == pytest.approx(6)


# ------------------------------------------------------------------------------------------------ pitfall 9
TINY_ARCH = ["arch.hidden_size=32", "arch.num_heads=2", "arch.puzzle_emb_ndim=32", "arch.forward_dtype=float32"]


@pytest.mark.parametrize("arch", ["trm", "trm_tiny", "trm_mlp_t", "hrm", "transformer"])
def test_the_model_built_is_the_arch_the_config_names(arch):
    import models
    from training.build import build_act_model, resolve_arch
    from training.config import load_config

    extra = {
        "trm": ["arch.L_cycles=3"],
        "trm_tiny": ["arch.L_cycles=3"],
        "trm_mlp_t": ["arch.L_cycles=3"],
        "hrm": ["arch.L_cycles=3"],
        "transformer": ["arch.num_layers=1"],
    }[arch]
    cfg = load_config("cfg_pretrain", [f"arch={arch}", *TINY_ARCH, *extra])
    model = build_act_model(cfg, tiny_metadata(), batch_size=2)
    name = cfg.arch.name
    assert type(model) is models.ARCH_REGISTRY[name].cls
    resolved = resolve_arch(cfg)  # what checkpoints store (and loads are compared against)
    assert resolved["name"] == name == model.config.model_dump()["name"]
    # every override reached the module config that was built (not just the run's label)
    for ov in TINY_ARCH + extra:
        key, val = ov.split("=")
        field = key.split(".", 1)[1]
        assert str(getattr(model.config, field)).lower() == val.lower(), field
        assert str(resolved[field]).lower() == val.lower(), field


@pytest.mark.parametrize("encoder", ["standard", "variational", "lpn", "hybrid", "recurrent"])
def test_the_etrm_built_has_the_encoder_the_config_names(encoder):
    from encoders import ENCODER_REGISTRY
    from models.etrm import ETRM
    from training.build import build_act_model
    from training.config import load_config

    cfg = load_config(
        "cfg_pretrain_encoder_arc_agi_1",
        [
            f"encoder={encoder}",
            "encoder.hidden_size=16",
            "encoder.num_heads=2",
            "encoder.num_layers=1",
            "arch.hidden_size=32",
            "arch.num_heads=2",
            "arch.puzzle_emb_len=2",
            "arch.L_cycles=3",
            "arch.forward_dtype=float32",
        ],
    )
    model = build_act_model(cfg, tiny_metadata(has_demos=True, max_demos=3), batch_size=2)
    assert isinstance(model, ETRM) and model.puzzle_emb_len == 2 and model.config.L_cycles == 3
    assert type(model.encoder) is ENCODER_REGISTRY[encoder].cls
    assert (model.encoder.cfg.name, model.encoder.cfg.hidden_size, model.encoder.cfg.num_layers) == (encoder, 16, 1)


# ------------------------------------------------------------------------------------------------ pitfall 19
@pytest.fixture(scope="module")
def arc_like(tmp_path_factory):
    root = tmp_path_factory.mktemp("arcish")
    built, _ = built_synthetic_arc(
        root, num_train=8, num_test=2, num_aug=1, mode="trm", max_grid=6, seed=3, canvas=30, prefix="syn"
    )
    return built


def _offset(canvas: torch.Tensor) -> tuple[int, int]:
    nz = np.argwhere(canvas.numpy().reshape(30, 30) >= COLOR_OFFSET)
    return int(nz[:, 0].min()), int(nz[:, 1].min())


def test_translation_is_drawn_at_load_time_and_redrawn_every_epoch(arc_like):
    from dataset.loader import PuzzleDataset, PuzzleDatasetConfig

    raw = np.load(os.path.join(arc_like, "train", "all__inputs.npy"))
    # build time: every stored canvas sits at the origin (no offset baked into the files)
    for row in raw:
        nz = np.argwhere(row.reshape(30, 30) >= COLOR_OFFSET)
        assert nz[:, 0].min() == 0 and nz[:, 1].min() == 0
    ds = PuzzleDataset(PuzzleDatasetConfig(data_paths=[arc_like], global_batch_size=4, seed=0), "train")
    assert ds.translate
    offsets: dict[int, list] = {}
    it = iter(ds)
    while ds.state_dict()["epoch"] < 3:
        _, b, _ = next(it)
        for k, e in enumerate(b["example_index"].tolist()):
            offsets.setdefault(e, []).append(_offset(b["inputs"][k]))
    seen_twice = {e: o for e, o in offsets.items() if len(o) >= 2}
    assert len(seen_twice) >= 5
    redrawn = sum(len(set(o)) > 1 for o in seen_twice.values())
    assert redrawn >= 0.6 * len(seen_twice)  # a baked-in offset would give the same one every epoch
    again = iter(PuzzleDataset(PuzzleDatasetConfig(data_paths=[arc_like], global_batch_size=4, seed=0), "train"))
    _, b2, _ = next(again)
    _, b1, _ = next(
        iter(PuzzleDataset(PuzzleDatasetConfig(data_paths=[arc_like], global_batch_size=4, seed=0), "train"))
    )
    assert torch.equal(b1["inputs"], b2["inputs"])  # ...and seeded (same seed -> same offsets)


# ------------------------------------------------------------------------------------------------ pitfall 21
def test_only_halted_slots_take_new_data_and_examples_seen_counts_them(toy, tmp_path, monkeypatch):
    """halt_max_steps=2, no exploration, Q-head bias -5: nothing halts by Q, every slot halts at step 2.
    Steps 1 and 3 refill all 16 slots, steps 2 and 4 none: 4 batches (64 rows) loaded, 32 examples trained on."""
    from dataset.loader import PuzzleDataset
    from training.loop import Trainer, train

    served = []
    orig = PuzzleDataset._make_batch
    monkeypatch.setattr(PuzzleDataset, "_make_batch", lambda self, pos: served.append(pos) or orig(self, pos))
    refills = []
    orig_step = Trainer.train_step

    def spy(self, batch):
        refills.append(int(self.carry.halted.sum()) if self.carry is not None else batch["inputs"].shape[0])
        return orig_step(self, batch)

    monkeypatch.setattr(Trainer, "train_step", spy)
    s = train(
        toy_train_config(
            toy,
            str(tmp_path / "carry"),
            max_steps=4,
            log_interval=1,
            eval_at_end=False,
            arch=_no_explore(halt_max_steps=2),
        )
    )
    assert refills == [16, 0, 16, 0]
    assert len(served) == 4  # the loader still served a full batch for every step (TRM parity)
    assert s["examples_seen"] == 32 and s["final"]["train/examples_seen"] == 32.0


# ------------------------------------------------------------------------------------------------ pitfall 24
def test_cpu_runs_in_fp32_and_cuda_defaults_to_bf16(monkeypatch):
    """Also on a machine with a GPU: a CPU run there once computed in bf16 (forward_dtype auto asked whether CUDA
    was available, not where the model runs; found on the first GPU run, 2026-11-26)."""
    from training import distributed as D
    from training.build import build_act_model
    from training.config import load_config

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert D.autocast_dtype(cpu) is None and D.autocast_dtype(cuda) is torch.bfloat16  # the loop's autocast
    assert D.should_compile(None, cpu) is False
    cfg = load_config("cfg_pretrain", ["arch=trm_tiny"])
    assert cfg.arch.forward_dtype == "auto"
    meta = tiny_metadata()
    model = build_act_model(cfg, meta, batch_size=2)
    batch = {
        "inputs": torch.randint(2, 12, (2, 16), dtype=torch.int32),
        "labels": torch.randint(2, 12, (2, 16)),
        "puzzle_identifiers": torch.ones(2, dtype=torch.int32),
    }
    for gpu_machine in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpu_machine=gpu_machine: gpu_machine)
        model = build_act_model(cfg, meta, batch_size=2).to(cpu)
        with D.autocast(cpu):
            carry, out = model(model.initial_carry(batch), batch)
        assert out["logits"].dtype == torch.float32 and carry.inner_carry.z_H.dtype == torch.float32
        assert model.inner.embed_tokens.cast_to is torch.float32
    # .to(device) re-resolves "auto" from the device the weights move to, for the stem and the embeddings that
    # cast to it (the meta device stands in for CUDA here; tests/test_cuda.py runs the real one)
    import models.act

    monkeypatch.setattr(
        models.act,
        "resolve_dtype",
        lambda name, device=None: torch.bfloat16 if torch.device(device).type == "meta" else torch.float32,
    )
    model.to("meta")
    assert model.inner.forward_dtype is torch.bfloat16
    assert {m.cast_to for m in model.modules() if hasattr(m, "cast_to")} == {torch.bfloat16}
    model.to_empty(device=cpu)  # (a meta tensor has no data to copy back)
    assert model.inner.forward_dtype is torch.float32 and model.inner.embed_tokens.cast_to is torch.float32


def test_etrm_refuses_trm_mode_data_with_test_demos_in_train(arc_kaggle_dir, tmp_path):
    """An encoder model trained on a --mode trm build (the test puzzles' demos are in train/) would not be
    evaluated few-shot: the loop refuses it by name unless allow_test_demos_in_train=true."""
    from dataset.arc_sources import load_puzzles
    from dataset.build_arc_dataset import build_arc_dataset
    from training.config import ConfigError
    from training.loop import train

    puzzles = load_puzzles(["training", "evaluation"], "evaluation", os.path.join(arc_kaggle_dir, "arc-agi"))
    small = [p for p in puzzles if p.subset == "training"][:2] + [p for p in puzzles if p.subset == "evaluation"][:1]
    data = str(tmp_path / "trm_mode")
    build_arc_dataset(data, small, test_set_name="evaluation", num_aug=1, seed=0, mode="trm", progress=False)
    enc = {"name": "standard", "hidden_size": 16, "num_heads": 2, "num_layers": 1}
    cfg = toy_train_config(
        data,
        str(tmp_path / "run"),
        global_batch_size=4,
        epochs=1,
        eval_at_end=False,
        encoder=enc,
        arch={"puzzle_emb_ndim": 0, "puzzle_emb_len": 1, "hidden_size": 16, "num_heads": 2},
    )
    with pytest.raises(ConfigError, match="test_demos_in_train"):
        train(cfg)
    s = train({**cfg, "allow_test_demos_in_train": True, "max_steps": 1})
    assert s["steps"] == 1
