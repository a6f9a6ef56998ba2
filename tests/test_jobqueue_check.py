"""``run_jobs.py --check``: a queued line is read with Hydra's own argument parser and composed / validated exactly as
its entry point would (composition only; no training, no data)."""

from __future__ import annotations

import io
import os

import pytest

from experiments.queue.check import check_command, check_jobs, compose_command
from experiments.queue.hydra_command import CommandError, parse_hydra_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ETRM_CFG = "cfg_pretrain_encoder_arc_agi_1"  # has the encoder group, which cfg_pretrain has not

NAME_FORMS = ["--config-name {}", "--config-name={}", "-cn {}"]


# ------------------------------------------------------------------------------------------------ config name
@pytest.mark.parametrize("form", NAME_FORMS)
def test_config_name_forms_check_the_named_config(form):
    # encoder.num_layers exists only in the ETRM config: it composes only if that config is the one checked
    st, msg = check_command(f"python pretrain.py {form.format(ETRM_CFG)} encoder.num_layers=3 +run_name=x", ROOT)
    assert st == "ok" and msg.startswith(f"{ETRM_CFG} (pretrain.py): composes and validates"), msg
    st, msg = check_command("python pretrain.py encoder.num_layers=3 +run_name=x", ROOT)  # the default: refused
    assert st == "error" and "encoder.num_layers" in msg


@pytest.mark.parametrize("form", NAME_FORMS)
def test_config_name_forms_compose_cfg_demo(form):
    hc = parse_hydra_command(f"python pretrain.py {form.format('cfg_demo')} lr=1e-3 +run_name=x", ROOT)
    assert hc.config_name == "cfg_demo" and hc.overrides == ["lr=1e-3", "+run_name=x"] and not hc.multirun
    cfg, task = compose_command(hc, hc.overrides)
    assert cfg.epochs == 50 and cfg.arch.halt_max_steps == 4 and cfg.lr == 1e-3  # cfg_demo's values, the override
    assert task == ["lr=1e-3", "+run_name=x"] and "hydra" not in cfg
    st, msg = check_command(f"python pretrain.py {form.format('cfg_demo')} +run_name=x", ROOT)
    assert st == "ok" and msg.startswith("cfg_demo (pretrain.py)") and "WARNING" not in msg, msg


def test_torchrun_prefix_and_multirun_with_config_name():
    st, msg = check_command(
        "CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node 2 pretrain.py -cn cfg_demo "
        "--multirun lr=1e-3,2e-3 +run_name=x",
        ROOT,
    )
    assert st == "ok" and msg.startswith("cfg_demo (pretrain.py)") and "2 sweep variants" in msg, msg
    st, msg = check_command(
        "torchrun --nproc-per-node 2 pretrain.py -cn cfg_demo --multirun lr=1e-3,abc +run_name=x", ROOT
    )
    assert st == "error" and "lr='abc'" in msg and "lr=abc" in msg, msg


def test_missing_config_name_fails_naming_it_and_the_job_line(tmp_path):
    st, msg = check_command("python pretrain.py --config-name cfg_nope +run_name=x", ROOT)
    assert st == "error" and msg.startswith("config 'cfg_nope' not found (--config-name cfg_nope) in "), msg
    assert "cfg_demo" in msg  # what is there
    jobs = tmp_path / "jobs.txt"
    jobs.write_text(
        "[ ] python pretrain.py -cn cfg_demo +run_name=ok\n[ ] python pretrain.py -cn cfg_nope +run_name=bad\n"
    )
    out = io.StringIO()
    assert check_jobs(str(jobs), workdir=ROOT, out=out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:2] == ["ok", "ok"] and "cfg_demo" in lines[0]
    assert lines[1].split()[:2] == ["error", "bad"] and f"({jobs}:2)" in lines[1] and "'cfg_nope' not found" in lines[1]
    assert lines[2] == "check: 1 command(s) failed"


