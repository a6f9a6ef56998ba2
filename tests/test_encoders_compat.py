"""Old checkpoints and configs after the encoder options were removed or moved (encoders.config: REMOVED,
upgrade_encoder_config): every checkpoint loads, or is refused in one line naming why.

* the parameters (names and shapes) of every encoder are those of the checkpoints written before the split of
  encoders/base.py (digests taken from that code, commit 0b65cd7);
* a stored config of that time (every field, the removed ones at their defaults) loads to the same model;
* ``encoder=standard encoder.dihedral_views=true`` loads as ``encoder=dihedral_views`` (the same weights);
* ``encoder.context_codes=K`` and ``encoder.pointer=dihedral`` (measured negative, removed) are refused in one line
  that names the option, why, and the commit that has it -- by evaluate.py too.
"""

import hashlib
import os
import subprocess
import sys

import pytest
import torch

from core.errors import user_error_message
from encoders import ENCODER_REGISTRY, EncoderConfigError, RemovedOptionError, build_encoder, parse_encoder_config
from training.config import load_config

SMALL = {"hidden_size": 32, "num_heads": 4}
OPTIONS = {"grid_coords": True, "pointer": "identity", "context_scale": "gate"}
# The science probes' heads (rule_readout, oracle_context) are sized by dataset.rule_labels.RULE_SLOTS, which
# benchmark v2 changed (9 families, no wrap slot; docs/record/2026-11-27-benchmark-v2.md): a v1 probe checkpoint
# does not load into them, so they are left out of these digests.
# sha256 of the sorted "name shape" lines of each encoder's state_dict (hidden 32, 4 heads, seq_len 16, vocab 12,
# context 4 x 16), computed with the code before the split (commit 0b65cd7): a checkpoint of then loads now
STATE_DICT_DIGESTS = {
    "standard": ({"name": "standard", **SMALL}, "1c69372b11330a77"),
    "standard+options": ({"name": "standard", **SMALL, **OPTIONS}, "715e61d133d5512b"),
    "variational": ({"name": "variational", **SMALL}, "813e7715accd69cf"),
    "variational+options": ({"name": "variational", **SMALL, **OPTIONS}, "e833f747c288d4be"),
    "lpn": ({"name": "lpn", **SMALL}, "10cac385097ec2e9"),
    "lpn+options": ({"name": "lpn", **SMALL, **OPTIONS}, "ca7312438704f492"),
    "lpn+variational": ({"name": "lpn", **SMALL, "variational": True}, "559d5f63d0deeb3d"),
    "hybrid": ({"name": "hybrid", **SMALL}, "8f59c40f8d7bf441"),
    "hybrid+options": ({"name": "hybrid", **SMALL, **OPTIONS}, "9e808929bdb3878e"),
    "recurrent": ({"name": "recurrent", **SMALL}, "43bad66a748802dc"),
    "recurrent+options": ({"name": "recurrent", **SMALL, **OPTIONS}, "f3366ebe84e3f165"),
    "dihedral_views": ({"name": "dihedral_views", **SMALL}, "6b82db44f7e54d2f"),
}
# the encoder fields a config stored before the change carries that no config class has now (at their defaults)
OLD_DEFAULTS = {"context_codes": 0, "dihedral_views": False}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(cfg):
    torch.manual_seed(0)
    return build_encoder(cfg, hidden_size=16, vocab_size=12, seq_len=16, puzzle_emb_len=4, verbose=False)


@pytest.mark.parametrize("case", sorted(STATE_DICT_DIGESTS))
def test_state_dict_names_and_shapes_are_those_of_the_old_checkpoints(case):
    cfg, digest = STATE_DICT_DIGESTS[case]
    sd = build(cfg).state_dict()
    lines = "\n".join(f"{n} {tuple(v.shape)}" for n, v in sorted(sd.items()))
    assert hashlib.sha256(lines.encode()).hexdigest()[:16] == digest, f"{case}: parameters changed:\n{lines}"


