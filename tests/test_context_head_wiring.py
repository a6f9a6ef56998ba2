"""encoder.context_scale=norm end to end: Hydra config -> training -> checkpoint -> evaluate.py rebuilds the same
model (the training run's own numbers), and the option matters there (the same weights read as another head give
other numbers). Unit behaviour: tests/test_encoders_variants.py. (encoder.context_codes was removed, measured
negative: tests/test_encoders_compat.py checks that its checkpoints are refused.) And a checkpoint written before
TRM's arch switches became variant modules (the rules: tests/test_models_legacy.py)."""

import pytest
import torch

from tests.toy_data import TINY_ETRM, built_synthetic_arc
from training.config import load_config

TINY = [
    *TINY_ETRM,
    "log_interval=2",
    "device=cpu",
    "checkpoint_every=null",
    "lr=3e-3",
    "lr_warmup_steps=1",
    "max_steps=4",
    "eval_at_end=true",
    "evaluators=[]",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("context head")
    return built_synthetic_arc(
        d, ["flip_rotate", "colour_map"], num_train=10, num_test=4, num_aug=1, mode="etrm", seed=3, generator_aug=True
    )[0]


def _evaluate(ev, ck, data, out):
    return ev.run(
        ev.EvaluateConfig(
            checkpoint=str(ck),
            data_path=data,
            output_dir=str(out),
            device="cpu",
            progress=False,
            num_pictures=0,
            use_ema=False,
        )
    )


def test_context_scale_norm_is_wired_from_config_to_checkpoint_to_evaluate(built, tmp_path):
    import evaluate as ev  # noqa: PLC0415 - test-only imports
    from training.build import load_model_for_inference  # noqa: PLC0415
    from training.checkpoint import load_checkpoint_file, read_checkpoint, save_checkpoint_atomic  # noqa: PLC0415
    from training.loop import train  # noqa: PLC0415

    cfg = load_config(
        "cfg_science",
        [
            "encoder=standard",
            *TINY,
            f"data_paths=[{built}]",
            f"checkpoint_path={tmp_path / 'ck'}",
            "encoder.context_scale=norm",
            "encoder.context_scale_init=2.0",
        ],
    )
    summary = train(cfg)
    state = load_checkpoint_file(summary["last_checkpoint"])
    enc_cfg = state["config"]["encoder"]
    model, _, _ = load_model_for_inference(state)
    head = model.encoder.head  # every context token at RMS context_scale_init / sqrt(hidden)
    assert enc_cfg["context_scale"] == "norm" and head.mode == "norm"
    assert head.norm_gain == pytest.approx(2.0 / 32**0.5)
    m = _evaluate(ev, summary["last_checkpoint"], built, tmp_path / "ev")
    for k in ("all.accuracy", "all.lm_loss"):  # evaluate.py rebuilds the trained model: the run's own numbers
        assert m[k] == pytest.approx(summary["final"][f"eval/{k}"], rel=1e-5), k
    raw = read_checkpoint(summary["last_checkpoint"])
    raw["config"]["encoder"]["context_scale"] = "none"  # the same weights without the normalisation
    save_checkpoint_atomic(raw, str(tmp_path / "other.pt"))
    other = _evaluate(ev, tmp_path / "other.pt", built, tmp_path / "ev2")
    assert other["all.lm_loss"] != pytest.approx(m["all.lm_loss"], rel=1e-4)


def test_a_checkpoint_written_before_the_arch_variants_loads_as_one_or_is_refused(built, tmp_path):
    """A checkpoint of the science recipe as commit 0b65cd7 wrote it (config.arch and arch: name trm with
    grid_coords=true, the other switches at their defaults) evaluates as arch=trm_grid (the recipe's core until
    demo memory): the same numbers as the checkpoint written now. One with arch.context_broadcast=true (and its trained
    projection) is refused with one line naming why and the commit that builds it (models/legacy.py)."""
    import evaluate as ev  # noqa: PLC0415 - test-only imports
    from models import ArchRemovedError  # noqa: PLC0415
    from training.checkpoint import read_checkpoint, save_checkpoint_atomic  # noqa: PLC0415
    from training.loop import train  # noqa: PLC0415

    cfg = load_config(
        "cfg_science",
        ["encoder=standard", "arch=trm_grid", *TINY, f"data_paths=[{built}]", f"checkpoint_path={tmp_path / 'ck'}"],
    )
    assert cfg.arch.name == "trm_grid"
    summary = train(cfg)
    raw = read_checkpoint(summary["last_checkpoint"])
    assert "inner.embed_grid.embedding_weight" in raw["model"]
    old = {
        **raw["arch"],
        "name": "trm",
        "grid_coords": True,
        "pointer_init": "identity",
        "pointer_source": "token",
        "context_broadcast": False,
    }
    raw["arch"], raw["config"]["arch"] = old, dict(old)
    save_checkpoint_atomic(raw, str(tmp_path / "old.pt"))
    m = _evaluate(ev, summary["last_checkpoint"], built, tmp_path / "ev")
    m_old = _evaluate(ev, tmp_path / "old.pt", built, tmp_path / "ev-old")
    for k in ("all.accuracy", "all.lm_loss", "all.exact_accuracy"):
        assert m_old[k] == m[k], k
    old = {**old, "context_broadcast": True}
    raw["arch"], raw["config"]["arch"] = old, dict(old)
    raw["model"]["inner.context_proj.weight"] = torch.randn(32, cfg.arch.puzzle_emb_len * 32)
    save_checkpoint_atomic(raw, str(tmp_path / "bc.pt"))
    with pytest.raises(
        ArchRemovedError,
        match=r"^arch\.context_broadcast=true was removed \(measured negative.*"
        r"needs commit 0b65cd7",
    ) as e:
        _evaluate(ev, tmp_path / "bc.pt", built, tmp_path / "ev-bc")
    assert "\n" not in str(e.value)