# ------------------------------------------------------------------------------------------------ values / keys
@pytest.mark.parametrize(
    "override, named", [("lr=abc", "lr='abc'"), ("lr_typo=1", "lr_typo"), ("arch.L_cyclez=2", "arch.L_cyclez")]
)
def test_bad_value_or_unknown_key_fails_with_a_config_name(override, named):
    st, msg = check_command(f"python pretrain.py --config-name=cfg_demo {override} +run_name=x", ROOT)
    assert st == "error" and msg.startswith("cfg_demo (pretrain.py): ") and named in msg, msg


def test_pretrain_encoder_lines_are_validated_like_the_run():
    # pretrain_encoder.py has no config_from_hydra of its own: these used to pass the check unvalidated
    st, msg = check_command("python pretrain_encoder.py lr=abc +run_name=x", ROOT)
    assert st == "error" and msg.startswith(f"{ETRM_CFG} (pretrain_encoder.py): ") and "lr='abc'" in msg, msg
    st, msg = check_command("python pretrain_encoder.py ~encoder +run_name=x", ROOT)
    assert st == "error" and "needs an encoder" in msg, msg
    st, msg = check_command("python pretrain_encoder.py encoder=lpn +run_name=x", ROOT)
    assert st == "ok" and msg.startswith(f"{ETRM_CFG} (pretrain_encoder.py): composes and validates"), msg


# ------------------------------------------------------------------------------------------------ Hydra flags
def test_cfg_job_is_still_checked():
    st, msg = check_command("python pretrain.py --cfg job -cn cfg_demo +run_name=x", ROOT)
    assert st == "ok" and msg.startswith("cfg_demo (pretrain.py)") and "--cfg prints, runs nothing" in msg, msg
    st, msg = check_command("python pretrain.py --cfg job lr=abc", ROOT)
    assert st == "error" and "lr='abc'" in msg, msg
    assert "WARNING" not in check_command("python pretrain.py --cfg=job", ROOT)[1]  # prints: nothing to resume


@pytest.mark.parametrize(
    "args, expected",
    [
        ("--no-such-flag", "unrecognized arguments: --no-such-flag"),
        ("--cfg job --multirun", "Only one of --run, --multirun, --cfg"),
        ("--cfg nonsense", "invalid choice: 'nonsense'"),
        ("--resolve", "--resolve flag can only be used"),
        ("a=1 --multirun b=2", "unrecognized arguments: b=2"),  # argparse takes one run of overrides, as Hydra's
        ("--config-dir no/such/dir", "Additional config directory"),
    ],
)
def test_arguments_hydra_refuses_fail_the_check(args, expected):
    with pytest.raises(CommandError, match=expected.replace("(", r"\(")):
        parse_hydra_command(f"python pretrain.py {args}", ROOT)
    st, msg = check_command(f"python pretrain.py {args}", ROOT)
    assert st == "error" and expected in msg, msg


def test_help_and_version_are_not_checked():
    for flag in ("--help", "-h", "--version", "--hydra-help"):
        st, msg = check_command(f"python pretrain.py {flag}", ROOT)
        assert st == "unchecked", (flag, msg)


def _app(tmp_path):
    """sub/app.py (config_path="conf"; check_config wants x > 0) run from tmp_path, with conf/ and conf2/."""
    sub = tmp_path / "sub"
    for d, name, x in (("conf", "c", 1), ("conf2", "c2", 2)):
        (sub / d).mkdir(parents=True)
        (sub / d / f"{name}.yaml").write_text(f"x: {x}\n")
    (sub / "app.py").write_text(
        "import hydra\n\n\nclass Checked:\n    pass\n\n\ndef check_config(cfg, overrides):\n"
        "    if cfg.x <= 0:\n        raise ValueError(f'x must be positive, got {cfg.x} ({overrides})')\n"
        "    return Checked()\n\n\n"
        '@hydra.main(config_path="conf", config_name="c", version_base=None)\ndef main(cfg):\n    pass\n'
    )
    return sub


