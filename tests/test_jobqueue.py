"""jobs.txt format, gates, command checks and the SLURM bridge (no subprocesses; fast)."""

from __future__ import annotations

import json
import os

import pytest

from experiments.queue.gates import evaluate_gates, lookup_metric, parse_requirement, summary_path
from experiments.queue.jobfile import (
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    SKIPPED,
    JobFile,
    JobFileError,
    JobStore,
    parse_job_line,
)
from experiments.queue.runner import deliberate_stop, resume_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SAMPLE = (
    "# ==== Phase 1: overfit ====\n"
    "## notes: anything here is kept\n"
    "\n"
    "[ ] python pretrain.py +run_name=a  # id=a\n"
    "[x] python pretrain.py +run_name=b   # id=b  # free comment  # done: 3s, attempt 1, log logs/b.log\n"
    "  [!] echo 'quoted # hash' \"and # here\"  # failed: exit code 3; log logs/x.log\r\n"
    "[-] echo skipped  # requires: a train/exact_accuracy>0.9  # skipped: gate failed\n"
    "[ ] echo dup\n"
    "[~] echo dup  # running: pid 1 on h, since x, attempt 1/2, log logs/d.log [t=abc123]\n"
    "[ ] echo tail # see issue #5\n"
    "   \n"
    "# trailing comment without newline"
)


def test_round_trip_preserves_every_byte():
    jf = JobFile.parse(SAMPLE)
    assert jf.render() == SAMPLE
    marks = [j.mark for j in jf.jobs]
    assert marks == [PENDING, DONE, FAILED, SKIPPED, PENDING, RUNNING, PENDING]


def test_fields_of_parsed_lines():
    jobs = JobFile.parse(SAMPLE).jobs
    a, b, failed, skipped, dup0, dup1, tail = jobs
    assert a.command == "python pretrain.py +run_name=a" and a.id == "a" and a.note == ""
    assert b.id == "b" and b.note.startswith("done: 3s") and b.body.endswith("# free comment")
    assert failed.command == "echo 'quoted # hash' \"and # here\"" and failed.indent == "  "
    assert failed.note == "failed: exit code 3; log logs/x.log"
    assert skipped.requires == ["a:train/exact_accuracy>0.9"]
    assert (dup0.key, dup1.key) == (("echo dup", 0), ("echo dup", 1))
    assert dup1.token == "abc123" and dup0.token is None
    # "#5" is not a segment separator, and a free comment is not metadata
    assert tail.command == "echo tail" and tail.meta == {} and tail.note == ""


def test_status_change_rewrites_only_that_line():
    jf = JobFile.parse(SAMPLE)
    job = jf.find(key=("python pretrain.py +run_name=b", 0))
    job.set_status(FAILED, "failed: exit code 1\nsecond line")
    out = jf.render().split("\n")
    orig = SAMPLE.split("\n")
    changed = [i for i, (x, y) in enumerate(zip(out, orig)) if x != y]
    assert changed == [4]
    assert out[4] == ("[!] python pretrain.py +run_name=b   # id=b  # free comment  # failed: exit code 1 second line")
    again = JobFile.parse(jf.render()).jobs[1]
    assert again.mark == FAILED and again.id == "b" and again.note == "failed: exit code 1 second line"
    # a '#' in a note cannot break the line's structure
    again.set_status(FAILED, "failed: see # 3 in /tmp/a #b")
    back = JobFile.parse(again.render()).jobs[0]
    assert back.note == "failed: see %23 3 in /tmp/a %23b" and back.id == "b" and back.body == again.body
    # a status note is replaced, not stacked
    again.set_status(DONE, "done: 1s")
    assert again.render().count("#") == 3 and again.render().endswith("# free comment  # done: 1s")


def test_find_by_token_survives_edits():
    jf = JobFile.parse(SAMPLE)
    edited = "[ ] echo dup\n" + jf.render()  # someone inserts an identical command above
    jf2 = JobFile.parse(edited)
    assert jf2.find(key=("echo dup", 1), token="abc123").mark == RUNNING  # found by token
    assert jf2.find(key=("echo dup", 1)).mark == PENDING  # the key alone would now name the wrong line