@pytest.mark.parametrize("name", ["standard", "variational", "lpn", "hybrid", "recurrent"])
def test_a_stored_config_of_before_the_change_gives_the_same_encoder(name):
    """A checkpoint stores every field of its encoder config: the fields removed since, at their old defaults, are
    accepted and the model is the one of today's config (same weights, same outputs)."""
    new = ENCODER_REGISTRY[name].config(name=name, **SMALL)
    old = dict(new.model_dump(mode="json"), **OLD_DEFAULTS)
    assert parse_encoder_config(old) == new
    a, b = build(old), build(new)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_dihedral_views_of_an_old_config_load_as_the_variant():
    old = dict(
        ENCODER_REGISTRY["standard"].config(name="standard", **SMALL).model_dump(mode="json"),
        context_codes=0,
        dihedral_views=True,
        rule_readout=1.0,
    )
    cfg = parse_encoder_config(old)
    assert cfg.name == "dihedral_views" and cfg.rule_readout == 1.0 and "dihedral_views" not in cfg.model_dump()
    enc = build(old)
    assert type(enc) is ENCODER_REGISTRY["dihedral_views"].cls and enc.rule_head is not None
    assert {"trunk.view_tok", "trunk.view_eq"} <= set(enc.state_dict())
    with pytest.raises(RemovedOptionError, match="dihedral_views=true with encoder=variational is no longer"):
        parse_encoder_config({"name": "variational", "dihedral_views": True})
    with pytest.raises(EncoderConfigError, match="contradicts encoder=dihedral_views"):
        parse_encoder_config({"name": "dihedral_views", "dihedral_views": False})


@pytest.mark.parametrize(
    "over,what",
    [
        ({"context_codes": 32}, "encoder.context_codes=32 was removed"),
        ({"pointer": "dihedral"}, "encoder.pointer=dihedral was removed"),
    ],
)
def test_a_removed_option_is_refused_in_one_line_naming_why_and_the_commit(over, what):
    with pytest.raises(RemovedOptionError) as e:
        parse_encoder_config({"name": "standard", **over})
    msg = user_error_message(e.value)  # an entry point's one line
    assert msg is not None and "\n" not in msg and what in msg and "measured negative" in msg
    assert "needs commit 0b65cd7" in msg
    with pytest.raises(RemovedOptionError, match="context_codes=4 was removed"):  # on the command line too
        load_config("cfg_science", ["data_paths=[x]", "encoder=standard", "+encoder.context_codes=4"])


def test_old_checkpoints_load_or_are_refused_through_evaluate(tmp_path):
    """End to end: a trained checkpoint whose stored config is rewritten as the code before the change wrote it
    (every field, dihedral_views as a flag of the standard encoder) loads to the same weights, and evaluate.py
    refuses one with context_codes in one line (exit 1), as a user error."""
    from tests.toy_data import write_tiny_recolour  # noqa: PLC0415 - test-only imports
    from training.build import load_model_for_inference  # noqa: PLC0415
    from training.checkpoint import read_checkpoint, save_checkpoint_atomic  # noqa: PLC0415
    from training.loop import train  # noqa: PLC0415

    data = tmp_path / "data"
    write_tiny_recolour(data)
    cfg = load_config(
        "cfg_science",
        [
            f"data_paths=[{data}]",
            "encoder=dihedral_views",
            f"checkpoint_path={tmp_path / 'ck'}",
            "arch.hidden_size=32",
            "arch.num_heads=2",
            "encoder.hidden_size=32",
            "encoder.num_heads=2",
            "encoder.num_layers=1",
            "encoder.grid_coords=false",
            "global_batch_size=8",
            "max_steps=2",
            "device=cpu",
        ],
    )
    summary = train(cfg)
    raw = read_checkpoint(summary["last_checkpoint"])
    new, _, _ = load_model_for_inference(raw, use_ema=False)
    enc = raw["config"]["encoder"]
    raw["config"]["encoder"] = dict(enc, name="standard", dihedral_views=True, context_codes=0)
    save_checkpoint_atomic(raw, str(tmp_path / "old.pt"))
    old, old_cfg, _ = load_model_for_inference(str(tmp_path / "old.pt"), use_ema=False)
    assert old_cfg.encoder.name == "dihedral_views" and type(old.encoder) is type(new.encoder)
    assert all(torch.equal(v, new.state_dict()[k]) for k, v in old.state_dict().items())
    raw["config"]["encoder"]["context_codes"] = 4
    save_checkpoint_atomic(raw, str(tmp_path / "codes.pt"))
    with pytest.raises(RemovedOptionError, match="context_codes=4 was removed"):
        load_model_for_inference(str(tmp_path / "codes.pt"))
    r = subprocess.run(
        [
            sys.executable,
            "evaluate.py",
            f"checkpoint={tmp_path / 'codes.pt'}",
            f"data_path={data}",
            f"output_dir={tmp_path / 'ev'}",
            "device=cpu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=300,
        check=False,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: encoder.context_codes=4 was removed (measured")
