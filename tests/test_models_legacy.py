"""Arch configs written before TRM's research switches became variant modules (models/legacy.py): every stored
config (a checkpoint's config.arch / arch, a science run.json record) either reads as today's variant with the
very same parameters, or is refused with one line naming the switch, why it went, and the commit that builds it.
End to end through a checkpoint and evaluate.py: tests/test_context_head_wiring.py."""

import re
from pathlib import Path

import pytest
import torch

from core.errors import one_line
from models import ArchRemovedError, TRMConfig, build_model, parse_arch_config
from models.compat import ArchMismatchError, check_arch_compat, normalise_arch
from models.legacy import LAST_COMMIT, LAST_COMMIT_WITH_REMOVED, REMOVED
from models.registry import ArchConfigError
from models.variants.trm_views import TRMGridConfig

ROOT = Path(__file__).resolve().parents[1]

SEQ = 16  # a square canvas (4 x 4)
# what a stored config of commit 0b65cd7 holds: every field, the four switches at their defaults
OLD = dict(
    name="trm",
    hidden_size=16,
    num_heads=2,
    expansion=2.0,
    puzzle_emb_ndim=0,
    puzzle_emb_len=2,
    pos_encodings="rope",
    grid_coords=False,
    pointer_init="identity",
    pointer_source="token",
    context_broadcast=False,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    forward_dtype="float32",
    loss={"name": "ACTLossHead", "loss_type": "softmax_cross_entropy", "q_loss_weight": 0.5, "extra_loss_weights": {}},
    halt_max_steps=2,
    halt_exploration_prob=0.0,
    halt_early_in_eval=False,
    no_ACT_continue=True,
    H_cycles=2,
    L_cycles=2,
    L_layers=1,
    H_layers=0,
    mlp_t=False,
)
SWITCHES = ("grid_coords", "pointer_init", "pointer_source", "context_broadcast")
# the parameter names an arch=trm model had at commit 0b65cd7 with these switches (L_layers 1, no puzzle embedding)
TRM_KEYS = {
    "inner.embed_tokens.embedding_weight",
    "inner.lm_head.weight",
    "inner.q_head.weight",
    "inner.q_head.bias",
    "inner.H_init",
    "inner.L_init",
    *[
        f"inner.L_level.layers.0.{m}"
        for m in (
            "self_attn.qkv_proj.weight",
            "self_attn.o_proj.weight",
            "mlp.gate_up_proj.weight",
            "mlp.down_proj.weight",
        )
    ],
}
GRID_KEYS = TRM_KEYS | {"inner.embed_grid.embedding_weight"}


def today(**kw):
    """``OLD`` with ``kw``, written the way this version writes it (no switches)."""
    return {k: v for k, v in {**OLD, **kw}.items() if k not in SWITCHES}


def state(cfg, seed=0):
    torch.manual_seed(seed)
    return build_model(cfg, vocab_size=12, seq_len=SEQ, num_puzzle_identifiers=3, batch_size=2).state_dict()


@pytest.mark.parametrize(
    "old,cls,keys",
    [
        ({}, TRMConfig, TRM_KEYS),
        ({"grid_coords": True}, TRMGridConfig, GRID_KEYS),
    ],
    ids=["trm", "grid"],
)
def test_a_stored_trm_config_reads_as_its_variant_with_the_same_parameter_names(old, cls, keys):
    """name trm + grid_coords=true is arch=trm_grid: every other field as stored, the state-dict keys those of the old
    model, and the model the one the same config written today builds (same weights)."""
    stored = {**OLD, **old}
    cfg = parse_arch_config(stored)
    assert type(cfg) is cls
    assert {k: v for k, v in cfg.model_dump().items() if k != "name"} == {
        k: v
        for k, v in stored.items()
        if k not in ("name", "grid_coords", "context_broadcast", "pointer_init", "pointer_source")
    }
    sd = state(stored)
    assert set(sd) == keys
    new = state({**today(**old), "name": cfg.name})
    assert list(sd) == list(new) and all(torch.equal(v, new[k]) for k, v in sd.items())


def test_hrm_and_transformer_configs_drop_the_switches_at_their_defaults():
    for name, extra in (("hrm", {"H_layers": 1}), ("transformer", {"num_layers": 1})):
        stored = {
            k: v
            for k, v in OLD.items()
            if k
            not in (
                "H_cycles",
                "L_cycles",
                "L_layers",
                "H_layers",
                "mlp_t",
                "halt_max_steps",
                "halt_exploration_prob",
                "halt_early_in_eval",
                "no_ACT_continue",
            )
        }
        cfg = parse_arch_config({**stored, **extra, "name": name})
        assert cfg.name == name and not set(SWITCHES) & set(cfg.model_dump())


