"""One attempt of one queued job: the process it runs in and what its exit means (the scheduling side -- which
line runs when, on which GPUs, and what its line then says -- is :mod:`experiments.queue.runner`).

An :class:`Attempt` starts its command in a new session / process group (``bash -c``, in the runner's workdir)
with the job's environment: ``TRM_JOB_*``, ``CUDA_VISIBLE_DEVICES`` from the GPU pool, a free ``MASTER_PORT``
(``PET_MASTER_PORT`` for torchrun), none of the runner's own torch.distributed variables, and
``TRM_JOB_ERROR_FILE`` where an entry point records bad input. Its output goes to the job's log file. When it
exits non-zero, :func:`deliberate_stop` (the run's summary.json says it stopped on purpose) and
:func:`deterministic_error` (bad input, usage error, command not found) tell a failure that a retry with resume
would repeat from a crash worth retrying.
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
import time
from dataclasses import dataclass, field
from typing import Optional

from core.errors import ERROR_FILE_ENV  # where an entry point records its one-line bad-input message

from .gates import command_overrides, read_summary
from .jobfile import Job

_SAFE_RE = re.compile(r"[^A-Za-z0-9_.\-]+")
# torch.distributed variables of the runner's own environment are not passed on (a job starts its own group)
_DIST_VARS = frozenset(
    {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "TORCHELASTIC_RUN_ID",
    }
)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_duration(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def fmt_limit(s: float) -> str:
    """A time limit (or the time run up to it): ``0.5s``, ``45s``, ``1m30s``, ``2h00m00s``."""
    return f"{round(s, 1):g}s" if s < 60 else fmt_duration(s)


def pid_alive(pid: int) -> bool:
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


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def last_output_line(path: str, limit: int = 160) -> str:
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
class Attempt:
    """A taken job line and its current attempt (``attempt`` of ``max_attempts``; ``resume``: rerun with the
    resume argument)."""

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
    timeout: Optional[float] = None  # seconds an attempt may run (the line's timeout=, else run_jobs.py --timeout)
    timed_out_at: Optional[float] = None  # when this attempt ran out of time and was sent SIGTERM
    started: float = field(default_factory=time.time)
    attempt_started: float = field(default_factory=time.time)
    proc: Optional[subprocess.Popen] = None

    @property
    def error_file(self) -> str:
        return os.path.splitext(self.log_path)[0] + ".error"

    @property
    def effective_command(self) -> str:
        return resume_command(self.command, self.resume_arg) if self.resume else self.command

    def environment(self, *, set_gpus: bool) -> dict[str, str]:
        """The command's environment (see the module docstring); ``set_gpus``: the runner manages a GPU pool."""
        env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}  # a job is its own process group
        env.update(
            PYTHONUNBUFFERED="1",
            TRM_JOB_NAME=self.label,
            TRM_JOB_ATTEMPT=str(self.attempt),
            TRM_JOB_RESUME="1" if self.resume else "0",
            TRM_JOB_LOG=self.log_path,
        )
        env.pop("TRM_JOB_ID", None)
        if self.job_id:
            env["TRM_JOB_ID"] = self.job_id
        env[ERROR_FILE_ENV] = self.error_file  # bad input is recorded here: failed, not retried
        if set_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        port = str(_free_port())
        env["MASTER_PORT"] = port  # single-process DDP inits
        env["PET_MASTER_PORT"] = port  # torchrun's --master-port default: parallel torchruns do not clash
        return env

    def spawn(self, *, workdir: str, shell: str, set_gpus: bool) -> str:
        """Start this attempt's command (its header lines appended to the log first); returns the command run."""
        self.attempt_started = time.time()
        self.timed_out_at = None
        cmd = self.effective_command
        env = self.environment(set_gpus=set_gpus)
        try:
            os.unlink(self.error_file)
        except FileNotFoundError:
            pass
        with open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(
                f"=== {now()} {self.label} attempt {self.attempt}/{self.max_attempts}"
                f"{' (resume)' if self.resume else ''}"
                f"{' CUDA_VISIBLE_DEVICES=' + ','.join(self.gpus) if set_gpus else ''}\n"
                f"=== $ {cmd}\n"
            )
            fh.flush()
            self.proc = subprocess.Popen(
                [shell, "-c", cmd],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cmd

    def kill(self, sig: int, *, leftovers: bool = False) -> None:
        """Signal the command's whole process group (no-op once it exited; ``leftovers``: also after the command
        itself exited, to end what is left of its group, e.g. a child that ignored SIGTERM)."""
        if self.proc is None or (self.proc.poll() is not None and not leftovers):
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def check_timeout(self, kill_grace: float) -> Optional[str]:
        """Enforce the time limit on a running attempt: past ``timeout`` its process group gets SIGTERM (the
        training loop then stops at the next step with a checkpoint), ``kill_grace`` seconds later SIGKILL.
        Returns a line to log when it sends SIGTERM (else None)."""
        if self.timeout is None or self.proc is None or self.proc.poll() is not None:
            return None
        t = time.time()
        if self.timed_out_at is None:
            if t - self.attempt_started < self.timeout:
                return None
            self.timed_out_at = t
            self.kill(signal.SIGTERM)
            return (
                f"{self.label}: timed out (timeout {fmt_limit(self.timeout)}); SIGTERM to its process group, "
                f"SIGKILL after {kill_grace:g}s"
            )
        if t - self.timed_out_at >= kill_grace:
            self.kill(signal.SIGKILL)
        return None

    def summary_written(self) -> Optional[dict]:
        """The run's summary.json if this attempt wrote it (else None)."""
        if not self.summary:
            return None
        try:
            if os.path.getmtime(self.summary) + 1.0 < self.attempt_started:
                return None
            return read_summary(self.summary)
        except (OSError, ValueError):
            return None
