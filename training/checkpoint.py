"""Checkpoints: the full training state in one ``torch.save`` dict, written atomically.

Layout of ``<checkpoint_dir>/step_<N>.pt`` (``format = "trm-platform/1"``), as ``training.state.CheckpointManager``
writes it -- each component of the run under its own key, then the run's progress and record::

    model       state_dict of the (uncompiled) ACT model, incl. the puzzle-embedding buffer
    ema         EMA shadow of the trainable parameters (or None)
    optimizers  {name: optimizer.state_dict()} -- "adam" (AdamATan2) and "puzzle_emb" (SignSGDSparse)
    schedulers  {name: LambdaLR state_dict()} (absent in older files);  health  HealthMonitor state (or None)
    step        optimizer updates done;  examples_seen;  log_window {"acc", "n"} (the open log window);  wandb_id
    per_rank    [per rank] {"rng": python / numpy / torch / cuda RNG states, "data_state": the train dataset's
                state_dict() (exact stream position), "carry": the ACT carry (CPU tensors)}, gathered to rank 0;
                ``rng`` and ``data_state`` are also stored top-level as lists indexed by rank
    config      the validated PretrainConfig (dict);  arch  the resolved architecture config
    metadata    the train split's DatasetMetadata (dict);  identifiers_sha256;  data_fingerprint
    local_batch_size;  run_name;  project_name;  summary  RunSummary state

Files are written to a temp file in the same directory and ``os.replace``-d, so a crash never leaves a
truncated ``step_*.pt``; the previous checkpoint stays intact.

Loading never executes code from the file: every ``torch.load`` uses ``weights_only=True``. The state is stored
as plain data (tensors, numbers, strings, lists, tuples, dicts): :func:`to_plain` encodes what is not (numpy
arrays / scalars, e.g. numpy's RNG state; dataclasses of our own packages, e.g. the ACT carry) as tagged dicts
and :func:`from_plain` decodes them after loading. A file that needs anything else (a crafted pickle) is refused.
A truncated or corrupt newest checkpoint makes :func:`load_latest_intact` fall back to the newest readable one,
with a warning naming the bad file.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import importlib
import os
import pickle
import random
import re
import sys
import zipfile
from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch
from torch import nn

from core.errors import PlatformError
from core.io import atomic_write
from models.compat import ArchMismatchError, check_arch_compat
from models.legacy import ArchRemovedError, upgrade_arch

FORMAT = "trm-platform/1"
_STEP_RE = re.compile(r"^step_(\d+)\.pt$")


class CheckpointError(PlatformError, RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------------
def tree_map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor inside dicts / lists / tuples / dataclasses (returns a new tree)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: tree_map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj) if f.init}
        )
    if isinstance(obj, dict):
        return type(obj)((k, tree_map_tensors(v, fn)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(tree_map_tensors(v, fn) for v in obj)
    return obj


# Dataclasses that may be rebuilt from a checkpoint: only those defined in these packages of this project.
_DATACLASS_PACKAGES = ("models", "encoders", "training", "dataset", "evaluators")
_TAG = "__trm_plain__"


def to_plain(obj: Any, where: str = "state") -> Any:
    """``obj`` as plain data that ``torch.load(weights_only=True)`` accepts: tensors, numbers, strings, None,
    lists, tuples, sets and dicts pass through; numpy arrays / scalars and this project's dataclasses become
    tagged dicts (see :func:`from_plain`). Anything else raises ``TypeError`` naming where it is."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.Tensor, torch.dtype, torch.device)):
        return obj
    if isinstance(obj, np.ndarray):
        return {
            _TAG: "ndarray",
            "dtype": obj.dtype.str,
            "data": torch.from_numpy(obj.astype(np.int64, copy=True))
            if obj.dtype.kind in "ui"
            else torch.from_numpy(np.array(obj, copy=True)),
        }
    if isinstance(obj, np.generic):
        return obj.item()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        return {
            _TAG: "dataclass",
            "class": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {f.name: to_plain(getattr(obj, f.name), f"{where}.{f.name}") for f in dataclasses.fields(obj)},
        }
    if isinstance(obj, torch.Size):
        return obj
    if type(obj) in (dict, collections.OrderedDict):
        if _TAG in obj:
            raise TypeError(f"{where}: a dict key may not be {_TAG!r}")
        return type(obj)((k, to_plain(v, f"{where}[{k!r}]")) for k, v in obj.items())
    if type(obj) in (list, tuple, set, frozenset):
        return type(obj)(to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    raise TypeError(
        f"{where}: {type(obj).__module__}.{type(obj).__qualname__} cannot be stored in a checkpoint "
        "(plain data only: tensors, numbers, strings, lists, tuples, dicts, numpy arrays, dataclasses)"
    )


def _dataclass_by_name(name: str) -> type:
    module, _, qualname = name.partition(":")
    if module.split(".")[0] not in _DATACLASS_PACKAGES:
        raise CheckpointError(f"dataclass {name!r}: not a class of this project; refusing to rebuild it")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise CheckpointError(f"dataclass {name!r}: no such dataclass")
    return obj


def from_plain(obj: Any) -> Any:
    """Inverse of :func:`to_plain`."""
    if isinstance(obj, dict):
        tag = obj.get(_TAG)
        if tag == "ndarray":
            return obj["data"].numpy().astype(np.dtype(obj["dtype"]))
        if tag == "dataclass":
            cls = _dataclass_by_name(obj["class"])
            fields = {k: from_plain(v) for k, v in obj["fields"].items()}
            init = {f.name for f in dataclasses.fields(cls) if f.init}
            inst = cls(**{k: v for k, v in fields.items() if k in init})
            for k, v in fields.items():
                if k not in init:
                    setattr(inst, k, v)
            return inst
        return type(obj)((k, from_plain(v)) for k, v in obj.items())
    if type(obj) in (list, tuple, set, frozenset):
        return type(obj)(from_plain(v) for v in obj)
    return obj


def unwrap_model(model: nn.Module) -> nn.Module:
    return getattr(model, "_orig_mod", model)


def get_rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# ---------------------------------------------------------------------------------------------------
def checkpoint_file(checkpoint_dir: str, step: int) -> str:
    return os.path.join(checkpoint_dir, f"step_{int(step)}.pt")


def list_checkpoints(checkpoint_dir: str) -> list[tuple[int, str]]:
    """``[(step, path)]`` of complete checkpoints, oldest first."""
    out = []
    for p in glob.glob(os.path.join(checkpoint_dir, "step_*.pt")):
        m = _STEP_RE.match(os.path.basename(p))
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def find_latest_checkpoint(checkpoint_dir: str) -> Optional[str]:
    ckpts = list_checkpoints(checkpoint_dir)
    return ckpts[-1][1] if ckpts else None


class _WriteErrors:
    """A binary file that remembers the OSError of a failed ``write``: torch.save's zip writer turns it into a
    ``RuntimeError: [enforce fail at inline_container.cc] ... unexpected pos`` that no longer says why."""

    def __init__(self, f: Any):
        self.f, self.error = f, None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.f.flush()


def save_checkpoint_atomic(state: dict[str, Any], path: str) -> None:
    """Write ``state`` (encoded with :func:`to_plain`, so that it loads with ``weights_only=True``) atomically.
    A failed write (disk full, a file-size limit) raises its own ``OSError`` naming ``path``, and leaves the old
    file (or none) in place."""
    plain = to_plain(state)

    def write(f: Any) -> None:
        out = _WriteErrors(f)
        try:
            torch.save(plain, out)
        except RuntimeError:
            if out.error is None:
                raise
            raise out.error from None

    try:
        atomic_write(path, write, binary=True)
    except OSError as e:
        if e.filename is None and e.errno is not None:  # a bare write / fsync error: name the file
            raise OSError(e.errno, e.strerror or os.strerror(e.errno), path) from None
        raise


def prune_checkpoints(checkpoint_dir: str, keep: Optional[int], protect: Iterable[Optional[str]] = ()) -> list[str]:
    """Delete all but the newest ``keep`` ``step_*.pt`` files; never a file in ``protect`` (the checkpoint just
    written, the one summary.json's ``last_checkpoint`` names). Returns the deleted paths."""
    if keep is None:
        return []
    keep = max(int(keep), 1)
    safe = {os.path.abspath(p) for p in protect if p}
    deleted = []
    for _, p in list_checkpoints(checkpoint_dir)[:-keep]:
        if os.path.abspath(p) in safe:
            continue
        try:
            os.unlink(p)
            deleted.append(p)
        except FileNotFoundError:
            pass
    return deleted


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in lines:  # torch's weights_only refusal: the informative line names the offending global
        if "Unsupported global" in ln or "WeightsUnpickler error" in ln:
            return ln
    return lines[0] if lines else type(e).__name__


def read_checkpoint(path: str, map_location: Any = "cpu", *, mmap: bool = False) -> dict[str, Any]:
    """Load one ``step_*.pt`` file with ``weights_only=True`` (no code in the file is ever executed) and decode
    it. Raises :class:`CheckpointError` (one line naming the file) when it is missing, truncated, corrupt, holds
    objects other than plain data, or is not a trm-platform checkpoint."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001 - every failure becomes one line naming the file
        if isinstance(e, pickle.UnpicklingError) and "Weights only load failed" in str(e):
            raise CheckpointError(
                f"{path}: refused: the file holds objects other than plain data "
                f"({_first_line(e)}); nothing in it was executed. A checkpoint written by an "
                f"older version of this code can be converted, if you trust the file: "
                f"python -m training.checkpoint convert {path}"
            ) from None
        raise CheckpointError(
            f"{path}: unreadable checkpoint, truncated or corrupt ({type(e).__name__}: {_first_line(e)})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        fmt = state.get("format") if isinstance(state, dict) else None
        raise CheckpointError(
            f"{path}: not a trm-platform checkpoint (format={fmt!r}); "
            "checkpoints of the original TRM code load through models.compat"
        )
    try:
        state = from_plain(state)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    state["_path"] = path
    return state


def load_latest_intact(
    checkpoint_dir: str,
    map_location: Any = "cpu",
    *,
    quarantine: bool = False,
    warn: Optional[Callable[[str], None]] = None,
) -> Optional[dict[str, Any]]:
    """The newest checkpoint of ``checkpoint_dir`` that loads (None when the directory has none). A newer file
    that does not load (truncated, corrupt, refused) is reported through ``warn`` (default: stderr) and skipped;
    with ``quarantine`` it is renamed to ``<name>.corrupt`` so that later saves / pruning never count it.
    Raises :class:`CheckpointError` when checkpoints exist but none of them loads."""
    warn = warn or (lambda m: print(m, file=sys.stderr, flush=True))
    bad: list[str] = []
    for _, p in reversed(list_checkpoints(checkpoint_dir)):
        try:
            state = read_checkpoint(p, map_location)
        except CheckpointError as e:
            bad.append(p)
            moved = ""
            if quarantine:
                try:
                    os.replace(p, p + ".corrupt")
                    moved = f"; moved aside to {os.path.basename(p)}.corrupt"
                except OSError:
                    pass
            warn(f"[checkpoint] WARNING: skipping {e}{moved}; falling back to the previous checkpoint")
            continue
        if bad:
            warn(
                f"[checkpoint] WARNING: using {p} (step {state.get('step')}); newer checkpoint(s) could not be "
                f"loaded: {', '.join(os.path.basename(b) for b in bad)}"
            )
        return state
    if bad:
        raise CheckpointError(
            f"{checkpoint_dir}: no loadable checkpoint (all of "
            f"{', '.join(os.path.basename(b) for b in bad)} are truncated, corrupt or refused)"
        )
    return None


def load_checkpoint_file(path: str, map_location: Any = "cpu") -> dict[str, Any]:
    """Load one of our checkpoints: a ``step_*.pt`` file, or a run directory (its newest loadable checkpoint,
    with a warning when newer files are corrupt). Always ``weights_only=True``."""
    if os.path.isdir(path):
        state = load_latest_intact(path, map_location)
        if state is None:
            raise CheckpointError(f"{path}: no step_*.pt checkpoint in this directory")
        return state
    return read_checkpoint(path, map_location)


# ---------------------------------------------------------------------------------------------------
# Architecture compatibility (pitfall 10)
# ---------------------------------------------------------------------------------------------------
# Keys that change the computation / parameter shapes; a load across different values is refused.
_ARCH_KEYS_IGNORED = {"halt_exploration_prob", "forward_dtype", "loss", "halt_early_in_eval"}


def check_arch_compatible(saved: dict[str, Any], current: dict[str, Any], *, source: str = "checkpoint") -> None:
    """Refuse loading weights trained with another architecture config (names each differing key)."""
    try:  # written before its variant had a module (name trm, grid_coords true: trm_grid), or a removed switch
        saved = upgrade_arch(saved)
    except ArchRemovedError as e:
        raise CheckpointError(f"{source}: {e}") from None
    if saved.get("name") == current.get("name"):  # the models package's check (structural fields refused,
        # behavioural ones warned)
        try:
            check_arch_compat(saved, current, context="checkpoint")
        except ArchMismatchError as e:
            raise CheckpointError(f"{source}: {e}") from None
        return
    keys = (set(saved) | set(current)) - _ARCH_KEYS_IGNORED
    diff = {k: (saved.get(k), current.get(k)) for k in sorted(keys) if saved.get(k) != current.get(k)}
    if diff:
        lines = ", ".join(f"arch.{k}: checkpoint={a!r} vs config={b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(f"{source}: incompatible architecture ({lines}); refusing to load")


def load_weights(
    model: nn.Module, path: str, *, arch: Optional[dict[str, Any]] = None, use_ema: bool = False, strict: bool = True
) -> dict[str, Any]:
    """Weights-only initialisation (``load_checkpoint=…`` for fine-tuning). Returns the checkpoint dict."""
    state = load_checkpoint_file(path)
    if arch is not None:
        check_arch_compatible(state["arch"], arch, source=state["_path"])
    sd = dict(state["model"])
    if use_ema and state.get("ema"):
        sd.update(state["ema"]["shadow"])
    missing, unexpected = unwrap_model(model).load_state_dict(sd, strict=False)
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"{state['_path']}: state_dict mismatch; missing={missing[:8]} unexpected={unexpected[:8]}"
        )
    return state


# ---------------------------------------------------------------------------------------------------
# what a checkpoint of an older version of this code may hold beyond plain data: numpy arrays / scalars / dtypes
# (the numpy RNG state) -- and this project's dataclasses (the ACT carry), checked by :func:`_legacy_global`
_NUMPY_GLOBALS = {
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
}


def _legacy_global(name: str) -> Optional[Any]:
    """The object a legacy checkpoint's pickle names, if it is on the allow-list (else None)."""
    module, _, attr = name.rpartition(".")
    if name in _NUMPY_GLOBALS or module == "numpy.dtypes":
        obj: Any = importlib.import_module(module)
        return getattr(obj, attr, None)
    if module.split(".")[0] in _DATACLASS_PACKAGES:
        try:
            return _dataclass_by_name(f"{module}:{attr}")
        except (CheckpointError, ImportError):
            return None
    return None


def convert_legacy(path: str) -> bool:
    """Rewrite a checkpoint of an older version of this code (pickled numpy RNG state / carry dataclasses) as
    plain data; True when it was rewritten, False when it is already in the current format (left as it is). The
    file is unpickled with ``weights_only=True`` and an allow-list of the globals such files hold (numpy arrays /
    scalars / dtypes, this project's dataclasses): a file naming anything else is refused before anything in it
    runs."""
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path}: not a torch checkpoint (no zip archive: a raw pickle or torch's pre-1.6 "
            f"format); refused, nothing in it was executed"
        )
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (RuntimeError, ValueError, pickle.UnpicklingError) as e:
        raise CheckpointError(
            f"{path}: not a torch checkpoint ({_first_line(e)}); refused, nothing in it was executed"
        ) from None
    if not names:  # plain data only: the current format (read_checkpoint refuses anything else)
        read_checkpoint(path, mmap=True)
        return False
    allowed = {n: _legacy_global(n) for n in names}
    refused = sorted(n for n, obj in allowed.items() if obj is None)
    if refused:
        raise CheckpointError(
            f"{path}: refused: it needs {', '.join(refused)}, which a checkpoint of this code "
            f"never holds; nothing in it was executed"
        )
    dtypes = [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]  # built by numpy.dtype's state
    with torch.serialization.safe_globals([*allowed.values(), *dtypes]):
        state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a trm-platform checkpoint; nothing converted")
    save_checkpoint_atomic(state, path)
    read_checkpoint(path)  # loads with weights_only=True now
    return True


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m training.checkpoint",
        description="Checkpoint maintenance. convert: rewrite trusted checkpoints of an "
        "older version of this code so that they load with weights_only=True.",
    )
    ap.add_argument("command", choices=["convert"])
    ap.add_argument("paths", nargs="+", help="step_*.pt files (or run directories: all their step_*.pt)")
    args = ap.parse_args(argv)
    files = [p for a in args.paths for p in ([c for _, c in list_checkpoints(a)] if os.path.isdir(a) else [a])]
    failed = 0
    for f in files:  # one file that cannot be converted does not stop the others
        try:
            if not os.path.isfile(f):
                raise CheckpointError(f"{f}: checkpoint file not found")
            print(f"converted {f}" if convert_legacy(f) else f"skipped {f}: already in the current format")
        except CheckpointError as e:
            print(f"error: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
