"""Check queued commands without running them: each Hydra entry-point command of a jobs file is read the way
Hydra reads it (:mod:`experiments.queue.hydra_command`: ``--config-name`` / ``-cn``, ``--config-path``,
``--config-dir``, ``--multirun``, ``--cfg``, overrides), composed in-process from the same search path and in the
same run mode (the entry script is imported first, so the config defaults it registers with Hydra exist) and
validated by the script's own ``check_config(cfg, task_overrides)`` -- what its main does with the composed config
before any work (pretrain.py / pretrain_encoder.py: ``training.config.PretrainConfig`` with its typed ``arch`` /
``encoder`` sections, pretrain_encoder.py also requires an encoder; evaluate.py: ``EvaluateConfig`` and its
arch-override rule) -- strict: an unknown or mistyped key fails with its name. A script without ``check_config``
is validated by its ``config_from_hydra(cfg)`` if it has one, else only composed. Sweeps (``--multirun a=1,2
b=x,y``) are checked value by value. ``python run_jobs.py --check`` is the CLI.

Not covered: paths (data dirs, checkpoints) are not opened; that happens at the start of the real run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from typing import Any, Callable, Optional

from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_automatic_config_search_path
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict

from core.errors import one_line, user_error_message, with_key_hint

from .hydra_command import COMPOSING_ACTIONS, RUNNING_ACTIONS, CommandError, HydraCommand, parse_hydra_command
from .jobfile import PENDING, JobFile

Validator = Callable[[DictConfig, list[str]], Any]


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
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def _validator(module: Any) -> Optional[Validator]:
    """The script's ``check_config(cfg, task_overrides)``, else its ``config_from_hydra(cfg)``, else None."""
    hook = getattr(module, "check_config", None)
    if callable(hook):
        return hook
    legacy = getattr(module, "config_from_hydra", None)
    return (lambda cfg, _overrides: legacy(cfg)) if callable(legacy) else None


def compose_command(hc: HydraCommand, overrides: list[str]) -> tuple[DictConfig, list[str]]:
    """(the config ``hc``'s task function would receive with ``overrides``, the task overrides its HydraConfig
    would hold): Hydra's search path for the script (primary config dir, ``--config-dir`` in front of it as Hydra
    puts it, plugins), composed in the command's run mode; the ``hydra`` node removed as before the task runs."""
    search_path = create_automatic_config_search_path(hc.script, None, hc.config_dir)
    if hc.extra_config_dir is not None:
        search_path.prepend(
            provider="command-line", path=f"file://{hc.extra_config_dir}", anchor=SearchPathQuery(provider="schema")
        )
    GlobalHydra.instance().clear()
    try:
        app = Hydra.create_main_hydra2(task_name=os.path.splitext(hc.script_name)[0], config_search_path=search_path)
        cfg = app.compose_config(
            hc.config_name, list(overrides), run_mode=RunMode.MULTIRUN if hc.multirun else RunMode.RUN
        )
    finally:
        GlobalHydra.instance().clear()
    task = list(cfg.hydra.overrides.task)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, task


def _missing_config(hc: HydraCommand) -> str:
    """One line for a config name that is not there, naming it, where it was looked for and what is there."""
    how = hc.name_flag or f"the default of {hc.script_name}'s @hydra.main"
    dirs = [d for d in (hc.extra_config_dir, hc.config_dir) if d]
    there = sorted({f[:-5] for d in dirs if os.path.isdir(d) for f in os.listdir(d) if f.endswith(".yaml")})
    return f"config '{hc.config_name}' not found ({how}) in {' or '.join(dirs)}" + (
        f"; configs there: {', '.join(there)}" if there else ""
    )


def _failure(hc: HydraCommand, e: BaseException, overrides: list[str], known_keys: Any = None) -> str:
    """One line for a command that fails to compose or validate; a misspelt key ends with the closest of the
    script's ``known_keys()`` (as the script itself would say it)."""
    if isinstance(e, MissingConfigException) and e.missing_cfg_file == hc.config_name and "primary config" in str(e):
        return _missing_config(hc)
    said = user_error_message(e) or one_line(f"{type(e).__name__}: {e}")
    if callable(known_keys):
        said = with_key_hint(said, known_keys())
    msg = f"{hc.config_name} ({hc.script_name}): " + said
    return f"{msg} (overrides: {' '.join(overrides)})" if overrides else msg


def _sweep_without_multirun(overrides: list[str]) -> str:
    """What a line with sweep values but no ``--multirun`` does: Hydra refuses it before running anything."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    sweeps = [(o.input_line, len(list(o.sweep_string_iterator()))) for o in parsed if o.is_sweep_override()]
    shown = ", ".join(f"{line} ({n} values)" for line, n in sweeps)
    return (
        f"{shown}: sweep values without --multirun; the line would not run (Hydra refuses an ambiguous value): add "
        f"--multirun to run every value, or give one value"
    )


def _resume_warning(configs: list[DictConfig]) -> str:
    """A training config (it has ``resume``) without a fixed run name / directory cannot be resumed after a crash."""
    if not all("resume" in c for c in configs):
        return ""
    if all(c.get("run_name") or c.get("checkpoint_path") for c in configs):
        return ""
    return "; WARNING: no +run_name= / checkpoint_path=: a crashed run cannot be resumed (resume=true)"


def check_command(command: str, workdir: str = ".") -> tuple[str, str]:
    """("ok" | "error" | "not-hydra" | "unchecked", message) for one command: "error" when the run would fail
    composing or validating its config, "unchecked" for a Hydra command that only prints help / the version."""
    try:
        hc = parse_hydra_command(command, workdir)
    except CommandError as e:
        return "error", str(e)
    if hc is None:
        return "not-hydra", "not a Hydra entry-point command; not checked"
    if hc.action not in COMPOSING_ACTIONS:
        return "unchecked", f"{hc.script_name} --{hc.action}: composes no config to run; not checked"
    try:
        variants = expand_sweeps(hc.overrides)
    except Exception as e:  # noqa: BLE001 - hydra's parser raises several types
        return "error", f"bad override syntax: {one_line(str(e))}"
    if len(variants) > 1 and not hc.multirun:
        return "error", _sweep_without_multirun(hc.overrides)
    root = os.path.dirname(hc.script)
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        module = _entry_module(hc.script)
        validate = _validator(module)
    except Exception as e:  # noqa: BLE001 - the script itself does not import
        return "error", f"{hc.script}: cannot be imported ({type(e).__name__}: {e})"
    configs, validated = [], None
    for ov in variants:
        try:
            cfg, task = compose_command(hc, ov)
            validated = validate(cfg, task) if validate is not None else None
        except Exception as e:  # noqa: BLE001 - report any composition / validation error
            return "error", _failure(hc, e, ov, getattr(module, "known_keys", None))
        configs.append(cfg)
    n = len(variants)
    if validate is None:
        what = "composes (no check_config / config_from_hydra to validate it)"
    else:
        what = "composes and validates" + (f" as {type(validated).__name__}" if validated is not None else "")
    msg = f"{hc.config_name} ({hc.script_name}): {what}"
    msg += f" ({n} sweep variants)" if n > 1 else ""
    if hc.action in RUNNING_ACTIONS:
        msg += _resume_warning(configs)
    else:
        msg += f"; --{hc.action} prints, runs nothing"
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


__all__ = ["HydraCommand", "parse_hydra_command", "expand_sweeps", "compose_command", "check_command", "check_jobs"]
