"""Bad user input -> one line on stderr and an exit status, the same way for every entry point.

``pretrain.py``, ``pretrain_encoder.py``, ``evaluate.py`` and the ``dataset.build_*`` commands run their work
inside :func:`user_errors`; an exception that is bad input (a config key, a path, data that does not fit the
checkpoint, ...) ends the process with ``error: <one line naming the key / file>`` and exit status 1 (the dataset
builders: 2), with no traceback. Anything else is a crash and keeps its traceback.

What counts as bad input:

* a :class:`PlatformError`: the base class of the platform's own input errors (``ConfigError``,
  ``CheckpointError``, ``DatasetError``, ``EvaluatorError``, ``EncoderConfigError``, ``ArchConfigError``,
  ``ArchMismatchError``, ``EvaluateError``, ``ScienceError``, ``JobFileError``; each defined beside the code that
  raises it). A new input error subclasses it (or one of those); nothing else is reported as bad input;
* Hydra's composition errors (an unknown or misspelt override such as ``encoder.hiden_size=…``, a missing config
  group option, override syntax); :func:`run_hydra_main` lets them reach :func:`user_errors`;
* an ``OSError`` about a named path that retrying cannot fix: permission denied, read-only file system, no such
  file or directory, not a directory, is a directory, exists (disk full / I/O errors stay crashes);
* a malformed YAML file (PyYAML's error names the file and the line), wherever it is read: a config Hydra
  composes (``--config-path <run dir> --config-name config``), ``OmegaConf.load``.

The platform's own readers of input files (:mod:`core.io`: ``read_text`` / ``read_json`` / ``read_yaml``) turn a
file that is not UTF-8 text or not well-formed into a PlatformError naming the file (:func:`not_utf8_message`,
:func:`yaml_error_message`).

When the environment names a file in ``TRM_JOB_ERROR_FILE`` (``run_jobs.py`` sets it for every job) the message
is also written there: the queue then marks the job failed instead of retrying it (a deterministic error fails
the same way on every attempt).
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import os
import re
import sys
from typing import Any, Callable, Iterable, Iterator, NoReturn, Optional

import yaml
from hydra.errors import CompactHydraException

#: exit status of bad input (pretrain.py, pretrain_encoder.py, evaluate.py)
EXIT_USER_ERROR = 1
#: environment variable naming a file that receives the one-line message (set by run_jobs.py)
ERROR_FILE_ENV = "TRM_JOB_ERROR_FILE"

_USER_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EEXIST,
        errno.ENOTEMPTY,
        errno.ENAMETOOLONG,
    }
)
_MAX_LEN = 600


class PlatformError(Exception):
    """Bad user input (a config key, a path, data that does not fit the checkpoint, ...): entry points report it
    as one line naming the key / file and exit 1 (the dataset builders: 2). Subclass it for every new input error;
    an exception that is not a PlatformError is a crash and keeps its traceback."""


def user_error_types() -> tuple[type[BaseException], ...]:
    """The exception classes that mean bad input: :class:`PlatformError` and Hydra's composition errors."""
    return (PlatformError, CompactHydraException)


def one_line(text: str) -> str:
    """A multi-line message as one line: list items (tab-indented lines) joined with commas, other lines with
    '; '; Hydra's config search path and OmegaConf's full_key / object_type trailers dropped."""
    parts: list[str] = []
    for raw in str(text).splitlines():
        line = raw.strip()
        if not line or line.startswith(("full_key:", "object_type=", "reference_type=", "Set the environment")):
            continue
        if line.startswith("Config search path"):
            break
        if raw.startswith("\t") and parts:
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line
        else:
            parts.append(line.rstrip(";"))
    msg = ""
    for part in parts:  # sentences stay sentences; other lines are separated by '; '
        msg += part if not msg else ((" " if msg.endswith((".", ":", "!", "?")) else "; ") + part)
    msg = msg or "(no message)"
    return msg if len(msg) <= _MAX_LEN else msg[: _MAX_LEN - 3] + "..."


