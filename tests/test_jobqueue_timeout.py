"""Per-job time limits of the queue (issue 43, item 8): ``timeout=DURATION`` on a jobs.txt line and
``run_jobs.py --timeout`` (the queue default); a job past its limit has its process group killed (SIGTERM, SIGKILL
after --kill-grace) and its line marked failed (timed out), not retried -- a hanging job no longer blocks the queue.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pytest

from experiments.queue.jobfile import DONE, FAILED, JobFile, JobFileError, parse_duration
from experiments.queue.runner import Runner, RunnerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _jobs(d, text: str) -> str:
    p = d / "jobs.txt"
    p.write_text(text)
    return str(p)


def _run(d, **kw) -> tuple[int, str, float]:
    out = io.StringIO()
    kw.setdefault("poll_interval", 0.05)
    kw.setdefault("kill_grace", 2.0)
    t0 = time.time()
    rc = Runner(RunnerConfig(jobs_path=str(d / "jobs.txt"), workdir=str(d), **kw), out=out).run()
    return rc, out.getvalue(), time.time() - t0


def _lines(d):
    return JobFile.read(str(d / "jobs.txt")).jobs


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie not yet reaped by its (dead) parent's reaper counts as dead
        return f.read().split(") ", 1)[1][:1] == "Z"


def test_a_hanging_job_is_killed_with_its_process_group_and_failed_not_retried(tmp_path):
    """A job that sleeps (its shell waiting on a child ``sleep``) with ``timeout=1s retries=2``: after ~1 s both
    processes are gone, the line says failed (timed out), one attempt only, and the queue goes on to the next
    line."""
    _jobs(
        tmp_path,
        "[ ] bash -c 'echo $$ > shell.pid; sleep 60 & echo $! > child.pid; wait'  # id=hang timeout=1s retries=2\n"
        "[ ] echo next  # id=next\n",
    )
    rc, out, took = _run(tmp_path)
    hang, nxt = _lines(tmp_path)
    assert rc == 1 and took < 15, (took, out)
    assert hang.mark == FAILED and nxt.mark == DONE, out
    assert hang.note.startswith("failed: timed out after 1s (timeout 1s), killed by SIGTERM, not retried; "), hang.note
    assert "hang: timed out (timeout 1s); SIGTERM to its process group, SIGKILL after 2s" in out
    for f in ("shell.pid", "child.pid"):
        assert _dead(int((tmp_path / f).read_text())), f  # the whole process group, not only the shell
    log = (tmp_path / "logs" / "hang.log").read_text()
    assert log.count("=== $ ") == 1 and "attempt 1/3" in log  # never retried


def test_a_job_that_ignores_sigterm_is_sigkilled_after_the_grace_and_one_that_exits_0_still_failed(tmp_path):
    _jobs(
        tmp_path,
        "[ ] bash -c \"trap '' TERM; sleep 60\"  # id=stubborn timeout=0.5s\n"
        "[ ] bash -c \"trap 'exit 0' TERM; sleep 60 & wait\"  # id=graceful timeout=0.5s\n",
    )
    rc, out, took = _run(tmp_path, kill_grace=1.0)
    stubborn, graceful = _lines(tmp_path)
    assert rc == 1 and took < 15, (took, out)
    assert stubborn.mark == FAILED and "(timeout 0.5s), killed by SIGKILL, not retried" in stubborn.note
    assert graceful.mark == FAILED and "(timeout 0.5s), exit code 0, not retried" in graceful.note  # stopped, not done


def test_the_queue_default_applies_unless_a_line_sets_its_own(tmp_path):
    """``run_jobs.py --timeout 1s``: a line without the tag gets it; ``timeout=none`` (no limit) and a longer
    ``timeout=`` win over it. ``--dry-run`` shows each line's limit."""
    _jobs(
        tmp_path,
        "[ ] sleep 30  # id=default\n"
        "[ ] sleep 1.6  # id=unlimited timeout=none\n"
        "[ ] sleep 1.6  # id=longer timeout=1m\n",
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [sys.executable, os.path.join(ROOT, "run_jobs.py"), "--timeout", "1s", "--kill-grace", "1"]
    dry = subprocess.run(cmd + ["--dry-run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and "default (jobs.txt:1) [timeout 1s]" in dry.stdout, dry.stdout
    assert "unlimited (jobs.txt:2)\n" in dry.stdout and "longer (jobs.txt:3) [timeout 1m00s]" in dry.stdout
    t0 = time.time()
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and time.time() - t0 < 20, r.stdout + r.stderr
    default, unlimited, longer = _lines(tmp_path)
    assert default.mark == FAILED and "timed out after 1s (timeout 1s)" in default.note
    assert unlimited.mark == DONE and longer.mark == DONE, r.stdout


def test_durations_and_bad_timeouts_are_refused_in_one_line(tmp_path):
    assert [parse_duration(t) for t in ("90", "90s", "30m", "2h", "1d", "1h30m", "1.5h", "none", "off")] == [
        90,
        90,
        1800,
        7200,
        86400,
        5400,
        5400,
        None,
        None,
    ]
    for bad in ("abc", "1x", "1h30", "-5", "0", "0s"):
        with pytest.raises(JobFileError, match="job tag 'timeout'"):
            JobFile.parse(f"[ ] echo a  # timeout={bad}\n")
    with pytest.raises(JobFileError, match=r"jobs.txt:1: unknown job tag 'timout=1h' \(did you mean 'timeout='\?\)"):
        JobFile.parse("[ ] echo a  # timout=1h\n")
    _jobs(tmp_path, "[ ] echo a\n")
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "run_jobs.py"), "--timeout", "soon"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.strip() == (
        "run_jobs.py: error: --timeout: bad duration 'soon'; expected e.g. 90s, 30m, 2h, 1h30m, 1d (a bare number: "
        "seconds) or none"
    )
    assert _lines(tmp_path)[0].mark == " "  # nothing ran
