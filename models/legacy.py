"""Arch configs written by earlier versions: what today's registry reads them as, and what it refuses.

Until commit ``0b65cd7`` every architecture's config carried four research switches, and every stored config
lists them (a checkpoint's ``config.arch`` and ``arch``, a science ``run.json`` record, a run's config.yaml):

=====================================================  ===========================================================
``grid_coords: true`` (``name: trm``)                  read as ``arch=trm_grid`` (the same parameters)
``pos_encodings: pointer`` + ``pointer_init`` /        read as ``arch=trm_pointer`` with those two fields (the same
``pointer_source`` + ``grid_coords: true``             parameters)
``context_broadcast: true``                            refused: removed, measured negative (:data:`REMOVED`)
the switches at their defaults (false, ``identity``,   dropped (every stored ``trm`` / ``hrm`` / ``transformer``
``token``)                                             config has them)
=====================================================  ===========================================================

Anything else with a switch set (``grid_coords`` on ``hrm``, a pointer without grid offsets, ...) is refused with
one line naming the commit that still builds it. :func:`upgrade_arch` is the one place this mapping happens;
``models.parse_arch_config`` applies it to every arch config it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.errors import PlatformError

#: the last commit whose ``trm`` / ``hrm`` / ``transformer`` configs have the switches
LAST_COMMIT = "0b65cd7"
#: arch names whose configs had the switches (a variant's own fields, e.g. trm_pointer's pointer_init, are not old)
_OLD_NAMES = ("trm", "hrm", "transformer")
_SWITCHES = {"grid_coords": False, "context_broadcast": False, "pointer_init": "identity", "pointer_source": "token"}
#: removed switch -> why (the measurement, its commit and its record file)
REMOVED = {
    "context_broadcast": "measured negative: run f8-bc scored held-out 0.08 / train fit 0.11 against the recipe's "
    "0.09 / 0.09 at 2000 steps (02456e9, docs/record/2026-11-26-8-families-6000-steps.md)",
}


class ArchRemovedError(PlatformError):
    """An arch config that uses a switch this version no longer has. Not a ValueError, so pydantic validators
    (``PretrainConfig.arch``) let it through unchanged: the user sees this one line, also from a checkpoint."""


def _value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _needs_commit(what: str, why: str) -> ArchRemovedError:
    return ArchRemovedError(
        f"{what} was removed ({why}); a config or checkpoint that uses it needs commit "
        f"{LAST_COMMIT} (git checkout {LAST_COMMIT})"
    )


def upgrade_arch(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` in today's terms (see the module docstring); a config without the old switches is returned as it
    is. Raises :class:`ArchRemovedError` naming the switch for what no variant of today builds."""
    d = dict(cfg)
    for key, why in REMOVED.items():  # whatever the name (a config of today given an old override too)
        if d.get(key, _SWITCHES[key]) != _SWITCHES[key]:
            raise _needs_commit(f"arch.{key}={_value(d[key])}", why)
    name = d.get("name")
    if name not in _OLD_NAMES or not any(k in d for k in _SWITCHES):
        return d
    old = {k: d.pop(k, default) for k, default in _SWITCHES.items()}
    pointer = d.get("pos_encodings") == "pointer"
    if not pointer:
        for key in ("pointer_init", "pointer_source"):
            if old[key] != _SWITCHES[key]:
                raise ArchRemovedError(
                    f"arch.{key}={_value(old[key])} applies to the pointer variant only (arch=trm_pointer)"
                )
        if not old["grid_coords"]:
            return d
    what = "arch.pos_encodings=pointer" if pointer else "arch.grid_coords=true"
    if name != "trm":
        raise _needs_commit(
            f"{what} on arch={name}",
            "grid offsets and pointer RoPE are the TRM variants arch=trm_grid and arch=trm_pointer now",
        )
    if pointer and not old["grid_coords"]:
        raise _needs_commit(
            f"{what} without arch.grid_coords=true",
            "arch=trm_pointer always has the grid offsets, as every measured pointer run did",
        )
    d["name"] = "trm_pointer" if pointer else "trm_grid"
    if pointer:
        d.update(pointer_init=old["pointer_init"], pointer_source=old["pointer_source"])
    return d