def validation_problems(err: Any, prefix: str = "") -> list[str]:
    """The one formatter of a pydantic ``ValidationError``: one phrase per problem, naming the dotted key (with
    ``prefix``, e.g. ``"arch."``) and the value: ``unknown key 'arch.hiden' (value 64)``, ``missing required key
    'checkpoint'``, ``lr='abc': Input should be a valid number, ...``; a whole-model check gives its message."""
    out = []
    for e in err.errors():
        key = prefix + ".".join(str(p) for p in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            out.append(f"unknown key '{key}' (value {e.get('input')!r})")
        elif e["type"] == "missing":
            out.append(f"missing required key '{key}'")
        elif not e["loc"]:
            out.append(msg)
        else:
            out.append(f"{key}={e.get('input')!r}: {msg}")
    return out


def _os_error_message(e: OSError) -> Optional[str]:
    if e.errno not in _USER_ERRNOS or not e.filename:
        return None
    where = str(e.filename) + (f" -> {e.filename2}" if e.filename2 else "")
    what = e.strerror or type(e).__name__
    hint = " (choose a writable directory)" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else ""
    return f"{where}: {what}{hint}"


def not_utf8_message(path: str, e: UnicodeDecodeError) -> str:
    """``<path>: not UTF-8 text (byte 0xff at offset 12)``: the one-line message of a file that does not decode."""
    bad = e.object[e.start : e.start + 1] if isinstance(e.object, (bytes, bytearray)) else b""
    byte = f"byte 0x{bad[0]:02x} " if bad else ""
    return f"{path}: not UTF-8 text ({byte}at offset {e.start}); save it as UTF-8"


def yaml_error_message(e: yaml.YAMLError, path: Optional[str] = None) -> str:
    """One line for a PyYAML error, naming the file (``path``, else the name PyYAML recorded) and the line:
    ``run/config.yaml: malformed YAML at line 2, column 1: expected ',' or ']', but got '<stream end>' (while
    parsing a flow sequence from line 1, column 5)``."""
    if not isinstance(e, yaml.MarkedYAMLError) or e.problem_mark is None:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"{path or '<yaml>'}: malformed YAML ({first})"
    mark = e.problem_mark
    where = path or mark.name
    msg = f"{where}: malformed YAML at line {mark.line + 1}, column {mark.column + 1}: {e.problem or e.context}"
    if e.context and e.problem and e.context_mark is not None:
        msg += f" ({e.context} from line {e.context_mark.line + 1}, column {e.context_mark.column + 1})"
    return msg


def user_error_message(exc: BaseException) -> Optional[str]:
    """The one-line message of ``exc`` when it is bad input; None for a crash (keep the traceback)."""
    if isinstance(exc, user_error_types()):
        msg = str(exc)
        cause = exc.__cause__ or (exc.__context__ if not exc.__suppress_context__ else None)
        if type(exc).__module__.startswith("hydra") and cause is not None and str(cause).strip():
            msg += "\n" + str(cause).strip().splitlines()[0]  # e.g. "Key 'hiden_size' is not in struct"
        if isinstance(exc, KeyError) and exc.args:
            msg = f"missing key {exc.args[0]!r}"
        return one_line(msg)
    if isinstance(exc, OSError):
        return _os_error_message(exc)
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        return one_line(yaml_error_message(exc))
    return None


def fail(message: str, code: int = EXIT_USER_ERROR) -> NoReturn:
    """Print ``error: <message>`` (one line) to stderr, record it for the job queue, exit with ``code``."""
    message = one_line(message)
    print(f"error: {message}", file=sys.stderr, flush=True)
    path = os.environ.get(ERROR_FILE_ENV)
    if path:
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(message + "\n")
        except OSError:
            pass
    sys.exit(code)


_UNKNOWN_KEY_RES = (
    re.compile(r"Could not override '([^']+)'"),
    re.compile(r"unknown (?:config )?key '([^']+)'"),
    re.compile(r"Key '([^']+)' is not in struct"),
)


def closest_key(message: str, known: Iterable[str]) -> Optional[str]:
    """The known (dotted) config key closest to the unknown key a message names (``Could not override 'lrr'``,
    ``unknown config key 'lrr'``, ``unknown key 'arch.hiden_size'``), or None."""
    for rx in _UNKNOWN_KEY_RES:
        m = rx.search(message)
        if m:
            best = difflib.get_close_matches(m.group(1).lstrip("+~"), list(known), n=1, cutoff=0.6)
            return best[0] if best else None
    return None


def with_key_hint(message: str, known: Iterable[str]) -> str:
    """``message`` ending with the closest known key (``; did you mean lr?``) when it refuses an unknown one, Hydra's
    advice to add the key with ``+`` (which the strict config refuses next) dropped; else ``message`` itself."""
    best = closest_key(message, known)
    if best is None:
        return message
    return re.sub(r"\s*To append to your config use \S+\.?;?", "", message) + f"; did you mean {best}?"


@contextlib.contextmanager
def user_errors(
    code: int = EXIT_USER_ERROR, known_keys: Optional[Callable[[], Iterable[str]]] = None
) -> Iterator[None]:
    """``with user_errors(): work()`` -- bad input ends the process with one line and ``code``; a crash keeps
    its traceback. ``known_keys``: the config's dotted keys; a refused unknown key is then followed by the closest
    known one (instead of Hydra's advice to add it with ``+``, which the strict config refuses next)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - filtered by user_error_message; crashes are re-raised
        msg = user_error_message(e)
        if msg is None:
            raise
        fail(with_key_hint(msg, known_keys()) if known_keys is not None else msg, code)


def run_hydra_main(main, code: int = EXIT_USER_ERROR, known_keys: Optional[Callable[[], Iterable[str]]] = None) -> None:
    """Call a ``@hydra.main`` function so that Hydra's composition errors (unknown override key, missing config
    option, override syntax) come out as one line through :func:`user_errors` instead of Hydra's multi-line report.
    (Hydra re-raises instead of printing when HYDRA_FULL_ERROR=1.)"""
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    with user_errors(code, known_keys):
        for path in _primary_config_files(sys.argv):  # Hydra's read of a non-UTF-8 file names no file
            try:
                with open(path, encoding="utf-8") as f:
                    f.read()
            except UnicodeDecodeError as e:
                fail(not_utf8_message(path, e), code)
        main()


_HYDRA_DIR_FLAGS = ("--config-path", "-cp", "--config-dir", "-cd")
_HYDRA_NAME_FLAGS = ("--config-name", "-cn")


def _primary_config_files(argv: list[str]) -> list[str]:
    """The config file a command line names with ``--config-path`` / ``--config-dir`` and ``--config-name``
    (``<dir>/<name>.yaml``; a relative dir: from the working directory or the script's), when it exists."""
    dirs, name = [], None
    for i, arg in enumerate(argv[1:], start=1):
        flag, eq, value = arg.partition("=")
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if flag in _HYDRA_DIR_FLAGS:
            dirs.append(value)
        elif flag in _HYDRA_NAME_FLAGS:
            name = value
    if not name:
        return []
    name = name if name.endswith((".yaml", ".yml")) else name + ".yaml"
    script_dir = os.path.dirname(os.path.abspath(argv[0])) if argv and argv[0] else os.getcwd()
    found = []
    for d in dirs:
        for base in (os.getcwd(), script_dir):
            path = os.path.join(base, d, name)
            if os.path.isfile(path):
                found.append(path)
                break
    return found


__all__ = [
    "PlatformError",
    "closest_key",
    "with_key_hint",
    "validation_problems",
    "EXIT_USER_ERROR",
    "ERROR_FILE_ENV",
    "user_error_types",
    "user_error_message",
    "not_utf8_message",
    "yaml_error_message",
    "one_line",
    "fail",
    "user_errors",
    "run_hydra_main",
]
