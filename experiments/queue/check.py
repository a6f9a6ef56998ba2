"""Check queued commands without running them: each Hydra entry-point command of a jobs file is composed
in-process with its overrides (as Hydra would: the entry script is imported first, so the config defaults it
registers with Hydra exist) and validated by the script's own ``config_from_hydra`` (pretrain.py /
pretrain_encoder.py: ``training.config.PretrainConfig`` with its typed ``arch`` / ``encoder`` sections;
evaluate.py: ``EvaluateConfig``) -- strict: an unknown or mistyped key fails with its name.
Sweeps (``--multirun a=1,2 b=x,y``) are checked value by value. ``python run_jobs.py --check`` is the CLI.

Not covered: paths (data dirs, checkpoints) are not opened; that happens at the start of the real run.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Optional

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser

from .jobfile import PENDING, JobFile

_HYDRA_MAIN_RE = re.compile(r"@hydra\.main\((?P<args>[^)]*)\)", re.S)
_KWARG_RE = re.compile(r"(?P<k>config_path|config_name)\s*=\s*(?P<q>['\"])(?P<v>[^'\"]*)(?P=q)")
_LAUNCHERS = {"python", "python3", "torchrun", "srun", "env", "uv", "run", "-u", "-m"}


@dataclass
class HydraCommand:
    script: str  # absolute path of the entry-point script
    config_dir: str
    config_name: str
    overrides: list[str]
    multirun: bool


def parse_hydra_command(command: str, workdir: str = ".") -> Optional[HydraCommand]:
    """Recognise ``[ENV=..] [python|torchrun ...] script.py [--multirun] overrides...``; None if it is not a
    command of a script decorated with ``@hydra.main``."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    idx = next((i for i, w in enumerate(words) if w.endswith(".py") and not w.startswith("-")), None)
    if idx is None:
        return None
    script = words[idx] if os.path.isabs(words[idx]) else os.path.join(workdir, words[idx])
    try:
        with open(script, "r", encoding="utf-8") as f:
            src = f.read()
    except OSError:
        return None
    m = _HYDRA_MAIN_RE.search(src)
    if m is None:
        return None
    kw = {mm.group("k"): mm.group("v") for mm in _KWARG_RE.finditer(m.group("args"))}
    if "config_name" not in kw:
        return None
    # config_path may be an expression (e.g. an absolute path computed from __file__): then look for
    # <config_name>.yaml beside the script and in its config/ directory
    base = os.path.dirname(os.path.abspath(script))
    cands = ([os.path.join(base, kw["config_path"])] if "config_path" in kw else []) + \
        [os.path.join(base, "config"), base]
    config_dir = next((c for c in cands if os.path.isfile(os.path.join(c, kw["config_name"] + ".yaml"))), cands[0])
    rest = words[idx + 1:]
    multirun = any(w in ("--multirun", "-m") for w in rest)
    overrides = [w for w in rest if not w.startswith("-")]
    return HydraCommand(os.path.abspath(script), os.path.abspath(config_dir), kw["config_name"], overrides, multirun)


def expand_sweeps(overrides: list[str], limit: int = 64) -> list[list[str]]:
    """Override lists covering every value of every sweep once (others at their first value)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    sweeps = [(i, list(o.sweep_string_iterator())) for i, o in enumerate(parsed) if o.is_sweep_override()]
    if not sweeps:
        return [list(overrides)]

    def with_values(choice: dict[int, str]) -> list[str]:
        out = []
        for i, o in enumerate(parsed):
            if i in choice:
                out.append(f"{o.get_key_element()}={choice[i]}")
            else:
                out.append(overrides[i])
        return out

    base = {i: vals[0] for i, vals in sweeps}
    combos = [with_values(base)]
    for i, vals in sweeps:
        for v in vals[1:]:
            combos.append(with_values({**base, i: v}))
    return combos[:limit]


def _entry_module(script: str) -> Any:
    """Import the entry script as a module (its ``__main__`` block does not run), once per path."""
    name = "_checked_" + re.sub(r"\W", "_", os.path.abspath(script))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def check_command(command: str, workdir: str = ".") -> tuple[str, str]:
    """("ok" | "error" | "not-hydra", message) for one command."""
    hc = parse_hydra_command(command, workdir)
    if hc is None:
        return "not-hydra", "not a Hydra entry-point command; not checked"
    try:
        variants = expand_sweeps(hc.overrides)
    except Exception as e:  # noqa: BLE001 - hydra's parser raises several types
        return "error", f"bad override syntax: {e}"
    if len(variants) > 1 and not hc.multirun:
        return "error", "sweep values (a=1,2) need --multirun"
    root = os.path.dirname(hc.script)
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        validate = getattr(_entry_module(hc.script), "config_from_hydra", None)
    except Exception as e:  # noqa: BLE001 - the script itself does not import
        return "error", f"{hc.script}: cannot be imported ({type(e).__name__}: {e})"
    for ov in variants:
        try:
            GlobalHydra.instance().clear()
            with initialize_config_dir(config_dir=hc.config_dir, version_base=None):
                cfg = compose(config_name=hc.config_name, overrides=ov)
            if validate is not None:
                validate(cfg)
        except Exception as e:  # noqa: BLE001 - report any composition / validation error
            msg = " ".join(str(e).split())
            return "error", f"{msg} (overrides: {' '.join(ov)})"
        finally:
            GlobalHydra.instance().clear()
    n = len(variants)
    msg = f"{hc.config_name}: composes and validates" + (f" ({n} sweep variants)" if n > 1 else "")
    keys = {o.split("=", 1)[0].lstrip("+") for o in hc.overrides if "=" in o}
    if not keys & {"run_name", "checkpoint_path"}:
        msg += "; WARNING: no +run_name= / checkpoint_path=: a crashed run cannot be resumed (resume=true)"
    return "ok", msg


def check_jobs(path: str, workdir: Optional[str] = None, include_finished: bool = False, out=sys.stdout) -> int:
    """Check every pending (or every) job of a jobs file; exit status 1 if any Hydra command fails."""
    workdir = os.path.abspath(workdir or os.getcwd())
    jf = JobFile.read(path)
    bad = 0
    for job in jf.jobs:
        if job.mark != PENDING and not include_finished:
            continue
        status, msg = check_command(job.command, workdir)
        bad += status == "error"
        out.write(f"  {status:9s} {job.label} ({path}:{job.lineno}): {msg}\n")
    out.write(f"check: {bad} command(s) failed\n")
    out.flush()
    return 1 if bad else 0


__all__ = ["HydraCommand", "parse_hydra_command", "expand_sweeps", "check_command", "check_jobs"]
