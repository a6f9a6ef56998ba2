"""The runner on jobs files of tiny real commands (CPU, subprocesses of a helper script)."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from experiments.queue.jobfile import DONE, FAILED, PENDING, SKIPPED, JobFile
from experiments.queue.runner import Runner, RunnerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

HELPER = r"""
import json, os, signal, sys, time
mode, args = sys.argv[1], sys.argv[2:]
resume = "resume=true" in args
args = [a for a in args if a != "resume=true"]

def summary(d, **m):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump({"best": m, "final": m, "stop_reason": "completed", "steps": 10}, f)

if mode == "ok":            # ok DIR ACC: a finished run with its summary
    summary(args[0], **{"train/exact_accuracy": float(args[1])})
    print("trained", args[0])
elif mode == "fail":        # a run that always fails
    print("ValueError: bad data path data/nowhere", flush=True)
    sys.exit(3)
elif mode == "early":       # a deliberate stop (training.summary format): must not be retried
    os.makedirs(args[0], exist_ok=True)
    with open(os.path.join(args[0], "summary.json"), "w") as f:
        json.dump({"status": "finished", "stop_reason": "early_stop: encoder collapsed", "exit_status": 3,
                   "final": {}, "best": {}}, f)
    with open(os.path.join(args[0], "attempts"), "a") as f:
        f.write("x")
    sys.exit(3)
