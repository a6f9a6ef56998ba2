"""Arch configs written by earlier versions: what today's registry reads them as, and what it refuses.

Until commit ``0b65cd7`` every architecture's config carried four research switches, and every stored config
lists them (a checkpoint's ``config.arch`` and ``arch``, a science ``run.json`` record, a run's config.yaml):

=====================================================  ===========================================================
``grid_coords: true`` (``name: trm``)                  read as ``arch=trm_grid`` (the same parameters)
``pos_encodings: pointer`` + ``grid_coords: true``     read as ``arch=trm_pointer``, which is removed (:data:`REMOVED`)
``context_broadcast: true``                            refused: removed, measured negative (:data:`REMOVED`)
the switches at their defaults (false, ``identity``,   dropped (every stored ``trm`` / ``hrm`` / ``transformer``
``token``)                                             config has them)
=====================================================  ===========================================================

Variants and options that a measurement on the record retired leave the code (docs/architecture.md, "Variants and
removal"): :data:`REMOVED` names each with the measurement that retired it and the last commit that builds it, and a
config or checkpoint that uses one is refused in one line; one that lists a removed option at its default (off) reads
as today's config. A ``trm_views`` config stored before ``views_embed`` existed
(every field of its time, no ``views_embed``) had one table per view and is refused as ``views_embed=view``.
:func:`upgrade_arch` is the one place this mapping happens; ``models.parse_arch_config`` applies it to every arch
config it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.errors import PlatformError

#: the last commit whose ``trm`` / ``hrm`` / ``transformer`` configs have the switches
LAST_COMMIT = "0b65cd7"
#: the last commit with the variants and options pruned by the renovation (issue 43)
LAST_COMMIT_WITH_REMOVED = "3548346"
#: the last commit with ``arch.gather_copy`` (a copy head on the learned gather, measured three times, never adopted)
LAST_COMMIT_WITH_GATHER_COPY = "ef50ddb"
#: the last commit with ``arch.gather_demo_input`` (the counted form's read fed to the core as an input)
LAST_COMMIT_WITH_DEMO_INPUT = "c47b590"
#: arch names whose configs had the switches
_OLD_NAMES = ("trm", "hrm", "transformer")
_SWITCHES = {"grid_coords": False, "context_broadcast": False, "pointer_init": "identity", "pointer_source": "token"}
#: removed variant (``name=...``) or option (``key=value``; a bare key: any value but its old default) ->
#: (why: the measurement, its commit and its record file under docs/record/; the last commit that builds it)
REMOVED: dict[str, tuple[str, str]] = {
    "context_broadcast": (
        "measured negative: run f8-bc scored held-out 0.08 / train fit 0.11 against the recipe's 0.09 / 0.09 at 2000 "
        "steps (02456e9, docs/record/2026-11-26-8-families-6000-steps.md)",
        LAST_COMMIT,
    ),
    "name=trm_pointer": (
        "measured negative: pointer RoPE on the 8 families scored held-out 0.08 / 0.06 (pointer_source token / "
        "context) against 0.10 for the grid core at 2000 steps (5695a84, docs/record/2026-11-25-pointer-rope.md); "
        "grid views apply the maps since (docs/record/2026-11-27-grid-views.md)",
        LAST_COMMIT_WITH_REMOVED,
    ),
    "name=trm_pointer_memory": (
        "measured negative: held-out 0.18 / fit 0.20 against 0.25 / 0.25 for trm_memory at 2000 steps, data seed 0 "
        "(5bbfd92, docs/record/2026-11-27-grid-views.md)",
        LAST_COMMIT_WITH_REMOVED,
    ),
    "pos_encodings=rope2d": (
        "measured negative: the 8 families with rope2d stayed at token accuracy 0.55 where the recipe reached 0.68 "
        "(e42f783, docs/record/2026-11-25-8-family-gap-steps-and-size.md); grid offsets (arch=trm_grid) replaced it "
        "(1fd0952, docs/record/2026-11-25-grid-relative-positions.md)",
        LAST_COMMIT_WITH_REMOVED,
    ),
    "views_gate=context": (
        "measured negative: the context gate alone scored held-out 0.24-0.25 against 0.36 for the match gate at 2000 "
        "steps (5bbfd92, docs/record/2026-11-27-grid-views.md)",
        LAST_COMMIT_WITH_REMOVED,
    ),
    "views_embed=view": (
        "measured negative: one colour table per view left a held-out view untrained; one per kind took the default "
        "command's one-copy headline 0.58 -> 0.67 / 0.55 -> 0.70 (seeds 0 / 1) (9b0bf3b, "
        "docs/record/2026-11-27-view-tables.md)",
        LAST_COMMIT_WITH_REMOVED,
    ),
    "gather_copy=true": (
        "measured negative: a pointer-generator head on the learned gather scored one copy 0.09 / 0.08 and train fit "
        "0.15 / 0.19 against the counted form's 0.27 / 0.23 and 0.37 / 0.38 at 2000 steps (c504376, "
        "docs/record/2026-12-06-gather-copy-head.md); with the LM head's own loss and the recolour table, 0.27 / "
        "0.23 one copy and train fit 0.41 / 0.41 against the same day's counted form's 0.27 / 0.23 and 0.37 / 0.38 "
        "(cf65393, docs/record/2026-12-06-paired-form-and-copy-own-loss.md)",
        LAST_COMMIT_WITH_GATHER_COPY,
    ),
    "gather_copy_recolour=true": (
        "removed with gather_copy, whose copy it recoloured; trained only with gather_copy_lm_loss (cf65393, "
        "docs/record/2026-12-06-paired-form-and-copy-own-loss.md)",
        LAST_COMMIT_WITH_GATHER_COPY,
    ),
    "gather_copy_lm_loss=true": (
        "removed with gather_copy, whose LM head it gave its own loss: one copy 0.27 / 0.23, as the counted form's "
        "(cf65393, docs/record/2026-12-06-paired-form-and-copy-own-loss.md)",
        LAST_COMMIT_WITH_GATHER_COPY,
    ),
    "gather_copy_detach=true": (
        "removed with gather_copy, whose mixture it put on a detached z_H: one copy 0.29 / 0.24 against the counted "
        "form's 0.27 / 0.23, both seeds pooled 70 : 50 puzzles, sign test p = 0.08, short of the rule written "
        "before the runs (ef50ddb, docs/record/2026-12-07-copy-detach-diagonals-test-time-depth.md)",
        LAST_COMMIT_WITH_GATHER_COPY,
    ),
    "gather_demo_input=true": (
        "measured negative: the counted form's read fed to the core as an input (test cells and the memory's demo "
        "keys) answered one copy 0.24 / 0.22 against the counted form's 0.27 / 0.23, both seeds pooled 61 : 53 "
        "puzzles for the recipe, sign test p = 0.51 (c47b590, docs/record/2026-12-07-counted-read-as-input.md)",
        LAST_COMMIT_WITH_DEMO_INPUT,
    ),
}
#: removed options that a full dump of their time lists at their default (off): dropped, as they built nothing
_DROPPED_DEFAULTS = {
    "gather_copy": False,
    "gather_copy_recolour": False,
    "gather_copy_lm_loss": False,
    "gather_copy_detach": False,
    "gather_demo_input": False,
}
#: the fields every stored trm_views config has had (a full dump); one of those without views_embed predates it
_VIEWS_DUMP = ("views", "views_gate", "views_gate_scale", "views_match_scale", "memory_max_demos")


class ArchRemovedError(PlatformError):
    """An arch config that uses a switch this version no longer has. Not a ValueError, so pydantic validators
    (``PretrainConfig.arch``) let it through unchanged: the user sees this one line, also from a checkpoint."""


def _value(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _needs_commit(what: str, why: str, commit: str = LAST_COMMIT) -> ArchRemovedError:
    return ArchRemovedError(
        f"{what} was removed ({why}); a config or checkpoint that uses it needs commit {commit} (git checkout {commit})"
    )


def _refuse_removed(d: Mapping[str, Any], read_from: str = "") -> None:
    """Raise for the first entry of :data:`REMOVED` that ``d`` uses (whatever its name)."""
    for entry, (why, commit) in REMOVED.items():
        key, _, value = entry.partition("=")
        if key not in d:
            continue
        if value and _value(d[key]) == value:
            what = f"arch={value}" if key == "name" else f"arch.{key}={value}"
            raise _needs_commit(what + read_from, why, commit)
        if not value and d[key] != _SWITCHES[key]:
            raise _needs_commit(f"arch.{key}={_value(d[key])}", why, commit)


def upgrade_arch(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` in today's terms (see the module docstring); a config without the old switches is returned as it
    is. Raises :class:`ArchRemovedError` naming the variant or option for what no variant of today builds."""
    d = dict(cfg)
    _refuse_removed({k: v for k, v in d.items() if k != "name"})
    for key, default in _DROPPED_DEFAULTS.items():
        if key in d and d[key] == default:
            del d[key]
    if d.get("name") == "trm_views" and "views_embed" not in d and all(k in d for k in _VIEWS_DUMP):
        _refuse_removed({"views_embed": "view"})  # stored before views_embed existed: a table per view
    name = d.get("name")
    if name not in _OLD_NAMES or not any(k in d for k in _SWITCHES):
        _refuse_removed({"name": name})
        return d
    old = {k: d.pop(k, default) for k, default in _SWITCHES.items()}
    pointer = d.get("pos_encodings") == "pointer"
    if not pointer:
        for key in ("pointer_init", "pointer_source"):
            if old[key] != _SWITCHES[key]:
                raise ArchRemovedError(
                    f"arch.{key}={_value(old[key])} applies to the pointer variant only (arch=trm_pointer, removed; "
                    f"git checkout {LAST_COMMIT_WITH_REMOVED})"
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
    if pointer:
        _refuse_removed({"name": "trm_pointer"}, read_from=f" (read from {what})")
    d["name"] = "trm_grid"
    return d
