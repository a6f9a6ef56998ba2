"""Atomic file writes: a crash at any point leaves the old file or the new one, never a partial file."""

from __future__ import annotations

import json
import os
import tempfile
from typing import IO, Any, Callable, Type


def atomic_write(path: str, write: Callable[[IO], None], *, binary: bool = False, **open_kwargs: Any) -> None:
    """Write ``path`` atomically: ``write(f)`` into a temp file beside it, fsync, then ``os.replace``.
    A crash at any point leaves either the old file or the new one, never a partial file. The file keeps the
    permissions of the one it replaces (a new file gets the umask's default, not mkstemp's 0600)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **open_kwargs) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str, obj: Any, *, compact: bool = False) -> None:
    """``obj`` as JSON, atomically: indented with sorted keys and no NaN (summaries, records), or ``compact`` (one
    line, large machine-read files such as predictions)."""
    if compact:
        atomic_write(path, lambda f: json.dump(obj, f, separators=(",", ":")))
    else:
        atomic_write(path, lambda f: json.dump(obj, f, indent=2, sort_keys=True, allow_nan=False))


def read_json(path: str, error: Type[Exception], missing: str = "file not found") -> Any:
    """The JSON in ``path``; a missing or malformed file raises ``error`` (a PlatformError subclass) naming it."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: malformed JSON ({e})") from None
