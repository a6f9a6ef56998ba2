"""Atomic file writes (a crash at any point leaves the old file or the new one, never a partial file) and the
readers of input files (``read_text`` / ``read_json`` / ``read_yaml``): a missing file, one that is not UTF-8 text
or not well-formed JSON / YAML raises one PlatformError naming the file (and, for YAML, the line), never a
``UnicodeDecodeError`` / parser traceback."""

from __future__ import annotations

import json
import os
import tempfile
from typing import IO, Any, Callable, Type

import yaml
from omegaconf import OmegaConf

from core.errors import PlatformError, not_utf8_message, yaml_error_message


class InputFileError(PlatformError, ValueError):
    """An input file that cannot be read as what it should be (missing, not UTF-8 text, malformed JSON / YAML);
    the message names the file."""


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


def read_text(path: str, error: Type[Exception] = InputFileError, missing: str = "file not found") -> str:
    """The UTF-8 text of ``path``; a missing file or one that does not decode raises ``error`` (a PlatformError
    subclass) naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except UnicodeDecodeError as e:
        raise error(not_utf8_message(path, e)) from None


def read_json(path: str, error: Type[Exception] = InputFileError, missing: str = "file not found", **kw: Any) -> Any:
    """The JSON in ``path`` (``kw``: ``json.loads`` options, e.g. ``object_pairs_hook``); a missing, non-UTF-8 or
    malformed file raises ``error`` (a PlatformError subclass) naming it."""
    text = read_text(path, error, missing)
    try:
        return json.loads(text, **kw)
    except json.JSONDecodeError as e:
        raise error(f"{path}: malformed JSON ({e})") from None


def read_yaml(path: str, error: Type[Exception] = InputFileError, missing: str = "file not found") -> Any:
    """The YAML in ``path`` (``yaml.safe_load``); a missing, non-UTF-8 or malformed file raises ``error`` (a
    PlatformError subclass) in one line naming the file and, when malformed, the line."""
    text = read_text(path, error, missing)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise error(yaml_error_message(e, path)) from None


def read_omegaconf_yaml(path: str, error: Type[Exception] = InputFileError, missing: str = "file not found") -> Any:
    """The YAML in ``path`` read as ``OmegaConf.load`` reads it (``1e-4`` is a float; interpolations resolved), as
    plain containers; a missing, non-UTF-8 or malformed file raises ``error`` naming the file (and the line)."""
    text = read_text(path, error, missing)
    try:
        return OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    except yaml.YAMLError as e:
        raise error(yaml_error_message(e, path)) from None