def test_config_path_is_relative_to_the_script(tmp_path):
    sub = _app(tmp_path)
    hc = parse_hydra_command("python sub/app.py --config-path conf2 -cn c2", str(tmp_path))
    assert hc.config_dir == os.path.realpath(sub / "conf2") and hc.config_name == "c2"
    assert compose_command(hc, [])[0].x == 2
    st, msg = check_command("python sub/app.py --config-path conf2 -cn c2", str(tmp_path))
    assert st == "ok" and msg == "c2 (app.py): composes and validates as Checked", msg
    st, msg = check_command(f"python sub/app.py -cp {sub / 'conf2'} -cn c2 x=-1", str(tmp_path))  # absolute
    assert st == "error" and "x must be positive, got -1 (['x=-1'])" in msg, msg
    st, msg = check_command("python sub/app.py --config-path conf2", str(tmp_path))  # c is not in conf2
    assert st == "error" and msg.startswith("config 'c' not found (the default of app.py's @hydra.main) in "), msg
    # --config-dir is relative to the working directory and searched too
    st, msg = check_command("python sub/app.py --config-dir sub/conf2 -cn c2", str(tmp_path))
    assert st == "ok" and msg.startswith("c2 (app.py)"), msg


# ------------------------------------------------------------------------------------------------ evaluate.py
def test_evaluate_line_is_checked_as_an_evaluation():
    st, msg = check_command("python evaluate.py checkpoint=checkpoints/p/r data_path=data/d num_augmentations=8", ROOT)
    assert st == "ok" and msg == "cfg_evaluate (evaluate.py): composes and validates as EvaluateConfig", msg
    st, msg = check_command("torchrun --nproc-per-node 2 evaluate.py checkpoint=ck data_path=d use_ema=false", ROOT)
    assert st == "ok" and "WARNING" not in msg and "resume" not in msg, msg


@pytest.mark.parametrize(
    "overrides, named",
    [
        ("use_emma=false", "use_emma"),  # not an evaluate key
        ("num_augmentations=0", "num_augmentations"),  # EvaluateConfig: >= 1
        ("lr=1e-3", "'lr'"),  # a training key
        ("arch.L_cycles=4", "original_trm_checkpoint=true"),  # evaluate.py refuses arch overrides for our checkpoints
    ],
)
def test_evaluate_line_fails_on_a_bad_evaluate_key(overrides, named):
    st, msg = check_command(f"python evaluate.py checkpoint=ck data_path=d {overrides}", ROOT)
    assert st == "error" and msg.startswith("cfg_evaluate (evaluate.py): ") and named in msg, msg


def test_evaluate_line_needs_checkpoint_and_data_path():
    st, msg = check_command("python evaluate.py checkpoint=ck", ROOT)
    assert st == "error" and msg.startswith("cfg_evaluate (evaluate.py): data_path= required"), msg
    st, msg = check_command(
        "python evaluate.py checkpoint=ck data_path=d original_trm_checkpoint=true arch.L_cycles=4", ROOT
    )
    assert st == "ok" and msg == "cfg_evaluate (evaluate.py): composes and validates as EvaluateConfig", msg


# ---------------------------------------------------------------------------------- what a new user gets told
@pytest.mark.parametrize(
    "line, hint",
    [
        ("python pretrain.py lrr=1e-3 +run_name=x", "did you mean lr?"),
        (
            "python pretrain_encoder.py --config-name " + ETRM_CFG + " encoder.hiden_size=8 +run_name=x",
            "did you mean encoder.hidden_size?",
        ),
        ("python evaluate.py checkpoint=c data_path=d use_emma=false", "did you mean use_ema?"),
    ],
)
def test_a_misspelt_key_in_a_queued_line_names_the_closest_known_key(line, hint):
    """--check says what the script itself would say: the closest known key, not Hydra's advice to add the key with
    + (which the strict config refuses next)."""
    st, msg = check_command(line, ROOT)
    assert st == "error" and hint in msg and "To append to your config" not in msg, msg


def test_a_sweep_line_without_multirun_is_refused_naming_its_sweep():
    """Without --multirun Hydra refuses a sweep value (nothing runs): --check names the line's own sweep and the
    number of values, not a placeholder."""
    st, msg = check_command("python pretrain.py lr=1e-3,2e-3 seed=0,1,2 +run_name=x", ROOT)
    assert st == "error" and "(a=1,2)" not in msg, msg
    assert msg.startswith("lr=1e-3,2e-3 (2 values), seed=0,1,2 (3 values): ") and "--multirun" in msg, msg