@pytest.mark.parametrize(
    "line, msg",
    [
        ("[?] echo x", "bad job line"),
        ("[] echo x", "bad job line"),
        ("echo x", "not a job"),
        ("[ ]   ", "without a command"),
        ("[ ] echo x  # id=a retires=2", "unknown job tag 'retires=2'"),
        ("[ ] echo x  # id=a id=b", "given twice"),
        ("[ ] echo x  # id=a retries=two", "non-negative integer"),
        ("[ ] echo x  # id=a/b", "may only contain"),
        ("[ ] echo x  # requires: a b c", "expected '# requires:"),
        ("[ ] echo x  # id=a first try", "mixes tags with free words"),
        # a tag segment with a misspelt key used to be a free comment (the gate silently dropped)
        (
            "[ ] echo x  # requirs=base",
            r"unknown job tag 'requirs=base' \(did you mean 'requires='\?\); known tags: id, ",
        ),
        ("[ ] echo x  # lr=1e-4", "unknown job tag 'lr=1e-4'; known tags"),
        ("[ ] echo x  # then Retries=2 if it crashes", "unknown job tag 'Retries=2' \\(did you mean 'retries='"),
    ],
)
def test_malformed_lines_name_file_and_line(line, msg):
    with pytest.raises(JobFileError, match=msg) as ei:
        JobFile.parse("# header\n" + line + "\n", path="q.txt")
    assert "q.txt:2" in str(ei.value)


def test_file_level_validation():
    with pytest.raises(JobFileError, match="job id 'a' already used on line 1"):
        JobFile.parse("[ ] echo 1  # id=a\n[ ] echo 2  # id=a\n")
    with pytest.raises(JobFileError, match="unknown job id 'zz'"):
        JobFile.parse("[ ] echo 1  # id=a\n[ ] echo 2  # requires=zz:m>1\n")
    with pytest.raises(JobFileError, match="dependency cycle"):
        JobFile.parse("[ ] echo 1  # id=a requires=b\n[ ] echo 2  # id=b requires=a\n")
    with pytest.raises(JobFileError, match="bad requirement"):
        JobFile.parse("[ ] echo 1  # id=a\n[ ] echo 2  # requires=a:train/acc~0.9\n")
    with pytest.raises(JobFileError, match="bad threshold"):
        JobFile.parse("[ ] echo 1  # id=a\n[ ] echo 2  # requires=a:train/acc>high\n")


def test_free_comment_with_key_value_is_not_metadata():
    job = parse_job_line("[ ] echo x  # lr=1e-4 was best  # note: a=b")
    assert job.meta == {} and job.requires == []


def test_store_edit_is_atomic_and_locked(tmp_path):
    p = tmp_path / "jobs.txt"
    p.write_text("# h\n[ ] echo 1\n")
    store = JobStore(str(p), lock_timeout=0.5)
    with store.edit() as jf:
        jf.jobs[0].set_status(DONE, "done: 0s")
        other = JobStore(str(p), lock_timeout=0.2)  # a second runner cannot get in meanwhile
        with pytest.raises(TimeoutError, match="could not lock"):
            with other.edit():
                pass
    assert p.read_text() == "# h\n[x] echo 1  # done: 0s\n"
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


# ------------------------------------------------------------------------------------------------ gates
def _write_summary(d, data):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(data, f)


def test_parse_requirement_forms():
    r = parse_requirement("ov:train/exact_accuracy>=0.9")
    assert (r.job_id, r.metric, r.op, r.threshold, r.section) == ("ov", "train/exact_accuracy", ">=", 0.9, None)
    r = parse_requirement("ov:final:ARC/pass@2 != 0")
    assert (r.metric, r.op, r.threshold, r.section) == ("ARC/pass@2", "!=", 0.0, "final")
    assert parse_requirement("ov").metric is None


def test_lookup_order_and_sections():
    s = {"steps": 100, "best": {"m": 0.9, "all.exact_accuracy": 0.5}, "final": {"m": 0.7, "only_final": 1.0}}
    assert lookup_metric(s, "steps") == 100.0
    assert lookup_metric(s, "m") == 0.9  # best before final
    assert lookup_metric(s, "m", "final") == 0.7
    assert lookup_metric(s, "only_final") == 1.0
    assert lookup_metric(s, "all.exact_accuracy") == 0.5
    assert lookup_metric(s, "nope") is None
    assert lookup_metric({"best": {"m": {"value": 0.3, "step": 5}}}, "m") == 0.3
    assert lookup_metric({"best": {"eval/all.exact_accuracy": 0.25}}, "all.exact_accuracy") == 0.25


def test_summary_location_rules(tmp_path):
    wd = str(tmp_path)
    j = parse_job_line("[x] python pretrain.py checkpoint_path=ck/a +run_name=zz")
    assert summary_path(j, wd) == os.path.join(wd, "ck/a/summary.json")
    j = parse_job_line("[x] python pretrain.py +project_name=p +run_name=r")
    assert summary_path(j, wd) == os.path.join(wd, "checkpoints/p/r/summary.json")
    j = parse_job_line("[x] python pretrain.py +project_name=p +run_name=r  # summary=/abs/x")
    assert summary_path(j, wd) == "/abs/x/summary.json"
    assert summary_path(parse_job_line("[x] python pretrain.py +run_name=r"), wd) is None


