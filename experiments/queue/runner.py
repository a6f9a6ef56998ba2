"""The job runner behind ``run_jobs.py``: takes pending lines of a jobs file in order, runs them (N at a
time, one GPU each if a GPU pool is given), records the outcome on the line, retries crashed jobs with
resume, evaluates gates, and leaves the file consistent on Ctrl-C.

Semantics (see docs/experiments.md for the user view):

* **Taking a job**: under the file lock the file is re-read, the first pending line whose gates pass
  (and whose GPU need fits the free GPUs) is marked ``[~]`` with a note holding the runner's pid and host,
  attempt, log file and a unique token ``[t=...]``; the file is written atomically. Two runners can
  therefore never take the same line.
* **Finishing**: exit status 0 -> ``[x]``; otherwise, if retries are left and the attempt was a crash --
  not a deliberate stop, i.e. the job's summary.json was not written by this attempt with ``status:
  finished`` (early stop) or ``stop_reason: non-finite loss`` (see :func:`deliberate_stop`), and not a
  deterministic error (see :func:`deterministic_error`: bad input reported through ``core.errors``, which
  writes its one-line message to the file named by ``TRM_JOB_ERROR_FILE``; exit status 2 = usage error, 126 /
  127 = command not executable / not found) -- the command is rerun with the resume argument (default
  ``resume=true``) appended; else ``[!]`` with the reason.
* **Ctrl-C / SIGTERM**: children (each in its own process group) get SIGINT, then SIGKILL after
  ``kill_grace`` seconds; their lines go back to ``[ ]`` with the note ``interrupted: ...``, and the next
  run starts them with the resume argument. A second Ctrl-C kills at once.
* **Stale lines**: at start, ``[~]`` lines of a dead runner on this host (and whose command is no longer
  running) go back to ``[ ]`` with ``crashed: ...`` (resumed when taken again).

This module is the scheduling (which line runs when, on which GPUs; what its line says; Ctrl-C; the dry run);
one attempt's process -- its environment, log, process group and what its exit means -- is
:mod:`experiments.queue.attempts`.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Optional, TextIO

from .attempts import (
    Attempt,
    deliberate_stop,
    describe_exit,
    deterministic_error,
    fmt_duration,
    fmt_limit,
    job_slug,
    last_output_line,
    now,
    pid_alive,
    resume_command,
)
from .gates import evaluate_gates, summary_path
from .jobfile import DONE, FAILED, PENDING, RUNNING, SKIPPED, Job, JobFileError, JobStore

__all__ = ["Runner", "RunnerConfig", "deliberate_stop", "resume_command"]

_RUN_NOTE_RE = re.compile(r"pid (?P<pid>\d+) on (?P<host>[^,\s]+)")
_CHILD_RE = re.compile(r"child (?P<child>\d+)")


@dataclass
class RunnerConfig:
    jobs_path: str = "jobs.txt"
    parallel: int = 1
    gpus: Optional[list[str]] = None  # GPU pool (CUDA_VISIBLE_DEVICES values); None = do not touch
    logs_dir: str = "logs"
    max_retries: int = 1  # reruns (with resume) of a crashed job
    once: bool = False  # take one job only
    resume_arg: str = "resume=true"
    kill_grace: float = 30.0  # seconds between SIGINT and SIGKILL on Ctrl-C (SIGTERM and SIGKILL on a timeout)
    timeout: Optional[float] = None  # seconds an attempt may run unless its line says timeout=; None = no limit
    poll_interval: float = 0.5
    workdir: Optional[str] = None  # cwd of the commands and base of relative summary paths
    shell: str = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ValueError(f"--parallel must be >= 1, got {self.parallel}")
        if self.max_retries < 0:
            raise ValueError(f"--max-retries must be >= 0, got {self.max_retries}")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"--timeout must be > 0 seconds (or none), got {self.timeout}")
        if self.gpus is not None:
            if not self.gpus or any(not g.strip() for g in self.gpus):
                raise ValueError(f"--gpus must be a comma-separated list of GPU ids, got {self.gpus!r}")
            if len(set(self.gpus)) != len(self.gpus):
                raise ValueError(f"--gpus lists a GPU twice: {','.join(self.gpus)}")


class Runner:
    """Runs a jobs file. ``Runner(RunnerConfig(...)).run()`` returns the process exit status:
    0 all taken jobs succeeded, 1 some failed, 130 interrupted."""

    def __init__(self, config: RunnerConfig, out: TextIO = sys.stdout):
        self.cfg = config
        self.out = out
        self.store = JobStore(config.jobs_path)
        self.workdir = os.path.abspath(config.workdir or os.getcwd())
        self.logs_dir = (
            config.logs_dir if os.path.isabs(config.logs_dir) else os.path.join(self.workdir, config.logs_dir)
        )
        self.host = socket.gethostname()
        self.active: dict[str, Attempt] = {}
        self.free_gpus: list[str] = list(config.gpus or [])
        self.n_taken = 0
        self.n_failed = 0
        self._interrupts = 0

    # ------------------------------------------------------------------ helpers
    def log(self, msg: str) -> None:
        print(f"[run_jobs {time.strftime('%H:%M:%S')}] {msg}", file=self.out, flush=True)

    def _gpus_needed(self, job: Job) -> int:
        if self.cfg.gpus is None:
            return 0
        return int(job.meta.get("gpus", "1"))

    def _resume_arg(self, job: Job) -> str:
        r = job.meta.get("resume", self.cfg.resume_arg)
        return "" if r in ("none", "no", "false", "off") else r

    def _max_attempts(self, job: Job) -> int:
        return 1 + int(job.meta.get("retries", self.cfg.max_retries))

    def _timeout(self, job: Job) -> Optional[float]:
        return job.timeout if "timeout" in job.meta else self.cfg.timeout

    def _running_note(self, a: Attempt, child: Optional[int] = None) -> str:
        parts = [f"running: pid {os.getpid()} on {self.host}"]
        if child is not None:
            parts.append(f"child {child}")
        parts.append(f"since {now()}")
        parts.append(f"attempt {a.attempt}/{a.max_attempts}" + (" (resume)" if a.resume else ""))
        if a.gpus:
            parts.append(f"gpus {'+'.join(a.gpus)}")
        if a.timeout is not None:
            parts.append(f"timeout {fmt_limit(a.timeout)}")
        parts.append(f"log {os.path.relpath(a.log_path, self.workdir)} [t={a.token}]")
        return ", ".join(parts)

    def _set(self, a: Attempt, mark: str, note: str, patience: float = 60.0) -> None:
        """Record a status on the job's line. If someone left the file invalid, wait (up to ``patience``
        seconds) for the fix instead of losing the status."""
        deadline = time.time() + patience
        warned = False
        while True:
            try:
                with self.store.edit() as jf:
                    job = jf.find(a.key, a.token)
                    if job is None:
                        self.log(
                            f"WARNING: the line of {a.label} vanished from {self.cfg.jobs_path} (edited?); "
                            f"its status '{note}' was not recorded"
                        )
                        return
                    job.set_status(mark, note)
                    a.key = job.key
                return
            except JobFileError as e:
                if time.time() >= deadline or self._interrupts > 1:
                    self.log(f"ERROR: {e}; could not record '{note}' for {a.label}")
                    return
                if not warned:
                    self.log(f"WARNING: {e}; waiting for the jobs file to be fixed to record {a.label}")
                    warned = True
                time.sleep(1.0)

    # ------------------------------------------------------------------ stale lines
    def recover_stale(self) -> int:
        """Put ``[~]`` lines of dead runners on this host back to pending (resumed when taken)."""
        n = 0
        with self.store.edit() as jf:
            for job in jf.jobs:
                if job.mark != RUNNING:
                    continue
                m = _RUN_NOTE_RE.search(job.note)
                if not m or m.group("host") != self.host:
                    continue
                pid = int(m.group("pid"))
                if pid == os.getpid() or pid_alive(pid):
                    continue
                c = _CHILD_RE.search(job.note)
                if c and pid_alive(int(c.group("child"))):
                    self.log(
                        f"WARNING: {job.label}: its runner (pid {pid}) died but its command (pid "
                        f"{c.group('child')}) still runs; leaving the line as running"
                    )
                    continue
                job.set_status(PENDING, f"crashed: runner pid {pid} died, found {now()}; resumes when taken")
                self.log(f"{job.label}: runner pid {pid} is gone; line set back to pending (will resume)")
                n += 1
        return n

    # ------------------------------------------------------------------ taking jobs
    def _claim(self) -> tuple[Optional[Attempt], int]:
        """Take the next runnable job. Returns (job or None, number of pending jobs still waiting)."""
        try:
            return self._claim_locked()
        except JobFileError as e:
            self.log(f"WARNING: {e}; no new job is taken until the jobs file is fixed")
            return None, 0

    def _claim_locked(self) -> tuple[Optional[Attempt], int]:
        waiting = 0
        with self.store.edit() as jf:
            by_id = jf.by_id()
            for job in jf.jobs:
                if job.mark != PENDING:
                    continue
                dec = evaluate_gates(job, by_id, self.workdir)
                if dec.action == "skip":
                    job.set_status(SKIPPED, f"skipped: {dec.reason}")
                    self.log(f"skip {job.label}: {dec.reason}")
                    continue
                if dec.action == "wait":
                    waiting += 1
                    continue
                need = self._gpus_needed(job)
                if need > len(self.cfg.gpus or []):
                    job.set_status(
                        FAILED,
                        f"failed: needs {need} GPUs, the runner has {len(self.cfg.gpus or [])} "
                        f"(--gpus {','.join(self.cfg.gpus or [])})",
                    )
                    self.log(f"fail {job.label}: needs {need} GPUs")
                    self.n_failed += 1
                    continue
                if need > len(self.free_gpus):
                    waiting += 1
                    continue
                gpus = self.free_gpus[:need]
                a = Attempt(
                    key=job.key,
                    token=uuid.uuid4().hex[:10],
                    label=job.label,
                    command=job.command,
                    resume_arg=self._resume_arg(job),
                    attempt=1,
                    max_attempts=self._max_attempts(job),
                    resume=job.wants_resume,
                    gpus=gpus,
                    log_path=os.path.join(self.logs_dir, job_slug(job) + ".log"),
                    summary=summary_path(job, self.workdir),
                    job_id=job.id,
                    timeout=self._timeout(job),
                )
                if dec.reason:
                    self.log(f"{job.label}: {dec.reason}")
                job.set_status(RUNNING, self._running_note(a))
                del self.free_gpus[:need]
                return a, waiting
        return None, waiting

    def _start(self, a: Attempt) -> None:
        os.makedirs(self.logs_dir, exist_ok=True)
        cmd = a.spawn(workdir=self.workdir, shell=self.cfg.shell, set_gpus=self.cfg.gpus is not None)
        self.active[a.token] = a
        self._set(a, RUNNING, self._running_note(a, a.proc.pid))
        self.log(
            f"start {a.label} (attempt {a.attempt}/{a.max_attempts}{', resume' if a.resume else ''}"
            f"{', gpus ' + ','.join(a.gpus) if a.gpus else ''}) -> {os.path.relpath(a.log_path, self.workdir)}: {cmd}"
        )

    # ------------------------------------------------------------------ finishing
    def _finish(self, a: Attempt, rc: int) -> None:
        if a.timed_out_at is not None:  # even an exit status 0: it was stopped, it did not finish
            self._finish_timed_out(a, rc)
            return
        dur = fmt_duration(time.time() - a.started)
        logrel = os.path.relpath(a.log_path, self.workdir)
        if rc == 0:
            self.active.pop(a.token)
            self.free_gpus.extend(a.gpus)
            self._set(a, DONE, f"done: {dur}, attempt {a.attempt}, log {logrel}")
            self.log(f"done {a.label} in {dur}")
            return
        summary = a.summary_written()
        why = describe_exit(rc)
        bad_input = None if deliberate_stop(summary) else deterministic_error(rc, a.error_file, a.attempt_started)
        if not deliberate_stop(summary) and bad_input is None and a.attempt < a.max_attempts and not self._interrupts:
            self.log(f"{a.label} crashed ({why}); rerunning with resume (attempt {a.attempt + 1}/{a.max_attempts})")
            a.attempt += 1
            a.resume = True
            self._start(a)
            return
        self.active.pop(a.token)
        self.free_gpus.extend(a.gpus)
        self.n_failed += 1
        parts = [f"failed: {why}"]
        if a.attempt > 1:
            parts[0] += f" after {a.attempt} attempts"
        if summary is not None and summary.get("stop_reason"):
            parts.append(f"stop_reason {' '.join(str(summary['stop_reason']).split())}")
        last = last_output_line(a.log_path)
        if bad_input is not None:
            parts[0] += ", not retried"
            parts.append(bad_input if len(bad_input) <= 300 else bad_input[:297] + "...")
        elif last:
            parts.append(f"last output: {last}")
        parts.append(f"log {logrel}")
        self._set(a, FAILED, "; ".join(parts))
        self.log(f"FAILED {a.label}: {'; '.join(parts)[8:]}")

    def _finish_timed_out(self, a: Attempt, rc: int) -> None:
        """An attempt stopped for running past its timeout: failed (a hanging job would hang again), never
        retried; what is left of its process group is killed."""
        a.kill(signal.SIGKILL, leftovers=True)
        self.active.pop(a.token)
        self.free_gpus.extend(a.gpus)
        self.n_failed += 1
        ran = fmt_limit((a.timed_out_at or time.time()) - a.attempt_started)
        parts = [
            f"failed: timed out after {ran} (timeout {fmt_limit(a.timeout or 0)}), {describe_exit(rc)}, not retried"
        ]
        last = last_output_line(a.log_path)
        if last:
            parts.append(f"last output: {last}")
        parts.append(f"log {os.path.relpath(a.log_path, self.workdir)}")
        self._set(a, FAILED, "; ".join(parts))
        self.log(f"FAILED {a.label}: {'; '.join(parts)[8:]}")

    # ------------------------------------------------------------------ interrupt
    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self._interrupts += 1
        if self._interrupts == 1:
            print(
                f"\n[run_jobs] {signal.Signals(signum).name}: stopping {len(self.active)} job(s) "
                f"(SIGINT, SIGKILL after {self.cfg.kill_grace:g}s; again to kill now)",
                file=self.out,
                flush=True,
            )
        else:
            for a in list(self.active.values()):
                a.kill(signal.SIGKILL)

    def _stop_all(self) -> None:
        for a in self.active.values():
            a.kill(signal.SIGINT)
        deadline = time.time() + self.cfg.kill_grace
        while time.time() < deadline and any(a.proc and a.proc.poll() is None for a in self.active.values()):
            time.sleep(0.05)
        for a in self.active.values():
            a.kill(signal.SIGKILL)  # the leader and anything left in its group
            if a.proc is not None:
                try:
                    a.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        for a in list(self.active.values()):
            self._set(a, PENDING, f"interrupted: {now()} during attempt {a.attempt}; resumes when taken again")
            self.log(f"{a.label}: interrupted, line set back to pending (will resume)")
            self.active.pop(a.token)
            self.free_gpus.extend(a.gpus)

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:

        handlers = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self.store.read()  # validate before touching anything
            self.recover_stale()
            slots = self.cfg.parallel
            while True:
                if self._interrupts:
                    self._stop_all()
                    return 130
                for a in list(self.active.values()):
                    if a.proc is not None and a.proc.poll() is not None:
                        self._finish(a, a.proc.returncode)
                    else:
                        said = a.check_timeout(self.cfg.kill_grace)
                        if said:
                            self.log(said)
                can_take = not (self.cfg.once and self.n_taken >= 1)
                waiting = 0
                while can_take and len(self.active) < slots and not self._interrupts:
                    a, waiting = self._claim()
                    if a is None:
                        break
                    self.n_taken += 1
                    self._start(a)
                    can_take = not (self.cfg.once and self.n_taken >= 1)
                if not self.active:
                    if can_take and waiting:
                        # pending jobs wait for jobs running elsewhere (another runner); they will take them
                        self.log(f"{waiting} pending job(s) wait for jobs of another runner; leaving them to it")
                    break
                time.sleep(self.cfg.poll_interval)
            self.log(f"finished: {self.n_taken} job(s) taken, {self.n_failed} failed")
            return 1 if self.n_failed else 0
        except BaseException:
            if self.active:
                self._stop_all()
            raise
        finally:
            for sig, h in handlers.items():
                signal.signal(sig, h)

    # ------------------------------------------------------------------ dry run
    def dry_run(self) -> int:
        """Print what would run (effective commands, GPUs, gate decisions); change nothing."""
        jf = self.store.read()
        by_id = jf.by_id()
        free = list(self.cfg.gpus or [])
        n_slots = self.cfg.parallel
        counts = {"run": 0, "skip": 0, "wait": 0}
        for job in jf.jobs:
            if job.mark == RUNNING:
                self.out.write(f"  running    {job.label}: {job.note}\n")
            if job.mark != PENDING:
                continue
            dec = evaluate_gates(job, by_id, self.workdir)
            head = f"{job.label} ({self.cfg.jobs_path}:{job.lineno})"
            if dec.action == "skip":
                counts["skip"] += 1
                self.out.write(f"  would skip {head}: {dec.reason}\n")
                continue
            if dec.action == "wait":
                counts["wait"] += 1
                self.out.write(f"  later      {head}: {dec.reason}; then gates: {', '.join(job.requires)}\n")
                continue
            counts["run"] += 1
            cmd = resume_command(job.command, self._resume_arg(job)) if job.wants_resume else job.command
            when = "now  " if n_slots > 0 else "later"
            extra = ""
            need = self._gpus_needed(job)
            if self.cfg.gpus is not None:
                if need > len(self.cfg.gpus):
                    extra = f" [would fail: needs {need} GPUs, pool has {len(self.cfg.gpus)}]"
                elif n_slots > 0 and need <= len(free):
                    extra = f" CUDA_VISIBLE_DEVICES={','.join(free[:need])}"
                    del free[:need]
                else:
                    when = "later"
            n_slots -= 1
            if self._timeout(job) is not None:
                extra += f" [timeout {fmt_limit(self._timeout(job))}]"
            if dec.reason:
                extra += f" [{dec.reason}]"
            self.out.write(f"  would run  {when} {head}{extra}\n      $ {cmd}\n")
        self.out.write(
            f"dry run: {counts['run']} would run, {counts['skip']} would be skipped, "
            f"{counts['wait']} wait for other jobs; {self.cfg.jobs_path} unchanged\n"
        )
        self.out.flush()
        return 0