@pytest.mark.parametrize(
    "stored,match",
    [
        (
            {"context_broadcast": True},
            r"arch\.context_broadcast=true was removed \(measured negative: run f8-bc .*0\.08",
        ),
        (
            {"name": "hrm", "grid_coords": True, "H_layers": 1},
            r"arch\.grid_coords=true on arch=hrm was removed \(.*arch=trm_grid",
        ),
        ({"pos_encodings": "pointer"}, r"arch\.pos_encodings=pointer without arch\.grid_coords=true was removed"),
    ],
    ids=["context_broadcast", "grid-on-hrm", "pointer-without-grid"],
)
def test_a_removed_switch_is_refused_with_one_line_naming_why_and_the_commit(stored, match):
    """Refused wherever a stored config is read: parsing it, validating a whole training config from a checkpoint
    (pydantic passes the error through unwrapped: the user sees this line, not a validation dump), and the
    resume / pretrained-decoder check (naming the file)."""
    from training.checkpoint import CheckpointError, check_arch_compatible
    from training.config import PretrainConfig

    old = {**OLD, **stored}
    if old["name"] == "hrm":
        old = {k: v for k, v in old.items() if k not in ("H_cycles", "L_cycles", "L_layers", "mlp_t")}
    with pytest.raises(ArchRemovedError, match=match) as e:
        parse_arch_config(old)
    assert one_line(str(e.value)) == str(e.value) and f"needs commit {LAST_COMMIT}" in str(e.value)
    with pytest.raises(ArchRemovedError, match=match):
        PretrainConfig.model_validate({"arch": old, "data_paths": ["unused"]})
    with pytest.raises(CheckpointError, match=f"^ck/step_9.pt: {match}"):
        check_arch_compatible(old, today(), source="ck/step_9.pt")


def test_a_pointer_field_without_the_pointer_variant_is_refused_not_dropped():
    """Pitfall 8: a switch set to something other than its old default is never dropped silently."""
    with pytest.raises(ArchRemovedError, match="pointer_init=dihedral applies to the pointer variant only"):
        parse_arch_config({**OLD, "pointer_init": "dihedral"})
    with pytest.raises(ArchRemovedError, match="pointer_source=context applies to the pointer variant only"):
        parse_arch_config({**OLD, "grid_coords": True, "pointer_source": "context"})
    with pytest.raises(ArchRemovedError, match="context_broadcast=true was removed"):  # today's name, an old switch
        parse_arch_config({**today(), "name": "trm_grid", "context_broadcast": True})


def test_resume_and_decoder_checks_compare_an_old_arch_with_today_s():
    """The structural check of a resume / load reads the stored arch as today's (same model: accepted) and still
    refuses a real difference, naming it."""
    from training.checkpoint import check_arch_compatible

    old, new = {**OLD, "grid_coords": True}, {**today(), "name": "trm_grid"}
    assert normalise_arch(old) == normalise_arch(new)
    check_arch_compat(old, new)
    check_arch_compatible(old, new)
    with pytest.raises(ArchMismatchError, match="name: checkpoint has 'trm_grid', model has 'trm'"):
        check_arch_compat(old, today())
    with pytest.raises(ArchMismatchError, match="L_cycles: checkpoint has 2, model has 3"):
        check_arch_compat(old, {**new, "L_cycles": 3})


# ------------------------------------------------------------------------- pruned by the renovation (issue 43)
VIEWS = {**today(), "name": "trm_views", "memory_width": 16}
PRUNED = [  # (a config that uses it, the REMOVED entry, a figure of its measurement)
    ({**today(), "name": "trm_pointer", "pos_encodings": "pointer"}, "name=trm_pointer", "0.08 / 0.06"),
    ({**today(), "name": "trm_pointer_memory", "pos_encodings": "pointer"}, "name=trm_pointer_memory", "0.18"),
    ({**OLD, "grid_coords": True, "pos_encodings": "pointer"}, "name=trm_pointer", "0.08 / 0.06"),  # 0b65cd7's form
    ({**today(), "name": "trm_grid", "pos_encodings": "rope2d"}, "pos_encodings=rope2d", "0.55"),
    ({**OLD, "grid_coords": True, "pos_encodings": "rope2d"}, "pos_encodings=rope2d", "0.55"),
    ({**today(), "name": "hrm", "H_layers": 1, "pos_encodings": "rope2d"}, "pos_encodings=rope2d", "0.55"),
    ({**VIEWS, "views_gate": "context"}, "views_gate=context", "0.24-0.25"),
    ({**VIEWS, "views_embed": "view"}, "views_embed=view", "0.58 -> 0.67"),
]