def _gate(tmp_path, dep_line, req, summary=None):
    if summary is not None:
        _write_summary(str(tmp_path / "ck"), summary)
    jf = JobFile.parse(dep_line + "\n" + f"[ ] echo next  # requires={req}\n")
    return evaluate_gates(jf.jobs[1], jf.by_id(), str(tmp_path))


def test_gate_decisions(tmp_path):
    dep = "[x] python pretrain.py checkpoint_path=ck  # id=ov"
    d = _gate(tmp_path, dep, "ov:train/exact_accuracy>0.90", {"best": {"train/exact_accuracy": 0.95}})
    assert d.action == "run" and "0.95" in d.reason
    d = _gate(tmp_path, dep, "ov:train/exact_accuracy>0.90", {"best": {"train/exact_accuracy": 0.42}})
    assert d.action == "skip"
    assert "train/exact_accuracy=0.42" in d.reason and "> 0.9" in d.reason and "ck/summary.json" in d.reason
    d = _gate(tmp_path, dep, "ov:train/exact_accuracy>0.40", {"best": {"train/exact_accuracy": 0.42}})
    assert d.action == "run"  # threshold configurable
    d = _gate(tmp_path, dep, "ov:train/lm_loss<0.5", {"final": {"train/lm_loss": float("nan")}})
    assert d.action == "skip"  # NaN never passes
    d = _gate(tmp_path, dep, "ov:ARC/pass@1>0", {"best": {"train/exact_accuracy": 1.0}})
    assert d.action == "skip" and "missing" in d.reason and "best:train/exact_accuracy" in d.reason
    # dependency states
    assert _gate(tmp_path, dep.replace("[x]", "[ ]"), "ov:m>0").action == "wait"
    assert _gate(tmp_path, dep.replace("[x]", "[~]"), "ov:m>0").action == "wait"
    d = _gate(tmp_path, dep.replace("[x]", "[!]"), "ov:m>0")
    assert d.action == "skip" and "failed" in d.reason
    d = _gate(tmp_path, dep.replace("[x]", "[-]"), "ov")
    assert d.action == "skip" and "skipped" in d.reason
    assert _gate(tmp_path, dep, "ov").action == "run"
    d = _gate(tmp_path, "[x] echo no-summary  # id=ov", "ov:m>0")
    assert d.action == "skip" and "cannot locate" in d.reason


def test_gate_summary_missing_file(tmp_path):
    d = _gate(tmp_path, "[x] python pretrain.py checkpoint_path=nowhere  # id=ov", "ov:m>0")
    assert d.action == "skip" and "not found" in d.reason and "nowhere/summary.json" in d.reason


def test_resume_command():
    assert resume_command("python pretrain.py a=1", "resume=true") == "python pretrain.py a=1 resume=true"
    assert resume_command("python pretrain.py resume=false", "resume=true") == "python pretrain.py resume=false"
    assert resume_command("python x.py --resume", "--resume") == "python x.py --resume"
    assert resume_command("python x.py", "") == "python x.py"


def test_deliberate_stop_follows_training_summary_semantics():
    assert deliberate_stop({"status": "finished", "stop_reason": "early_stop: encoder collapsed", "exit_status": 3})
    assert deliberate_stop({"status": "failed", "stop_reason": "non-finite loss", "exit_status": 2})
    assert not deliberate_stop({"status": "running", "stop_reason": None})  # killed mid-run: retry
    assert not deliberate_stop({"status": "failed", "stop_reason": "interrupted", "exit_status": 130})
    assert not deliberate_stop({"status": "failed", "stop_reason": None, "message": "CUDA out of memory"})
    assert not deliberate_stop(None)


# ------------------------------------------------------------------------------------------------ slurm
def test_slurm_env_and_hostlist():
    from experiments.queue.slurm import first_hostname, slurm_torch_env

    assert first_hostname("gpu[03-05,9],cpu1") == "gpu03"
    assert first_hostname("a1,b2") == "a1"
    assert first_hostname("node[7]") == "node7"
    env = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_NTASKS": "8",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NODELIST": "gpu[11-12]",
        "SLURM_JOB_NUM_NODES": "2",
    }
    out = slurm_torch_env(env)
    assert out == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "gpu11",
        "MASTER_PORT": str(20000 + 1234),
    }
    assert slurm_torch_env({**env, "RANK": "0"}) is None  # under torchrun: leave alone
    assert slurm_torch_env({**env, "SLURM_NTASKS": "1"}) is None
    assert slurm_torch_env({k: v for k, v in env.items() if k != "SUBMITIT_EXECUTOR"}) is None
    with pytest.raises(RuntimeError, match="SLURM_PROCID"):
        slurm_torch_env({k: v for k, v in env.items() if k != "SLURM_PROCID"})


