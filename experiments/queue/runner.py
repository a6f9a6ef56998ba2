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
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional, TextIO

from core.errors import ERROR_FILE_ENV  # where an entry point records its one-line bad-input message

from .gates import command_overrides, evaluate_gates, read_summary, summary_path
from .jobfile import DONE, FAILED, PENDING, RUNNING, SKIPPED, Job, JobFileError, JobStore

_RUN_NOTE_RE = re.compile(r"pid (?P<pid>\d+) on (?P<host>[^,\s]+)")
_CHILD_RE = re.compile(r"child (?P<child>\d+)")
_SAFE_RE = re.compile(r"[^A-Za-z0-9_.\-]+")
# torch.distributed variables of the runner's own environment are not passed on (a job starts its own group)
_DIST_VARS = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                        "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RUN_ID"})


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fmt_duration(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie counts as dead
    try:
        with open(f"/proc/{pid}/stat", "r") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def _last_output_line(path: str, limit: int = 160) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    for line in reversed(tail.splitlines()):
        line = line.strip()
        if line and not line.startswith("=== "):
            line = " ".join(line.replace("#", "").split())
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


def job_slug(job: Job) -> str:
    """File-name-safe, stable name of a job for its log file."""
    digest = hashlib.sha1(f"{job.norm_command}\0{job.occurrence}".encode()).hexdigest()[:8]
    if job.id:
        return _SAFE_RE.sub("_", job.id)
    base = command_overrides(job.command).get("run_name") or "job"
    return f"{_SAFE_RE.sub('_', base)[:60]}-{digest}"


def resume_command(command: str, resume_arg: str) -> str:
    """``command`` with ``resume_arg`` appended, unless it already sets that key (``resume=...``)."""
    if not resume_arg:
        return command
    key = resume_arg.split("=", 1)[0].lstrip("+") if "=" in resume_arg else resume_arg
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for w in words:
        if w == resume_arg or ("=" in w and w.split("=", 1)[0].lstrip("+") == key):
            return command
    return f"{command} {resume_arg}"


def deliberate_stop(summary: Optional[dict]) -> bool:
    """True when a summary.json written by the failed attempt says the run stopped on purpose (early stop,
    ``status: finished``) or diverged (``non-finite loss``: resuming would replay the same divergence).
    A crash (no summary, ``status: running``, an exception, ``interrupted``) is retried with resume."""
    if not summary:
        return False
    reason = str(summary.get("stop_reason") or "")
    return summary.get("status") == "finished" or reason.startswith("early_stop") or reason == "non-finite loss"


#: exit statuses that fail the same way on every attempt: usage error, command not executable, not found
DETERMINISTIC_EXITS = {2: "usage error", 126: "command not executable", 127: "command not found"}


def deterministic_error(rc: int, error_file: Optional[str], since: float) -> Optional[str]:
    """Why a failed attempt would fail again if retried (None: a crash, worth a retry with resume): the one-line
    message an entry point wrote to ``error_file`` during this attempt (bad input: a config key, a path, data
    that does not fit), or an exit status of :data:`DETERMINISTIC_EXITS`."""
    if rc > 0 and error_file:
        try:
            if os.path.getmtime(error_file) + 1.0 >= since:
                with open(error_file, "r", encoding="utf-8", errors="replace") as f:
                    msg = " ".join(f.read().split())
                return f"bad input: {msg}" if msg else "bad input"
        except OSError:
            pass
    if rc in DETERMINISTIC_EXITS:
        return f"{DETERMINISTIC_EXITS[rc]} (exit code {rc})"
    return None


@dataclass
class RunnerConfig:
    jobs_path: str = "jobs.txt"
    parallel: int = 1
    gpus: Optional[list[str]] = None  # GPU pool (CUDA_VISIBLE_DEVICES values); None = do not touch
    logs_dir: str = "logs"
    max_retries: int = 1  # reruns (with resume) of a crashed job
    once: bool = False  # take one job only
    resume_arg: str = "resume=true"
    kill_grace: float = 30.0  # seconds between SIGINT and SIGKILL on Ctrl-C
    poll_interval: float = 0.5
    workdir: Optional[str] = None  # cwd of the commands and base of relative summary paths
    shell: str = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ValueError(f"--parallel must be >= 1, got {self.parallel}")
        if self.max_retries < 0:
            raise ValueError(f"--max-retries must be >= 0, got {self.max_retries}")
        if self.gpus is not None:
            if not self.gpus or any(not g.strip() for g in self.gpus):
                raise ValueError(f"--gpus must be a comma-separated list of GPU ids, got {self.gpus!r}")
            if len(set(self.gpus)) != len(self.gpus):
                raise ValueError(f"--gpus lists a GPU twice: {','.join(self.gpus)}")


@dataclass
class _Active:
    key: tuple[str, int]
    token: str
    label: str
    command: str
    resume_arg: str
    attempt: int
    max_attempts: int
    resume: bool
    gpus: list[str]
    log_path: str
    summary: Optional[str]
    job_id: Optional[str] = None  # the line's id=, exported as TRM_JOB_ID (the run's default W&B group)
    started: float = field(default_factory=time.time)
    attempt_started: float = field(default_factory=time.time)
    proc: Optional[subprocess.Popen] = None

    @property
    def error_file(self) -> str:
        return os.path.splitext(self.log_path)[0] + ".error"

    @property
    def effective_command(self) -> str:
        return resume_command(self.command, self.resume_arg) if self.resume else self.command


class Runner:
    """Runs a jobs file. ``Runner(RunnerConfig(...)).run()`` returns the process exit status:
    0 all taken jobs succeeded, 1 some failed, 130 interrupted."""

    def __init__(self, config: RunnerConfig, out: TextIO = sys.stdout):
        self.cfg = config
        self.out = out
        self.store = JobStore(config.jobs_path)
        self.workdir = os.path.abspath(config.workdir or os.getcwd())
        self.logs_dir = config.logs_dir if os.path.isabs(config.logs_dir) else os.path.join(self.workdir, config.logs_dir)
        self.host = socket.gethostname()
        self.active: dict[str, _Active] = {}
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

    def _running_note(self, a: _Active, child: Optional[int] = None) -> str:
        parts = [f"running: pid {os.getpid()} on {self.host}"]
        if child is not None:
            parts.append(f"child {child}")
        parts.append(f"since {_now()}")
        parts.append(f"attempt {a.attempt}/{a.max_attempts}" + (" (resume)" if a.resume else ""))
        if a.gpus:
            parts.append(f"gpus {'+'.join(a.gpus)}")
        parts.append(f"log {os.path.relpath(a.log_path, self.workdir)} [t={a.token}]")
        return ", ".join(parts)

    def _set(self, a: _Active, mark: str, note: str, patience: float = 60.0) -> None:
        """Record a status on the job's line. If someone left the file invalid, wait (up to ``patience``
        seconds) for the fix instead of losing the status."""
        deadline = time.time() + patience
        warned = False
        while True:
            try:
                with self.store.edit() as jf:
                    job = jf.find(a.key, a.token)
                    if job is None:
                        self.log(f"WARNING: the line of {a.label} vanished from {self.cfg.jobs_path} (edited?); "
                                 f"its status '{note}' was not recorded")
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
                if pid == os.getpid() or _pid_alive(pid):
                    continue
                c = _CHILD_RE.search(job.note)
                if c and _pid_alive(int(c.group("child"))):
                    self.log(f"WARNING: {job.label}: its runner (pid {pid}) died but its command (pid "
                             f"{c.group('child')}) still runs; leaving the line as running")
                    continue
                job.set_status(PENDING, f"crashed: runner pid {pid} died, found {_now()}; resumes when taken")
                self.log(f"{job.label}: runner pid {pid} is gone; line set back to pending (will resume)")
                n += 1
        return n

    # ------------------------------------------------------------------ taking jobs
    def _claim(self) -> tuple[Optional[_Active], int]:
        """Take the next runnable job. Returns (job or None, number of pending jobs still waiting)."""
        try:
            return self._claim_locked()
        except JobFileError as e:
            self.log(f"WARNING: {e}; no new job is taken until the jobs file is fixed")
            return None, 0

    def _claim_locked(self) -> tuple[Optional[_Active], int]:
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
                    job.set_status(FAILED, f"failed: needs {need} GPUs, the runner has {len(self.cfg.gpus or [])} "
                                           f"(--gpus {','.join(self.cfg.gpus or [])})")
                    self.log(f"fail {job.label}: needs {need} GPUs")
                    self.n_failed += 1
                    continue
                if need > len(self.free_gpus):
                    waiting += 1
                    continue
                gpus = self.free_gpus[:need]
                a = _Active(
                    key=job.key, token=uuid.uuid4().hex[:10], label=job.label, command=job.command,
                    resume_arg=self._resume_arg(job), attempt=1, max_attempts=self._max_attempts(job),
                    resume=job.wants_resume, gpus=gpus,
                    log_path=os.path.join(self.logs_dir, job_slug(job) + ".log"),
                    summary=summary_path(job, self.workdir), job_id=job.id,
                )
                if dec.reason:
                    self.log(f"{job.label}: {dec.reason}")
                job.set_status(RUNNING, self._running_note(a))
                del self.free_gpus[:need]
                return a, waiting
        return None, waiting

    def _start(self, a: _Active) -> None:
        os.makedirs(self.logs_dir, exist_ok=True)
        a.attempt_started = time.time()
        cmd = a.effective_command
        env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}  # a job is its own process group
        env.update(
            PYTHONUNBUFFERED="1", TRM_JOB_NAME=a.label, TRM_JOB_ATTEMPT=str(a.attempt),
            TRM_JOB_RESUME="1" if a.resume else "0", TRM_JOB_LOG=a.log_path,
        )
        env.pop("TRM_JOB_ID", None)
        if a.job_id:
            env["TRM_JOB_ID"] = a.job_id
        env[ERROR_FILE_ENV] = a.error_file  # bad input is recorded here: failed, not retried
        try:
            os.unlink(a.error_file)
        except FileNotFoundError:
            pass
        if self.cfg.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(a.gpus)
        port = str(_free_port())
        env["MASTER_PORT"] = port  # single-process DDP inits
        env["PET_MASTER_PORT"] = port  # torchrun's --master-port default: parallel torchruns do not clash
        with open(a.log_path, "a", encoding="utf-8") as fh:
            fh.write(f"=== {_now()} {a.label} attempt {a.attempt}/{a.max_attempts}"
                     f"{' (resume)' if a.resume else ''}"
                     f"{' CUDA_VISIBLE_DEVICES=' + ','.join(a.gpus) if self.cfg.gpus is not None else ''}\n"
                     f"=== $ {cmd}\n")
            fh.flush()
            a.proc = subprocess.Popen(
                [self.cfg.shell, "-c", cmd], cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self.active[a.token] = a
        self._set(a, RUNNING, self._running_note(a, a.proc.pid))
        self.log(f"start {a.label} (attempt {a.attempt}/{a.max_attempts}{', resume' if a.resume else ''}"
                 f"{', gpus ' + ','.join(a.gpus) if a.gpus else ''}) -> {os.path.relpath(a.log_path, self.workdir)}: {cmd}")

    # ------------------------------------------------------------------ finishing
    def _summary_written(self, a: _Active) -> Optional[dict]:
        if not a.summary:
            return None
        try:
            if os.path.getmtime(a.summary) + 1.0 < a.attempt_started:
                return None
            return read_summary(a.summary)
        except (OSError, ValueError):
            return None

    def _finish(self, a: _Active, rc: int) -> None:
        dur = _fmt_duration(time.time() - a.started)
        logrel = os.path.relpath(a.log_path, self.workdir)
        if rc == 0:
            self.active.pop(a.token)
            self.free_gpus.extend(a.gpus)
            self._set(a, DONE, f"done: {dur}, attempt {a.attempt}, log {logrel}")
            self.log(f"done {a.label} in {dur}")
            return
        summary = self._summary_written(a)
        why = _describe_exit(rc)
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
        last = _last_output_line(a.log_path)
        if bad_input is not None:
            parts[0] += ", not retried"
            parts.append(bad_input if len(bad_input) <= 300 else bad_input[:297] + "...")
        elif last:
            parts.append(f"last output: {last}")
        parts.append(f"log {logrel}")
        self._set(a, FAILED, "; ".join(parts))
        self.log(f"FAILED {a.label}: {'; '.join(parts)[8:]}")

    # ------------------------------------------------------------------ interrupt
    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self._interrupts += 1
        if self._interrupts == 1:
            print(f"\n[run_jobs] {signal.Signals(signum).name}: stopping {len(self.active)} job(s) "
                  f"(SIGINT, SIGKILL after {self.cfg.kill_grace:g}s; again to kill now)", file=self.out, flush=True)
        else:
            for a in list(self.active.values()):
                self._killpg(a, signal.SIGKILL)

    @staticmethod
    def _killpg(a: _Active, sig: int) -> None:
        if a.proc is None or a.proc.poll() is not None:
            return
        try:
            os.killpg(a.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _stop_all(self) -> None:
        for a in self.active.values():
            self._killpg(a, signal.SIGINT)
        deadline = time.time() + self.cfg.kill_grace
        while time.time() < deadline and any(a.proc and a.proc.poll() is None for a in self.active.values()):
            time.sleep(0.05)
        for a in self.active.values():
            self._killpg(a, signal.SIGKILL)  # the leader and anything left in its group
            if a.proc is not None:
                try:
                    a.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        for a in list(self.active.values()):
            self._set(a, PENDING, f"interrupted: {_now()} during attempt {a.attempt}; resumes when taken again")
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
                self.out.write(f"  later      {head}: {dec.reason}; then gates: "
                               f"{', '.join(job.requires)}\n")
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
            if dec.reason:
                extra += f" [{dec.reason}]"
            self.out.write(f"  would run  {when} {head}{extra}\n      $ {cmd}\n")
        self.out.write(f"dry run: {counts['run']} would run, {counts['skip']} would be skipped, "
                       f"{counts['wait']} wait for other jobs; {self.cfg.jobs_path} unchanged\n")
        self.out.flush()
        return 0
