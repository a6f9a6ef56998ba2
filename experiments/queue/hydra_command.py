"""What a queued Hydra command would run: the entry script, its config directory and name, the overrides and the
mode, read the way Hydra itself reads the command line (``hydra._internal.utils.get_args_parser``, the parser of
``@hydra.main``): ``--config-name X`` / ``--config-name=X`` / ``-cn X``, ``--config-path P`` / ``-cp P`` (relative
to the script, as Hydra resolves it), ``--config-dir D`` / ``-cd D``, ``--multirun``, ``--cfg job``, ``--info`` and
the overrides. An argument the script would refuse (an unknown option, ``--cfg`` with ``--multirun``, ...) raises
:class:`CommandError` with the message the run would print. Used by :mod:`experiments.queue.check`.

Recognised lines: ``[ENV=..] [python|torchrun ... ] script.py <hydra arguments>`` where ``script.py`` contains
``@hydra.main``; shell syntax after the command (pipes, redirections, ``&&``) is not understood.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from dataclasses import dataclass
from typing import Optional

from hydra._internal.utils import compute_search_path_dir, get_args_parser
from hydra.core.utils import validate_config_path

from .requirements import JobFileError

_HYDRA_MAIN_RE = re.compile(r"@hydra\.main\((?P<args>[^)]*)\)", re.S)
_KWARG_RE = re.compile(r"(?P<k>config_path|config_name)\s*=\s*(?P<q>['\"])(?P<v>[^'\"]*)(?P=q)")
_ENV_ASSIGN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

#: actions that compose the config: the run itself, or printing it (--cfg, --info, --shell-completion)
COMPOSING_ACTIONS = ("run", "multirun", "cfg", "info", "shell-completion")
#: actions that run (train / evaluate) rather than print
RUNNING_ACTIONS = ("run", "multirun")


class CommandError(JobFileError):
    """A queued command its entry point would refuse before composing a config (Hydra's command-line parsing)."""


@dataclass
class HydraCommand:
    script: str  # absolute path of the entry-point script
    config_dir: str  # primary config directory (absolute, or pkg://...), as Hydra resolves it
    config_name: Optional[str]  # --config-name, else @hydra.main's config_name
    overrides: list[str]
    multirun: bool
    extra_config_dir: Optional[str] = None  # --config-dir (absolute): searched before the primary directory
    # run | multirun | cfg | info | shell-completion | help | hydra-help | version | experimental-rerun
    action: str = "run"
    name_flag: str = ""  # how the command chose the config: "--config-name X", or "" for the script's default

    @property
    def script_name(self) -> str:
        return os.path.basename(self.script)


def _script_index(words: list[str]) -> Optional[int]:
    """Index of the entry script: the first ``*.py`` word that is not an option or an ``ENV=value`` prefix."""
    for i, w in enumerate(words):
        if w.endswith(".py") and not w.startswith("-") and not _ENV_ASSIGN_RE.match(w):
            return i
    return None


def _decorator_kwargs(script: str) -> Optional[dict[str, str]]:
    """The string-literal ``config_path`` / ``config_name`` of the script's ``@hydra.main``; None without one."""
    try:
        with open(script, "r", encoding="utf-8") as f:
            src = f.read()
    except OSError:
        return None
    m = _HYDRA_MAIN_RE.search(src)
    if m is None:
        return None
    return {mm.group("k"): mm.group("v") for mm in _KWARG_RE.finditer(m.group("args"))}


def _parse_args(script_name: str, args: list[str]):
    """Hydra's own argparse over ``args``; (namespace or None for ``--version``); :class:`CommandError` with
    argparse's message for arguments the script would refuse."""
    parser = get_args_parser()
    parser.prog = script_name
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            return parser.parse_args(args)
    except SystemExit as e:  # argparse exits: 2 on a bad argument (message on stderr), 0 after --version
        if e.code in (0, None):
            return None
        lines = [ln.strip() for ln in printed.getvalue().splitlines() if ln.strip()]
        raise CommandError(lines[-1] if lines else f"{script_name}: bad arguments {' '.join(args)}") from None


def _action(args) -> str:
    """What Hydra does with the parsed arguments (hydra._internal.utils._run_hydra), refusing the combinations
    it refuses."""
    if args.experimental_rerun is not None:
        return "experimental-rerun"
    if args.help:
        return "help"
    if args.resolve and args.cfg is None:
        raise CommandError("The --resolve flag can only be used in conjunction with --cfg or --help")
    if args.hydra_help:
        return "hydra-help"
    chosen = [
        a
        for a, on in (
            ("run", args.run),
            ("cfg", args.cfg is not None),
            ("multirun", args.multirun),
            ("shell-completion", args.shell_completion),
            ("info", args.info is not None),
        )
        if on
    ]
    if len(chosen) > 1:
        raise CommandError("Only one of --run, --multirun, --cfg, --info and --shell_completion can be specified")
    return chosen[0] if chosen else "run"


def _default_config_dir(script: str, kw: dict[str, str], config_name: Optional[str]) -> str:
    """The decorator's config directory: a string-literal config_path as Hydra resolves it; otherwise (an
    expression, e.g. a path computed from ``__file__``) the script's config/ directory or its own directory,
    whichever holds ``<config_name>.yaml``."""
    if "config_path" in kw:
        return compute_search_path_dir(script, None, kw["config_path"]) or os.path.dirname(script)
    base = os.path.dirname(script)
    cands = [os.path.join(base, "config"), base]
    name = kw.get("config_name") or config_name
    return next((c for c in cands if name and os.path.isfile(os.path.join(c, name + ".yaml"))), cands[0])


def parse_hydra_command(command: str, workdir: str = ".") -> Optional[HydraCommand]:
    """The Hydra command in ``command`` (run from ``workdir``), or None if it does not run a script decorated with
    ``@hydra.main``. Raises :class:`CommandError` for arguments the script would refuse."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    idx = _script_index(words)
    if idx is None:
        return None
    script = words[idx] if os.path.isabs(words[idx]) else os.path.join(workdir, words[idx])
    kw = _decorator_kwargs(script)
    if kw is None:
        return None
    script = os.path.realpath(script)  # Hydra resolves config_path against the real directory of the script
    args = _parse_args(os.path.basename(script), words[idx + 1 :])
    if args is None:
        return HydraCommand(script, os.path.dirname(script), kw.get("config_name"), [], False, action="version")
    action = _action(args)
    config_name = args.config_name if args.config_name is not None else kw.get("config_name")
    try:
        validate_config_path(args.config_path)
    except ValueError as e:
        raise CommandError(" ".join(str(e).split())) from None
    if args.config_path is not None:
        config_dir = compute_search_path_dir(script, None, args.config_path)
    else:
        config_dir = _default_config_dir(script, kw, config_name)
    extra = None
    if args.config_dir is not None:
        extra = os.path.abspath(os.path.join(workdir, args.config_dir))
        if not os.path.isdir(extra):
            raise CommandError(f"Additional config directory '{extra}' not found (--config-dir {args.config_dir})")
    flag = f"--config-name {args.config_name}" if args.config_name is not None else ""
    return HydraCommand(
        script, config_dir, config_name, list(args.overrides), action == "multirun", extra, action, flag
    )


__all__ = ["COMPOSING_ACTIONS", "RUNNING_ACTIONS", "CommandError", "HydraCommand", "parse_hydra_command"]