def _compose_with_launcher(overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import training.config  # noqa: F401  (registers the config defaults cfg_pretrain composes)

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=os.path.join(ROOT, "config"), version_base=None):
            return compose("cfg_pretrain", overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_submitit_slurm_launcher_config_composes(monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    if not os.path.isfile(os.path.join(ROOT, "config", "cfg_pretrain.yaml")):
        pytest.skip("config/cfg_pretrain.yaml not there yet")
    from hydra.utils import instantiate

    cfg = _compose_with_launcher(
        [
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.gpus_per_node=2",
            "hydra.launcher.tasks_per_node=2",
        ]
    )
    lc = cfg.hydra.launcher
    assert lc._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (lc.partition, lc.gpus_per_node, lc.tasks_per_node, lc.nodes) == ("gpu", 2, 2, 1)
    assert cfg.hydra.runtime.choices["hydra/launcher"] == "submitit_slurm"
    cb = instantiate(cfg.hydra.callbacks.slurm_torch_distributed)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(k, "unset")  # recorded, so the callback's exports are undone after the test
        monkeypatch.delenv(k)
    for k, v in {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "n01",
    }.items():
        monkeypatch.setenv(k, v)
    cb.on_job_start(config=cfg)
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"], os.environ["MASTER_ADDR"]) == (
        "1",
        "2",
        "1",
        "n01",
    )
    # a typo in a launcher field fails (validated against the plugin's schema)
    with pytest.raises(Exception, match="gpus_per_nod"):
        _compose_with_launcher(["hydra/launcher=submitit_slurm", "hydra.launcher.gpus_per_nod=2"])


# ------------------------------------------------------------------------------------------------ checks
def test_expand_sweeps_covers_each_value():
    from experiments.queue.check import expand_sweeps

    v = expand_sweeps(["arch.halt_max_steps=8,16,32", "lr=1e-4", "arch.halt_exploration_prob=0.0,0.7"])
    assert len(v) == 4
    assert {x[0] for x in v} == {"arch.halt_max_steps=8", "arch.halt_max_steps=16", "arch.halt_max_steps=32"}
    assert {x[2] for x in v} == {"arch.halt_exploration_prob=0.0", "arch.halt_exploration_prob=0.7"}
    assert all(x[1] == "lr=1e-4" for x in v)


def test_parse_hydra_command(tmp_path):
    from experiments.queue.check import parse_hydra_command

    (tmp_path / "app.py").write_text(
        'import hydra\n@hydra.main(config_path="conf", config_name="c", version_base=None)\ndef main(cfg):\n    pass\n'
    )
    hc = parse_hydra_command(
        'CUDA_VISIBLE_DEVICES=0 torchrun --nproc-per-node 4 app.py --multirun a=1,2 data_paths="[d/x]"', str(tmp_path)
    )
    assert hc.config_name == "c" and hc.config_dir == str(tmp_path / "conf")
    assert hc.overrides == ["a=1,2", "data_paths=[d/x]"] and hc.multirun
    assert parse_hydra_command("echo hi", str(tmp_path)) is None


def test_check_command_against_real_config():
    from experiments.queue.check import check_command

    if not os.path.isfile(os.path.join(ROOT, "config", "cfg_pretrain.yaml")):
        pytest.skip("config/cfg_pretrain.yaml not there yet")
    st, msg = check_command("python pretrain.py --multirun arch.halt_max_steps=8,16 +run_name=x", ROOT)
    assert st == "ok", msg
    st, msg = check_command("python pretrain.py lr_typo=1", ROOT)
    assert st == "error" and "lr_typo" in msg
    st, msg = check_command("python pretrain.py global_batch_size=-3", ROOT)
    assert st == "error" and "global_batch_size" in msg
    st, msg = check_command("python pretrain.py arch.halt_max_steps=8,16", ROOT)
    assert st == "error" and "--multirun" in msg


# ------------------------------------------------------------------------------------------------ jobs.txt
def test_shipped_research_queue_content():
    from experiments.queue.gates import command_overrides

    jf = JobFile.read(os.path.join(ROOT, "jobs.txt"))
    assert all(j.mark == PENDING for j in jf.jobs)
    by_id = jf.by_id()
    ov = {j.label: command_overrides(j.command) for j in jf.jobs}
    assert {j.label for j in jf.jobs} == set(ov) and len(ov) == len(jf.jobs)  # run names are unique
    ctl = ov["trm_control"]
    assert (ctl["arch.halt_max_steps"], ctl["arch.halt_exploration_prob"]) == ("16", "0.5")
    assert "pretrain.py" in by_id["trm_control"].command and ctl["data_paths"] == "[data/arc1concept-aug-1000]"
    for enc in ("std", "var", "lpn", "scratch", "etrm2", "std_L3", "std_L4", "hybrid"):
        over, full = by_id[f"{enc}_overfit"], by_id[f"{enc}_full"]
        assert command_overrides(over.command)["max_train_groups"] == "32"
        assert "max_train_groups" not in command_overrides(full.command)
        assert full.requires == [f"{enc}_overfit:train/exact_accuracy>0.90"]
        assert command_overrides(full.command)["data_paths"] == "[data/arc1-etrm-aug-1000]"
    assert ov["var_overfit"]["encoder"] == "variational" and ov["var_overfit"]["encoder_cache"] == "false"
    assert ov["lpn_overfit"]["encoder"] == "lpn" and ov["lpn_overfit"]["encoder_cache"] == "false"
    assert "load_pretrained_decoder" not in ov["scratch_overfit"] and "load_pretrained_decoder" in ov["std_overfit"]
    assert ov["etrm2_full"]["encoder"] == "recurrent"
    assert {ov[f"std_L{n}_full"]["encoder.num_layers"] for n in (3, 4)} == {"3", "4"}
    halting = {
        (o["arch.halt_max_steps"], o["arch.halt_exploration_prob"]) for k, o in ov.items() if k.startswith("halt_")
    }
    assert halting == {(m, e) for m in ("8", "32") for e in ("0.0", "0.3", "0.7")}
    assert ov["std_meanpool_overfit"]["encoder.aggregation"] == "mean"


def test_shipped_jobs_txt_commands_compose_and_validate():
    from experiments.queue.check import check_command

    for script in ("pretrain.py", "pretrain_encoder.py"):
        if not os.path.isfile(os.path.join(ROOT, script)):
            pytest.skip(f"{script} not there yet")
    bad = []
    for job in JobFile.read(os.path.join(ROOT, "jobs.txt")).jobs:
        status, msg = check_command(job.command, ROOT)
        if status != "ok" or "WARNING" in msg:
            bad.append(f"{job.label}: {status}: {msg}")
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------------------------------------ W&B dashboard
def test_dashboard_spec_and_clear_failure_without_api(monkeypatch):
    import subprocess
    import sys

    script = os.path.join(ROOT, "scripts", "create_wandb_dashboard.py")
    r = subprocess.run([sys.executable, script, "--print-spec"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    sections = {s["section"]: {m for p in s["panels"] for m in p["y"]} for s in json.loads(r.stdout)}
    assert list(sections) == ["Success metrics", "Encoder health", "Learning dynamics", "Encoder statistics"]
    assert {"ARC/pass@1", "ARC/pass@2", "train/exact_accuracy", "eval/all.exact_accuracy"} <= sections[
        "Success metrics"
    ]
    assert {"grad/encoder_norm", "train/encoder_cross_sample_var"} <= sections["Encoder health"]
    assert {"train/lm_loss", "train/q_halt_loss", "train/lr", "grad/total_norm", "train/steps"} <= sections[
        "Learning dynamics"
    ]
    assert all(
        m.startswith("train/encoder_output_") or m == "train/encoder_token_std" for m in sections["Encoder statistics"]
    )
    # every metric on the dashboard is one the platform documents (docs/metrics.md), modulo the eval/ prefix
    with open(os.path.join(ROOT, "docs", "metrics.md")) as f:
        documented = f.read()
    undocumented = [
        m
        for ms in sections.values()
        for m in ms
        if m.replace("eval/", "", 1) not in documented and not m.startswith("ARC/pass@")
    ]
    assert not undocumented, undocumented
    # without the API package / key / network: a clear error, status 2, no traceback
    env = dict(os.environ, WANDB_API_KEY="", WANDB_MODE="offline", HOME=os.environ.get("HOME", "/tmp"))
    r = subprocess.run(
        [sys.executable, script, "--entity", "e", "--project", "p"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr
    assert "wandb-workspaces" in r.stderr or "API key" in r.stderr or "refused" in r.stderr
    r = subprocess.run(
        [sys.executable, script],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k not in ("WANDB_ENTITY", "WANDB_PROJECT")},
    )
    assert r.returncode == 2 and "--entity and --project are required" in r.stderr
