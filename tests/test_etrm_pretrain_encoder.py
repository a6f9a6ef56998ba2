"""pretrain_encoder.py / its config: composes with every encoder, runs the SAME loop end-to-end on a tiny
ETRM dataset, logs the encoder metrics, and early-stops with the health monitor (exit status 3)."""

import json
import os
import subprocess
import sys

import pytest

from encoders import ENCODER_REGISTRY
from tests.toy_data import TINY_PRETRAIN, write_tiny_recolour
from training.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [*TINY_PRETRAIN, "log_interval=1", "diag_interval=1"]


def test_issue_example_overrides_compose():
    cfg = load_config(
        "cfg_pretrain_encoder_arc_agi_1",
        [
            "encoder=lpn",
            "max_train_groups=32",
            "max_eval_groups=32",
            "arch.halt_max_steps=8",
            "arch.halt_exploration_prob=0.7",
            "+project_name=etrm-dev",
            "+run_name=lpn_overfit",
        ],
    )
    assert cfg.encoder.name == "lpn" and cfg.arch.name == "trm" and cfg.arch.halt_max_steps == 8
    assert (cfg.max_train_groups, cfg.project_name, cfg.run_name) == (32, "etrm-dev", "lpn_overfit")
    assert cfg.encoder_cache is False and cfg.load_pretrained_decoder is None and cfg.freeze_decoder_steps == 0
    from training.health import HealthConfig

    assert isinstance(cfg.health, HealthConfig)  # the health section is typed
    for name in ENCODER_REGISTRY:
        assert load_config("cfg_pretrain_encoder_arc_agi_1", [f"encoder={name}"]).encoder.name == name


def _run(tmp_path, extra, ck_name="ck"):
    data = tmp_path / "data"
    if not data.exists():
        write_tiny_recolour(data)
    ck = tmp_path / ck_name
    cmd = [
        sys.executable,
        "pretrain_encoder.py",
        f"data_paths=[{data}]",
        f"checkpoint_path={ck}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        *TINY,
        *extra,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    summary = json.load(open(ck / "summary.json")) if (ck / "summary.json").exists() else None
    return p, summary


def test_stuck_rule_does_not_stop_an_early_stop_run_during_lr_warmup(tmp_path):
    """The overfit lines of jobs.txt run with early_stop=true. A run whose accuracy stays flat (lr 1e-6: nothing
    is learnt) with a warmup (30 steps) longer than stuck_steps (10) must not be stopped as 'stuck' while the LR
    is still rising (it was, at step 15); once warmup is over it is genuinely stuck and stops at 30 + 10."""
    p, s = _run(
        tmp_path,
        [
            "encoder=standard",
            "max_steps=60",
            "lr=1e-6",
            "lr_warmup_steps=30",
            "log_interval=5",
            "diag_interval=5",
            "early_stop=true",
            "health.stuck_steps=10",
            "eval_at_end=false",
        ],
    )
    assert p.returncode == 3, p.stdout[-2000:] + p.stderr[-3000:]
    assert s["stop_reason"].startswith("early_stop: stuck") and "the end of LR warmup" in s["stop_reason"]
    assert s["steps"] == 40, s["stop_reason"]
    assert [w for w in s["warnings"] if "stuck" in w][0].startswith("step 40:")


@pytest.mark.slow
def test_end_to_end_and_health_early_stop(tmp_path):
    p, s = _run(tmp_path, ["encoder=variational", "encoder.kl_weight=0.01", "max_steps=3", "freeze_decoder_steps=2"])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[encoder] variational" in p.stdout and "trainable parameters" in p.stdout
    m = s["metrics"] if "metrics" in s else s
    flat = json.dumps(m)
    for key in (
        "grad/encoder_norm",
        "grad/inner_norm",
        "train/encoder_cross_sample_var",
        "train/kl",
        "train/decoder_frozen",
    ):
        assert key in flat, key
    # early stop: an impossible starvation threshold fires at once -> checkpoint, reason, exit status 3
    p, s = _run(
        tmp_path,
        [
            "encoder=standard",
            "max_steps=50",
            "early_stop=true",
            "health.grad_starvation_threshold=1e9",
            "health.grad_starvation_patience=1",
            "health.encoder_rules_min_step=0",
        ],
        "ck2",
    )
    assert p.returncode == 3, (p.returncode, p.stderr[-3000:])
    assert s["stop_reason"].startswith("early_stop: gradient starvation") and s["exit_status"] == 3
    assert s["steps"] < 50 and any(f.startswith("step_") for f in os.listdir(tmp_path / "ck2"))


@pytest.mark.slow
def test_load_pretrained_decoder_from_a_trm_run_of_the_loop(tmp_path):
    """A TRM trained by the loop initialises the ETRM decoder (puzzle embedding dropped); an L_cycles mismatch
    is refused (pitfall 10)."""
    import torch

    from experiments.science.recolour import science_config
    from training.build import load_model_for_inference
    from training.checkpoint import find_latest_checkpoint, load_checkpoint_file
    from training.loop import train

    data = str(tmp_path / "data")
    write_tiny_recolour(data)
    tiny = dict(hidden_size=32, num_heads=2, H_cycles=1, L_cycles=1)
    trm = science_config(data, str(tmp_path / "trm"), steps=2, global_batch_size=8)
    trm.pop("encoder")
    trm["arch"] = dict(trm["arch"], puzzle_emb_ndim=32, **tiny)
    train(trm)
    ck = find_latest_checkpoint(str(tmp_path / "trm"))
    saved = load_checkpoint_file(ck)["model"]
    etrm = science_config(
        data,
        str(tmp_path / "etrm"),
        steps=1,
        global_batch_size=8,
        load_pretrained_decoder=ck,
        freeze_decoder_steps=1,
        arch=tiny,
        encoder={"hidden_size": 32, "num_heads": 2},
    )
    assert train(etrm)["exit_status"] == 0
    m, _, _ = load_model_for_inference(str(tmp_path / "etrm"), use_ema=False)
    for k in ("inner.H_init", "inner.lm_head.weight", "inner.embed_tokens.embedding_weight"):
        torch.testing.assert_close(m.state_dict()[k], saved[k])  # frozen step: decoder == the TRM's
    bad = science_config(
        data,
        str(tmp_path / "bad"),
        steps=1,
        global_batch_size=8,
        load_pretrained_decoder=ck,
        arch=dict(tiny, L_cycles=2),
        encoder={"hidden_size": 32, "num_heads": 2},
    )
    with pytest.raises(Exception, match="L_cycles"):
        train(bad)