@pytest.mark.parametrize("stored,entry,figure", PRUNED, ids=[f"{e}-{i}" for i, (_, e, _) in enumerate(PRUNED)])
def test_a_pruned_variant_or_option_is_refused_in_one_line_naming_its_measurement_and_the_last_commit(
    stored, entry, figure
):
    """Parsing a config, validating a training config (a checkpoint's) and the resume / fine-tune check all refuse
    it with the REMOVED line: what, the measurement (a figure, its commit and record file) and 3548346."""
    from training.checkpoint import CheckpointError, check_arch_compatible
    from training.config import PretrainConfig

    if stored["name"] == "hrm":
        stored = {k: v for k, v in stored.items() if k not in ("H_cycles", "L_cycles", "L_layers", "mlp_t")}
    why, commit = REMOVED[entry]
    assert commit == LAST_COMMIT_WITH_REMOVED == "3548346" and figure in why and "docs/record/" in why
    with pytest.raises(ArchRemovedError) as e:
        parse_arch_config(stored)
    msg = str(e.value)
    assert one_line(msg) == msg and why in msg and msg.endswith("needs commit 3548346 (git checkout 3548346)")
    assert f"arch={entry.partition('=')[2]}" in msg if entry.startswith("name=") else f"arch.{entry}" in msg
    with pytest.raises(ArchRemovedError, match="git checkout 3548346"):
        PretrainConfig.model_validate({"arch": stored, "data_paths": ["unused"]})
    with pytest.raises(CheckpointError, match="^ck/step_9.pt: .*needs commit 3548346"):
        check_arch_compatible(stored, today(), source="ck/step_9.pt")


def test_a_views_config_stored_before_views_embed_existed_is_refused_as_one_table_per_view():
    """A trm_views dump without views_embed (written before 1eb95e2) had one table per view: refused, not read as
    today's default (kind); a hand-written config without it is today's default."""
    dump = parse_arch_config(VIEWS).model_dump()
    old = {k: v for k, v in dump.items() if k not in ("views_embed", "cell_features", "demo_lookup")}
    with pytest.raises(ArchRemovedError, match=r"arch\.views_embed=view was removed"):
        parse_arch_config(old)
    assert parse_arch_config({**today(), "name": "trm_views"}).views_embed == "kind"


# ------------------------------------------------------------------------- pruned after its record (issue 46)
COPY = {**VIEWS, "name": "trm_local", "grid_gather": True, "gather_demo_form": True}


@pytest.mark.parametrize(
    "key,figure,commit",
    [
        ("gather_copy", "0.09 / 0.08", "ef50ddb"),
        ("gather_copy", "0.41 / 0.41", "ef50ddb"),
        ("gather_copy_detach", "p = 0.08", "ef50ddb"),
        ("gather_copy_recolour", "cf65393", "ef50ddb"),
        ("gather_copy_lm_loss", "0.27 / 0.23", "ef50ddb"),
        ("gather_copy_detach", "0.29 / 0.24", "ef50ddb"),
        ("gather_demo_input", "0.24 / 0.22", "c47b590"),
    ],
)
def test_the_gather_options_pruned_after_their_record_are_refused_naming_it_and_their_off_dump_reads_as_today(
    key, figure, commit
):
    """gather_copy (measured negative at c504376, with the LM head's own loss at cf65393 and with its mixture on a
    detached state at ef50ddb), gather_copy_recolour, gather_copy_lm_loss, gather_copy_detach and gather_demo_input
    (c47b590): on, refused in one line by the parser, a training config and the checkpoint check; off, as every
    trm_views dump of those commits lists them, dropped: the dump parses to today's config (an unknown field would
    be refused, so the drop is what makes it read)."""
    from training.checkpoint import CheckpointError, check_arch_compatible
    from training.config import PretrainConfig

    stored = {**COPY, key: True}  # each entry on its own: its own line refuses it
    why, last = REMOVED[f"{key}=true"]
    assert last == commit and figure in why
    records = re.findall(r"docs/record/[\w.-]+\.md", why)  # every record the reason cites is in the repository
    assert records and all((ROOT / r).is_file() for r in records)
    with pytest.raises(ArchRemovedError) as e:
        parse_arch_config(stored)
    msg = str(e.value)
    assert one_line(msg) == msg and msg.endswith(f"needs commit {commit} (git checkout {commit})")
    assert msg.startswith(f"arch.{key}=true was removed") and why in msg
    with pytest.raises(ArchRemovedError, match=f"git checkout {commit}"):
        PretrainConfig.model_validate({"arch": stored, "data_paths": ["unused"]})
    with pytest.raises(CheckpointError, match=f"^ck/step_9.pt: .*needs commit {commit}"):
        check_arch_compatible(stored, today(), source="ck/step_9.pt")
    dump = parse_arch_config(COPY).model_dump()
    off = {k: False for k in ("gather_copy", "gather_copy_recolour", "gather_copy_lm_loss", "gather_copy_detach")}
    off["gather_demo_input"] = False
    assert parse_arch_config({**dump, **off}).model_dump() == dump
    with pytest.raises(ArchConfigError, match="unknown key 'arch.gather_copi'"):
        parse_arch_config({**dump, "gather_copi": False})
