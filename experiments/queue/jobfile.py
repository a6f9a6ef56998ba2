"""The ``jobs.txt`` format: parser, writer and the locked, atomic edit of the file.

Line grammar (one job per line; everything else is kept verbatim)::

    [ ] <command>                          pending
    [~] <command>  # running: ...          running (taken by a runner)
    [x] <command>  # done: ...             done
    [!] <command>  # failed: <reason>      failed
    [-] <command>  # skipped: <reason>     skipped
    # anything                             comment / section header (verbatim)
    <blank>

After the command, a shell-style comment (a ``#`` that starts a word outside quotes) holds
``#``-separated segments (a segment starts at `` # ``):

* **metadata**: ``key=value`` tokens with keys from :data:`META_KEYS`, e.g.
  ``# id=overfit requires=base:train/exact_accuracy>0.9 retries=2``; or the long gate form
  ``# requires: base train/exact_accuracy>0.90``. A segment made only of ``key=value`` words is a tag segment:
  an unknown key in it is an error (naming line, key and the known keys), and so is a near-miss of a tag
  (``requirs=``, ``Retries=``) in a free comment;
* **status note**: the last segment when it starts with one of :data:`STATUS_WORDS`
  (``done``, ``running:``, ``failed:``, ``skipped:``, ``interrupted``, ``crashed``); the runner owns it
  and rewrites only it;
* any other segment is a free comment and is preserved.

A job is identified by its command text (whitespace-normalised) plus its occurrence among lines
with the same command, and while running by the unique token ``[t=...]`` in its status note, so
identity survives other people editing, inserting or reordering lines while a runner works.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
from dataclasses import dataclass, field
from typing import Iterator, Optional, Union

import filelock

from core.errors import not_utf8_message
from core.io import atomic_write

from .requirements import JobFileError, parse_requirement

PENDING, RUNNING, DONE, FAILED, SKIPPED = " ", "~", "x", "!", "-"
MARKS = {PENDING: "pending", RUNNING: "running", DONE: "done", FAILED: "failed", SKIPPED: "skipped"}
#: keys accepted in a metadata segment
META_KEYS = ("id", "requires", "summary", "retries", "resume", "gpus", "timeout")
#: first word of a status note (the runner's segment)
STATUS_WORDS = ("done", "running", "failed", "skipped", "interrupted", "crashed")
#: a pending line whose note starts with one of these is started with the resume argument
RESUME_WORDS = ("interrupted", "crashed")

_JOB_RE = re.compile(r"^(?P<indent>[ \t]*)\[(?P<mark>[ ~xX!\-])\](?P<sep>[ \t]+)(?P<rest>\S.*?)[ \t]*$")
_BOXLIKE_RE = re.compile(r"^[ \t]*\[.?.?\]")
_SEGMENT_SEP = re.compile(r"(?:^|\s)#(?=\s|$)")
_STATUS_RE = re.compile(r"^(?:%s)\b" % "|".join(STATUS_WORDS))
_TOKEN_RE = re.compile(r"\[t=([0-9a-zA-Z_-]+)\]")
_KV_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_ID_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_RUN_NAME_RE = re.compile(r"(?:^|\s)\+{0,2}run_name=['\"]?([^\s'\"]+)")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([dhms]?)")
_DURATION_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}
#: values of ``timeout=`` (and ``run_jobs.py --timeout``) that mean no time limit
NO_LIMIT = ("none", "off")


def parse_duration(text: str, where: str = "timeout") -> Optional[float]:
    """Seconds of a duration: ``90`` (seconds), ``90s``, ``30m``, ``2h``, ``1d``, ``1h30m``, ``1.5h``; None for
    ``none`` / ``off`` / ``0`` (no limit). Anything else raises :class:`JobFileError` naming ``where``."""
    t = text.strip().lower()
    if t in NO_LIMIT:
        return None
    parts = _DURATION_PART_RE.findall(t)
    if not t or "".join(n + u for n, u in parts) != t or (len(parts) > 1 and not all(u for _, u in parts)):
        raise JobFileError(
            f"{where}: bad duration {text!r}; expected e.g. 90s, 30m, 2h, 1h30m, 1d (a bare number: seconds) or none"
        )
    seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise JobFileError(f"{where}: a duration must be > 0 (none: no limit), got {text!r}")
    return seconds


def split_shell_comment(text: str) -> tuple[str, str]:
    """Split ``text`` into (command, comment) at the first ``#`` that starts a shell word outside quotes.

    The comment keeps its leading ``#``; the command is right-stripped.
    """
    quote: Optional[str] = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote is None:
            if c == "\\":
                i += 2
                continue
            if c in ("'", '"'):
                quote = c
            elif c == "#" and (i == 0 or text[i - 1] in " \t"):
                return text[:i].rstrip(), text[i:]
        elif quote == '"':
            if c == "\\":
                i += 2
                continue
            if c == '"':
                quote = None
        elif c == "'":
            quote = None
        i += 1
    return text.rstrip(), ""


def split_segments(comment: str) -> list[str]:
    """``"# a # b"`` -> ``["a", "b"]`` (segments separated by a ``#`` that stands alone as a word)."""
    parts = _SEGMENT_SEP.split(comment)
    return [p.strip() for p in parts if p.strip()]


@dataclass
class Job:
    """One job line. ``body`` is the verbatim text after the mark, without the status note."""

    lineno: int  # 1-based, in the file as last read
    mark: str
    command: str
    body: str
    note: str = ""
    meta: dict[str, str] = field(default_factory=dict)
    requires: list[str] = field(default_factory=list)  # raw requirement specs "ID[:EXPR]"
    indent: str = ""
    sep: str = " "
    eol: str = "\n"
    occurrence: int = 0  # index among jobs with the same normalised command
    _orig: Optional[str] = None  # original line text (without eol) while unchanged

    # ---- identity -------------------------------------------------------------------------
    @property
    def norm_command(self) -> str:
        return " ".join(self.command.split())

    @property
    def key(self) -> tuple[str, int]:
        return (self.norm_command, self.occurrence)

    @property
    def id(self) -> Optional[str]:
        return self.meta.get("id")

    @property
    def token(self) -> Optional[str]:
        m = _TOKEN_RE.search(self.note)
        return m.group(1) if m else None

    @property
    def status(self) -> str:
        return MARKS[self.mark]

    @property
    def timeout(self) -> Optional[float]:
        """Seconds an attempt may run (its ``timeout=`` tag; None: no tag, or ``timeout=none``)."""
        return parse_duration(self.meta["timeout"]) if "timeout" in self.meta else None

    @property
    def wants_resume(self) -> bool:
        """A pending line interrupted / crashed earlier: start it with the resume argument."""
        return self.mark == PENDING and self.note.startswith(RESUME_WORDS)

    @property
    def label(self) -> str:
        """Short human name: the id, else the command's ``run_name=`` value, else ``line N``."""
        if self.id:
            return self.id
        m = _RUN_NAME_RE.search(self.command)
        return m.group(1) if m else f"line {self.lineno}"

    # ---- rendering --------------------------------------------------------------------------
    def set_status(self, mark: str, note: str = "") -> None:
        if mark not in MARKS:
            raise ValueError(f"unknown job mark {mark!r}; expected one of {sorted(MARKS)}")
        if "\n" in note or "\r" in note:
            note = " ".join(note.split())
        note = note.replace("#", "%23")  # a '#' would start a new segment when the line is read back
        self.mark, self.note, self._orig = mark, note.strip(), None

    def render(self) -> str:
        if self._orig is not None:
            return self._orig
        line = f"{self.indent}[{self.mark}]{self.sep}{self.body}"
        if self.note:
            line += f"  # {self.note}"
        return line


Line = Union[Job, str]  # a str is a verbatim non-job line (without its line ending)


def _close_tag(key: str) -> Optional[str]:
    """The known tag ``key`` is probably a misspelling of (case or a letter or two), else None."""

    low = key.lower()
    if low in META_KEYS:
        return low
    close = difflib.get_close_matches(low, META_KEYS, n=1, cutoff=0.75)
    return close[0] if close else None


def _unknown_tag(where: str, key: str, value: str) -> str:
    guess = _close_tag(key)
    return (
        f"{where}: unknown job tag '{key}={value}'"
        + (f" (did you mean '{guess}='?)" if guess else "")
        + f"; known tags: {', '.join(META_KEYS)}. Free text goes in its own '# ...' segment with at least one "
        f"word that is not key=value"
    )


def _parse_meta(segment: str, where: str) -> Optional[tuple[dict[str, str], list[str]]]:
    """Metadata of one comment segment, or None if it is a free comment."""
    if segment.startswith("requires:"):
        toks = segment[len("requires:") :].split()
        if not toks or len(toks) > 2:
            raise JobFileError(f"{where}: expected '# requires: <job id> [<metric><op><value>]', got '# {segment}'")
        return {}, [toks[0] + (":" + toks[1] if len(toks) == 2 else "")]
    toks = segment.split()
    kvs = [_KV_RE.match(t) for t in toks]
    if not toks:
        return None
    if not all(kvs):
        if kvs[0] is not None and kvs[0].group(1) in META_KEYS:
            raise JobFileError(
                f"{where}: metadata segment '# {segment}' mixes tags with free words; put free text in its "
                f"own '# ...' segment"
            )
        for m in kvs:  # a free comment, but a misspelt tag in it would silently drop e.g. a gate
            if m is not None and m.group(1) not in META_KEYS and _close_tag(m.group(1)):
                raise JobFileError(_unknown_tag(where, m.group(1), m.group(2)))
        return None
    # a segment of key=value words only is a tag segment: every key must be a known tag (a typo such as
    # 'requirs=base' used to make the whole segment a free comment, dropping the gate without a word)
    meta: dict[str, str] = {}
    requires: list[str] = []
    for m in kvs:
        k, v = m.group(1), m.group(2)  # type: ignore[union-attr]
        if k not in META_KEYS:
            raise JobFileError(_unknown_tag(where, k, v))
        if not v:
            raise JobFileError(f"{where}: empty value for job tag '{k}='")
        if k == "requires":
            requires.extend(x for x in v.split(",") if x)
        elif k in meta:
            raise JobFileError(f"{where}: job tag '{k}' given twice")
        else:
            meta[k] = v
    if "id" in meta and not _ID_RE.match(meta["id"]):
        raise JobFileError(f"{where}: job id '{meta['id']}' may only contain letters, digits, '_', '-', '.'")
    for k in ("retries", "gpus"):
        if k in meta and not meta[k].isdigit():
            raise JobFileError(f"{where}: job tag '{k}' must be a non-negative integer, got '{meta[k]}'")
    if "timeout" in meta:
        parse_duration(meta["timeout"], f"{where}: job tag 'timeout'")
    return meta, requires


def parse_job_line(text: str, lineno: int = 0, path: str = "jobs.txt") -> Optional[Job]:
    """Parse one line (without line ending). None for comments / blanks; raises on malformed lines."""
    where = f"{path}:{lineno}"
    stripped = text.strip()
    if not stripped or stripped.startswith("#"):
        return None
    m = _JOB_RE.match(text)
    if m is None:
        if re.match(r"^[ \t]*\[[ ~xX!\-]\][ \t]*$", text):
            raise JobFileError(f"{where}: job line without a command: {text.strip()!r}")
        if _BOXLIKE_RE.match(text):
            raise JobFileError(
                f"{where}: bad job line {text.strip()!r}: expected '[ ] <command>' with a mark among "
                f"' ' (pending), '~' (running), 'x' (done), '!' (failed), '-' (skipped)"
            )
        raise JobFileError(
            f"{where}: not a job ('[ ] <command>'), a comment ('# ...') or a blank line: {text.strip()!r}"
        )
    rest = m.group("rest")
    command, comment = split_shell_comment(rest)
    if not command:
        raise JobFileError(f"{where}: job line without a command: {text.strip()!r}")
    segments = split_segments(comment)
    note = ""
    body = rest
    if segments and _STATUS_RE.match(segments[-1]):
        note = segments[-1]
        segments = segments[:-1]
        # body = the verbatim text before the note's '#'
        cut = [mm.start() for mm in _SEGMENT_SEP.finditer(rest)]
        body = rest[: cut[-1]].rstrip() if cut else command
    meta: dict[str, str] = {}
    requires: list[str] = []
    for seg in segments:
        parsed = _parse_meta(seg, where)
        if parsed is None:
            continue
        smeta, sreq = parsed
        for k, v in smeta.items():
            if k in meta:
                raise JobFileError(f"{where}: job tag '{k}' given twice")
            meta[k] = v
        requires.extend(sreq)
    mark = m.group("mark")
    return Job(
        lineno=lineno,
        mark="x" if mark == "X" else mark,
        command=command,
        body=body,
        note=note,
        meta=meta,
        requires=requires,
        indent=m.group("indent"),
        sep=m.group("sep"),
        _orig=text,
    )


class JobFile:
    """An in-memory jobs file: a list of verbatim lines and :class:`Job` objects."""

    def __init__(self, lines: list[Line], eols: list[str], path: str = "jobs.txt"):
        self.lines, self.eols, self.path = lines, eols, path

    # ---- parsing / writing ----------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, path: str = "jobs.txt") -> "JobFile":
        lines: list[Line] = []
        eols: list[str] = []
        counts: dict[str, int] = {}
        for i, raw in enumerate(text.splitlines(keepends=True), start=1):
            body = raw.rstrip("\r\n")
            eols.append(raw[len(body) :])
            job = parse_job_line(body, i, path)
            if job is None:
                lines.append(body)
            else:
                job.occurrence = counts.get(job.norm_command, 0)
                counts[job.norm_command] = job.occurrence + 1
                lines.append(job)
        jf = cls(lines, eols, path)
        jf.validate()
        return jf

    @classmethod
    def read(cls, path: str) -> "JobFile":
        try:
            with open(path, "r", encoding="utf-8", newline="") as f:
                text = f.read()
        except FileNotFoundError:
            raise JobFileError(f"jobs file not found: {path}") from None
        except UnicodeDecodeError as e:
            raise JobFileError(not_utf8_message(path, e)) from None
        return cls.parse(text, path)

    def render(self) -> str:
        out = []
        for line, eol in zip(self.lines, self.eols):
            out.append((line.render() if isinstance(line, Job) else line) + eol)
        return "".join(out)

    def write(self, path: Optional[str] = None) -> None:
        """Atomic write: temp file in the same directory, fsync, ``os.replace``."""
        atomic_write_text(path or self.path, self.render())

    # ---- queries ---------------------------------------------------------------------------------
    @property
    def jobs(self) -> list[Job]:
        return [x for x in self.lines if isinstance(x, Job)]

    def by_id(self) -> dict[str, Job]:
        return {j.id: j for j in self.jobs if j.id}

    def find(self, key: Optional[tuple[str, int]] = None, token: Optional[str] = None) -> Optional[Job]:
        """Find a job by its running token (preferred) or by (normalised command, occurrence)."""
        if token:
            for j in self.jobs:
                if j.token == token:
                    return j
        if key is not None:
            for j in self.jobs:
                if j.key == key:
                    return j
        return None

    def validate(self) -> None:
        """Unique ids, known requirement ids, no dependency cycles."""
        ids: dict[str, Job] = {}
        for j in self.jobs:
            if j.id:
                if j.id in ids:
                    raise JobFileError(
                        f"{self.path}:{j.lineno}: job id '{j.id}' already used on line {ids[j.id].lineno}"
                    )
                ids[j.id] = j
        for j in self.jobs:
            for spec in j.requires:
                req = parse_requirement(spec, where=f"{self.path}:{j.lineno}")
                if req.job_id not in ids:
                    raise JobFileError(
                        f"{self.path}:{j.lineno}: requires unknown job id '{req.job_id}'"
                        + (f" (known ids: {', '.join(sorted(ids))})" if ids else " (no job has an id= tag)")
                    )
        # cycles
        state: dict[str, int] = {}

        def visit(jid: str, stack: list[str]) -> None:
            if state.get(jid) == 2:
                return
            if state.get(jid) == 1:
                cyc = stack[stack.index(jid) :] + [jid]
                raise JobFileError(f"{self.path}: dependency cycle: {' -> '.join(cyc)}")
            state[jid] = 1
            for spec in ids[jid].requires:
                visit(parse_requirement(spec).job_id, stack + [jid])
            state[jid] = 2

        for jid in ids:
            visit(jid, [])


def atomic_write_text(path: str, text: str) -> None:
    """Atomic replace of ``path`` (temp file, fsync, os.replace), keeping its permissions and line endings."""
    atomic_write(path, lambda f: f.write(text), encoding="utf-8", newline="")


class JobStore:
    """Locked read-modify-write access to a jobs file shared by several runners and human editors.

    Every change re-reads the file under the lock, applies the edit to the fresh content and writes
    it atomically, so concurrent runners never take the same line and human edits are not lost.
    """

    def __init__(self, path: str, lock_timeout: float = 60.0):
        self.path = os.path.abspath(path)
        self.lock_path = self.path + ".lock"
        self.lock_timeout = lock_timeout
        self._lock = filelock.FileLock(self.lock_path, timeout=lock_timeout)

    def read(self) -> JobFile:
        """Read without locking (safe: writers replace the file atomically)."""
        return JobFile.read(self.path)

    @contextlib.contextmanager
    def edit(self) -> Iterator[JobFile]:
        """``with store.edit() as jf: ...`` -- locked; written back atomically if it changed."""
        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise TimeoutError(
                f"could not lock {self.lock_path} within {self.lock_timeout}s (another runner holds it?)"
            ) from None
        try:
            jf = JobFile.read(self.path)
            before = jf.render()
            yield jf
            after = jf.render()
            if after != before:
                atomic_write_text(self.path, after)
        finally:
            self._lock.release()