elif mode == "crash":       # crash DIR: first attempt checkpoints step 5 then dies; resume continues from it
    d = args[0]
    os.makedirs(d, exist_ok=True)
    ck = os.path.join(d, "ckpt.json")
    with open(os.path.join(d, "argv.txt"), "a") as f:
        f.write(" ".join(sys.argv[1:]) + "\n")
    if not resume:
        with open(ck, "w") as f:
            json.dump({"step": 5}, f)
        with open(os.path.join(d, "summary.json"), "w") as f:  # as training.summary writes at a checkpoint
            json.dump({"status": "running", "stop_reason": None, "steps": 5, "final": {}, "best": {}}, f)
        print("step 5 checkpointed; now crashing", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    with open(ck) as f:
        start = json.load(f)["step"]
    summary(d, **{"train/exact_accuracy": 1.0, "start_step": float(start)})
elif mode == "badinput":    # badinput DIR: bad input reported through core.errors (deterministic)
    os.makedirs(args[0], exist_ok=True)
    with open(os.path.join(args[0], "attempts"), "a") as f:
        f.write("x")
    from core.errors import fail
    fail("data_paths=[data/nowhere]: no such dataset directory")
elif mode == "exit1":       # exit1 DIR: exit status 1 without a bad-input record (e.g. a traceback): a crash
    os.makedirs(args[0], exist_ok=True)
    with open(os.path.join(args[0], "attempts"), "a") as f:
        f.write("x")
    sys.exit(1)
elif mode == "record":      # record FILE NAME: append NAME, sleep a bit (concurrency)
    with open(args[0], "a") as f:
        f.write(args[1] + "\n")
    time.sleep(0.15)
elif mode == "gpu":         # gpu FILE: record visible GPUs and the time window
    t0 = time.time()
    time.sleep(0.4)
    with open(args[0], "w") as f:
        json.dump({"gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "t0": t0, "t1": time.time()}, f)
elif mode == "sleep":       # sleep DIR: long job that ignores SIGINT (forces the SIGKILL path); resume = done
    d = args[0]
    os.makedirs(d, exist_ok=True)
    if resume:
        open(os.path.join(d, "resumed"), "w").close()
        sys.exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(os.path.join(d, "pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)
elif mode == "break":       # break JOBS: a human leaves the file invalid; fixed 1.5 s after this job ended
    import subprocess
    p = args[0]
    good = open(p).read()
    with open(p + ".bad", "w") as f:
        f.write(good + "oops, not a job line\n")
    os.replace(p + ".bad", p)
    fix = ("import os, sys, time; time.sleep(1.5); p = sys.argv[1]; t = open(p).read(); "
           "open(p + '.fix', 'w').write(t.replace('oops, not a job line\\n', '')); os.replace(p + '.fix', p)")
    subprocess.Popen([sys.executable, "-c", fix, p], start_new_session=True)
elif mode == "edit":        # edit JOBS: a human inserts lines above (incl. a copy of this very command)
    p = args[0]
    with open(p) as f:
        text = f.read()
    lines = text.splitlines(True)
    lines.insert(0, "# inserted while running\n")
    lines.insert(1, "[-] " + os.environ["SELF_CMD"] + "  # skipped: a copy added by hand\n")
    tmp = p + ".human"
    with open(tmp, "w") as f:
        f.write("".join(lines))
    os.replace(tmp, p)
"""


@pytest.fixture()
def qdir(tmp_path):
    (tmp_path / "helper.py").write_text(HELPER)
    return tmp_path


def write_jobs(d, text):
    p = d / "jobs.txt"
    p.write_text(text.replace("HELPER", f"{PY} helper.py"))
    return p


def run(d, **kw):
    out = io.StringIO()
    kw.setdefault("poll_interval", 0.05)
    kw.setdefault("kill_grace", 2.0)
    cfg = RunnerConfig(jobs_path=str(d / "jobs.txt"), workdir=str(d), **kw)
    rc = Runner(cfg, out=out).run()
    return rc, out.getvalue()


def jobs_of(d):
    return JobFile.read(str(d / "jobs.txt")).jobs


def test_success_failure_gates_and_logs(qdir):
    write_jobs(
        qdir,
        (
            "# Phase 1: overfit 32 groups\n"
            "[ ] HELPER ok ck/good 0.95  # id=good summary=ck/good\n"
            "[ ] HELPER ok ck/weak 0.42  # id=weak summary=ck/weak\n"
            "[ ] HELPER fail  # id=bad retries=0\n"
            "\n# Phase 2: full data, gated\n"
            "[ ] HELPER ok ck/full_good 0.1  # requires=good:train/exact_accuracy>0.90\n"
            "[ ] HELPER ok ck/full_weak 0.1  # requires: weak train/exact_accuracy>0.90\n"
            "[ ] HELPER ok ck/after_bad 0.1  # requires=bad\n"
            "[ ] HELPER ok ck/weak_low 0.1  # requires=weak:train/exact_accuracy>0.40\n"
        ),
    )
    rc, out = run(qdir)
    assert rc == 1  # one job failed
    good, weak, bad, full_good, full_weak, after_bad, weak_low = jobs_of(qdir)
    assert [j.mark for j in (good, weak, full_good, weak_low)] == [DONE] * 4
    assert bad.mark == FAILED
    assert (
        "exit code 3" in bad.note
        and "ValueError: bad data path data/nowhere" in bad.note
        and "logs/bad.log" in bad.note
    )
    assert full_weak.mark == SKIPPED
    assert "train/exact_accuracy=0.42" in full_weak.note and "> 0.9" in full_weak.note
    assert after_bad.mark == SKIPPED and "bad, which failed" in after_bad.note
    assert (qdir / "ck/full_good/summary.json").exists() and not (qdir / "ck/full_weak").exists()
    # one log per job, with the command's output
    logs = sorted(os.listdir(qdir / "logs"))
    assert len(logs) == 5 and "good.log" in logs
    assert "trained ck/good" in (qdir / "logs/good.log").read_text()
    # comments / headers untouched
    text = (qdir / "jobs.txt").read_text()
    assert text.startswith("# Phase 1: overfit 32 groups\n") and "\n\n# Phase 2: full data, gated\n" in text


def test_crash_is_rerun_with_resume_and_continues(qdir):
    write_jobs(qdir, "[ ] HELPER crash ck/c  # id=c summary=ck/c\n")
    rc, out = run(qdir, max_retries=1)
    assert rc == 0, out
    (job,) = jobs_of(qdir)
    assert job.mark == DONE and "attempt 2" in job.note
    argv = (qdir / "ck/c/argv.txt").read_text().splitlines()
    assert argv == ["crash ck/c", "crash ck/c resume=true"]
    s = json.loads((qdir / "ck/c/summary.json").read_text())
    assert s["best"]["start_step"] == 5.0  # continued from the checkpoint of the crashed attempt
    log = (qdir / "logs/c.log").read_text()
    assert "attempt 1/2" in log and "attempt 2/2 (resume)" in log and "now crashing" in log


def test_crash_without_retries_fails_with_signal(qdir):
    write_jobs(qdir, "[ ] HELPER crash ck/c  # id=c\n")
    rc, _ = run(qdir, max_retries=0)
    (job,) = jobs_of(qdir)
    assert rc == 1 and job.mark == FAILED and "killed by SIGKILL" in job.note


def test_deliberate_stop_with_summary_is_not_retried(qdir):
    write_jobs(qdir, "[ ] HELPER early ck/e  # id=e summary=ck/e retries=3\n")
    rc, _ = run(qdir)
    (job,) = jobs_of(qdir)
    assert rc == 1 and job.mark == FAILED
    assert "stop_reason early_stop: encoder collapsed" in job.note
    assert (qdir / "ck/e/attempts").read_text() == "x"  # ran once


def test_deterministic_errors_are_not_retried_crashes_are(qdir, monkeypatch):
    """Bad input (core.errors records its one line), 'command not found' and a usage error fail at once
    with the reason on the line; an exit 1 without such a record (a traceback) is still a crash and retried."""
    monkeypatch.setenv("PYTHONPATH", ROOT)
    write_jobs(
        qdir,
        (
            "[ ] HELPER badinput ck/b  # id=b retries=3\n"
            "[ ] no_such_command_for_the_queue_test  # id=nf retries=3\n"
            f"[ ] {PY} -c 'import sys; sys.exit(2)'  # id=usage retries=3\n"
            "[ ] HELPER exit1 ck/c  # id=c retries=1\n"
        ),
    )
    rc, out = run(qdir)
    b, nf, usage, c = jobs_of(qdir)
    assert rc == 1 and [j.mark for j in (b, nf, usage, c)] == [FAILED] * 4, out
    assert (qdir / "ck/b/attempts").read_text() == "x"  # ran once despite retries=3
    assert "exit code 1, not retried; bad input: data_paths=[data/nowhere]: no such dataset directory" in b.note
    assert "not retried; command not found (exit code 127)" in nf.note
    assert "not retried; usage error (exit code 2)" in usage.note
    assert (qdir / "ck/c/attempts").read_text() == "xx" and "after 2 attempts" in c.note  # retried once
    assert out.count("rerunning with resume") == 1


def test_real_pretrain_config_error_is_failed_not_retried(tmp_path, monkeypatch):
    """A real pretrain.py line with a misspelt key: one attempt, the key in the failure note."""
    monkeypatch.setenv("PYTHONPATH", ROOT)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    write_jobs(
        tmp_path,
        f"[ ] {PY} {os.path.join(ROOT, 'pretrain.py')} data_paths=[nowhere] +lrr=1e-3 "
        "hydra.run.dir=h  # id=typo retries=2\n",
    )
    rc, out = run(tmp_path)
    (job,) = jobs_of(tmp_path)
    assert rc == 1 and job.mark == FAILED
    log = (tmp_path / "logs" / "typo.log").read_text()
    assert log.count("=== $ ") == 1 and "attempt 1/3" in log and "Traceback" not in log  # one attempt of 3
    assert "not retried; bad input:" in job.note and "'lrr'" in job.note, job.note
    assert "rerunning" not in out


def test_unknown_tag_is_rejected_by_runner_and_check(qdir):
    """A misspelt tag used to turn its segment into a free comment, silently dropping the gate."""
    text = write_jobs(qdir, "[ ] echo a  # id=a\n[ ] echo b  # requirs=a\n").read_text()
    for extra in ([], ["--check"], ["--dry-run"]):
        r = subprocess.run(
            [PY, os.path.join(ROOT, "run_jobs.py"), *extra],
            cwd=qdir,
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )
        assert r.returncode == 2, (extra, r.stderr)
        assert "jobs.txt:2: unknown job tag 'requirs=a' (did you mean 'requires='?)" in r.stderr
        assert "known tags: id, requires" in r.stderr and "Traceback" not in r.stderr
    assert (qdir / "jobs.txt").read_text() == text and not (qdir / "logs").exists()  # nothing ran


def test_concurrent_runners_never_take_the_same_line(qdir):
    # three runner processes on one file (without the file lock this fails nearly every time: checked)
    n = 18
    write_jobs(qdir, "".join(f"[ ] HELPER record out.txt j{i}\n" for i in range(n)))
    cmd = [PY, os.path.join(ROOT, "run_jobs.py"), "jobs.txt"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [
        subprocess.Popen(cmd, cwd=qdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    recorded = (qdir / "out.txt").read_text().split()
    assert sorted(recorded) == sorted(f"j{i}" for i in range(n))  # each exactly once
    assert all(j.mark == DONE for j in jobs_of(qdir))
    taken = [o.count(" start ") for o in outs]
    assert sum(taken) == n and sorted(taken)[1] >= 1, outs  # at least two runners worked


def test_job_env_has_gpus_and_no_inherited_torch_distributed_vars(qdir, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    write_jobs(qdir, f"[ ] {PY} -c \"import os, json; json.dump(dict(os.environ), open('env.json', 'w'))\"  # id=e\n")
    rc, out = run(qdir, gpus=["5"])
    assert rc == 0, out
    env = json.loads((qdir / "env.json").read_text())
    assert "RANK" not in env and "WORLD_SIZE" not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env["TRM_JOB_NAME"] == "e" and env["TRM_JOB_RESUME"] == "0"
    assert env["TRM_JOB_ID"] == "e"  # the line's id= (a run's default W&B group)
    assert env["PET_MASTER_PORT"] == env["MASTER_PORT"] and int(env["MASTER_PORT"]) > 0


def test_parallel_gpu_assignment(qdir):
    write_jobs(
        qdir,
        "".join(f"[ ] HELPER gpu g{i}.json\n" for i in range(4))
        + "[ ] HELPER gpu big.json  # gpus=2\n[ ] HELPER gpu huge.json  # gpus=3\n",
    )
    rc, out = run(qdir, parallel=2, gpus=["0", "1"])
    jobs = jobs_of(qdir)
    assert rc == 1 and jobs[-1].mark == FAILED and "needs 3 GPUs" in jobs[-1].note
    recs = [json.loads((qdir / f"g{i}.json").read_text()) for i in range(4)]
    assert all(r["gpus"] in ("0", "1") for r in recs)
    overlapping = [(a, b) for i, a in enumerate(recs) for b in recs[i + 1 :] if a["t0"] < b["t1"] and b["t0"] < a["t1"]]
    assert overlapping, "with --parallel 2 some jobs must run at the same time"
    assert all(a["gpus"] != b["gpus"] for a, b in overlapping)
    assert json.loads((qdir / "big.json").read_text())["gpus"] in ("0,1", "1,0")


def test_dry_run_changes_nothing(qdir):
    os.makedirs(qdir / "ck/weak")
    (qdir / "ck/weak/summary.json").write_text(json.dumps({"best": {"train/exact_accuracy": 0.5}}))
    p = write_jobs(
        qdir,
        (
            "# header\n"
            "[x] HELPER ok ck/weak 0.5  # id=weak summary=ck/weak\n"
            "[ ] HELPER ok ck/a 1  # id=a\n"
            "[ ] HELPER ok ck/b 1  # requires=weak:train/exact_accuracy>0.9\n"
            "[ ] HELPER ok ck/c 1  # requires=a\n"
            "[ ] HELPER ok ck/d 1  # interrupted: earlier; resumes when taken again\n"
        ),
    )
    before = p.read_bytes()
    listing = sorted(os.listdir(qdir))
    out = io.StringIO()
    rc = Runner(RunnerConfig(jobs_path=str(p), workdir=str(qdir), gpus=["3"]), out=out).dry_run()
    text = out.getvalue()
    assert rc == 0
    assert p.read_bytes() == before and sorted(os.listdir(qdir)) == listing  # no lock, no logs, no edits
    assert "would skip line 4" in text and "train/exact_accuracy=0.5" in text
    assert "CUDA_VISIBLE_DEVICES=3" in text and "waits for a (pending)" in text
    assert "ck/d 1 resume=true" in text  # the interrupted job would resume
    # the CLI too
    r = subprocess.run(
        [PY, os.path.join(ROOT, "run_jobs.py"), "--dry-run"],
        cwd=qdir,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert r.returncode == 0 and "would run" in r.stdout and p.read_bytes() == before


def test_ctrl_c_kills_children_and_leaves_file_consistent(qdir):
    p = write_jobs(qdir, "# q\n[ ] HELPER sleep ck/s  # id=s\n[ ] HELPER ok ck/next 1\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen(
        [PY, os.path.join(ROOT, "run_jobs.py"), "--kill-grace", "1"],
        cwd=qdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pidfile = qdir / "ck/s/pid"
    deadline = time.time() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.time() < deadline and proc.poll() is None, "job did not start"
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert jobs_of(qdir)[0].mark == "~"
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 130, out
    time.sleep(0.1)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the child (which ignores SIGINT) was killed
    s, nxt = jobs_of(qdir)
    assert s.mark == PENDING and s.note.startswith("interrupted") and s.wants_resume
    assert nxt.mark == PENDING and nxt.note == ""  # never started
    assert p.read_text().startswith("# q\n")
    # the next run resumes the interrupted job and runs the rest
    rc, out = run(qdir)
    assert rc == 0, out
    assert (qdir / "ck/s/resumed").exists()
    assert [j.mark for j in jobs_of(qdir)] == [DONE, DONE]


def test_stale_running_line_of_dead_runner_is_resumed(qdir):
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    write_jobs(
        qdir,
        f"[~] HELPER crash ck/r  # id=r  # running: pid {dead.pid} on {host}, since x, "
        f"attempt 1/2, log logs/r.log [t=deadbeef00]\n",
    )
    os.makedirs(qdir / "ck/r")
    (qdir / "ck/r/ckpt.json").write_text(json.dumps({"step": 7}))
    rc, out = run(qdir)
    assert rc == 0, out
    (job,) = jobs_of(qdir)
    assert job.mark == DONE
    assert (qdir / "ck/r/argv.txt").read_text().splitlines() == ["crash ck/r resume=true"]


def test_line_identity_survives_concurrent_edits(qdir):
    cmd = f"{PY} helper.py edit jobs.txt"
    write_jobs(qdir, "[ ] HELPER ok ck/a 1\n[ ] HELPER edit jobs.txt  # id=e\n[ ] HELPER ok ck/b 1\n")
    os.environ["SELF_CMD"] = cmd
    try:
        rc, out = run(qdir)
    finally:
        del os.environ["SELF_CMD"]
    assert rc == 0, out
    lines = (qdir / "jobs.txt").read_text().splitlines()
    assert lines[0] == "# inserted while running"
    assert lines[1].startswith("[-] " + cmd) and lines[1].endswith("# skipped: a copy added by hand")  # untouched
    assert lines[3].startswith("[x] " + cmd + "  # id=e  # done:")
    assert lines[2].startswith("[x] ") and lines[4].startswith("[x] ")


def test_status_waits_for_a_broken_file_to_be_fixed(qdir):
    write_jobs(qdir, "[ ] HELPER break jobs.txt  # id=b\n[ ] HELPER ok ck/after 1\n")
    rc, out = run(qdir)
    assert rc == 0, out
    assert "waiting for the jobs file to be fixed" in out
    assert [j.mark for j in jobs_of(qdir)] == [DONE, DONE]
    assert "oops" not in (qdir / "jobs.txt").read_text()


def test_once_takes_a_single_job(qdir):
    write_jobs(qdir, "[ ] HELPER ok ck/a 1\n[ ] HELPER ok ck/b 1\n")
    rc, _ = run(qdir, once=True)
    assert rc == 0 and [j.mark for j in jobs_of(qdir)] == [DONE, PENDING]


def test_cli_errors_are_clear(qdir):
    write_jobs(qdir, "[ ] echo a  # requires=nobody\n")
    r = subprocess.run(
        [PY, os.path.join(ROOT, "run_jobs.py")],
        cwd=qdir,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert r.returncode == 2 and "jobs.txt:1: requires unknown job id 'nobody'" in r.stderr
    r = subprocess.run(
        [PY, os.path.join(ROOT, "run_jobs.py"), "missing.txt"],
        cwd=qdir,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert r.returncode == 2 and "jobs file not found: missing.txt" in r.stderr


@pytest.mark.slow
def test_real_pretrain_jobs_with_gates(tmp_path):
    """End to end with the real pretrain.py: a tiny overfit run, then one gate that passes and one that fails,
    both decided from the run's summary.json."""
    if not os.path.isfile(os.path.join(ROOT, "pretrain.py")):
        pytest.skip("pretrain.py not there yet")
    from tests.toy_data import write_toy_dataset

    write_toy_dataset(str(tmp_path / "toy"), seq_len=8)
    tiny = (
        "arch=trm_tiny arch.hidden_size=32 arch.num_heads=2 arch.puzzle_emb_ndim=32 arch.puzzle_emb_len=1 "
        "arch.H_cycles=1 arch.L_cycles=1 arch.L_layers=1 arch.halt_max_steps=2 arch.halt_exploration_prob=0 "
        "global_batch_size=16 evaluators=[] lr=1e-3 lr_warmup_steps=10 weight_decay=0.0 "
        "puzzle_emb_weight_decay=0.0 eval_interval=null progress=false wandb.mode=disabled "
        "data_paths=[toy] +project_name=q"
    )
    pre = f"{PY} {os.path.join(ROOT, 'pretrain.py')} {tiny}"
    write_jobs(
        tmp_path,
        (
            f"[ ] {pre} epochs=150 +run_name=overfit  # id=overfit\n"
            f"[ ] {pre} epochs=1 eval_at_end=false +run_name=full  # requires=overfit:train/exact_accuracy>0.90\n"
            f"[ ] {pre} epochs=1 eval_at_end=false +run_name=never  # requires=overfit:train/lm_loss<0.0\n"
        ),
    )
    env_before = dict(os.environ)
    os.environ.update(OMP_NUM_THREADS="1", WANDB_MODE="disabled", PYTHONPATH=ROOT)
    try:
        rc, out = run(tmp_path)
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    assert rc == 0, out + "".join(open(tmp_path / "logs" / f).read()[-2000:] for f in os.listdir(tmp_path / "logs"))
    overfit, full, never = jobs_of(tmp_path)
    s = json.loads((tmp_path / "checkpoints/q/overfit/summary.json").read_text())
    assert overfit.mark == DONE and s["status"] == "finished" and s["best"]["train/exact_accuracy"] > 0.9
    assert full.mark == DONE and (tmp_path / "checkpoints/q/full/summary.json").exists()
    assert never.mark == SKIPPED and "train/lm_loss=" in never.note and "needs < 0" in never.note
    assert not (tmp_path / "checkpoints/q/never").exists()
