"""SLURM <-> torch.distributed bridge for Hydra's submitit launcher (``hydra/launcher=submitit_slurm``).

Pattern: one SLURM task per GPU (``tasks_per_node = gpus_per_node``). srun starts every task; the Hydra
callback :class:`SlurmTorchDistributed` (installed by config/hydra/launcher/submitit_slurm.yaml) runs in
each task before the training function and exports exactly the variables torchrun would give a worker
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), so
``training.distributed.init_distributed`` joins the process group unchanged (``cuda:<LOCAL_RANK>``).
Outside a multi-task submitit SLURM job, or under torchrun (``RANK`` already set), it does nothing.
See docs/experiments.md ("SLURM") for this pattern and the sbatch + torchrun alternative.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional

try:  # Hydra is a project dependency; keep the module importable for the pure helpers anyway
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object  # type: ignore[misc,assignment]

_MIN_PORT, _PORT_SPAN = 20000, 40000


def first_hostname(nodelist: str) -> str:
    """First host of a SLURM node list: ``"gpu[03-05,9],cpu1"`` -> ``"gpu03"``."""
    nodelist = nodelist.strip()
    if not nodelist:
        raise ValueError("empty SLURM node list")
    depth, first = 0, nodelist
    for i, c in enumerate(nodelist):
        depth += c == "["
        depth -= c == "]"
        if c == "," and depth == 0:
            first = nodelist[:i]
            break
    m = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", first)
    if not m:
        return first
    prefix, ranges, suffix = m.groups()
    start = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{start}{suffix}"


def slurm_torch_env(
    environ: Mapping[str, str] = os.environ, master_port: Optional[int] = None
) -> Optional[dict[str, str]]:
    """torch.distributed ``env://`` variables for this SLURM task, or None when not applicable
    (not a submitit SLURM job, a single task, or already set by torchrun)."""
    if environ.get("SUBMITIT_EXECUTOR") != "slurm" or "RANK" in environ:
        return None
    ntasks = int(environ.get("SLURM_NTASKS", environ.get("SLURM_STEP_NUM_TASKS", "1")))
    if ntasks <= 1:
        return None
    missing = [k for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_JOB_NODELIST") if k not in environ]
    if missing:
        raise RuntimeError(f"SLURM task without {', '.join(missing)}; cannot set up torch.distributed")
    nnodes = int(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES", "1")))
    if master_port is None:
        master_port = (
            int(environ["MASTER_PORT"])
            if "MASTER_PORT" in environ
            else _MIN_PORT + int(environ["SLURM_JOB_ID"]) % _PORT_SPAN
        )
    return {
        "RANK": environ["SLURM_PROCID"],
        "WORLD_SIZE": str(ntasks),
        "LOCAL_RANK": environ["SLURM_LOCALID"],
        "LOCAL_WORLD_SIZE": str(ntasks // max(nnodes, 1)),
        "MASTER_ADDR": first_hostname(environ["SLURM_JOB_NODELIST"]),
        "MASTER_PORT": str(master_port),
    }


class SlurmTorchDistributed(Callback):  # type: ignore[misc]
    """Hydra callback: export the torch.distributed environment of this SLURM task at job start."""

    def __init__(self, master_port: Optional[int] = None) -> None:
        self.master_port = master_port

    def on_job_start(self, config: Any = None, **kwargs: Any) -> None:  # noqa: ARG002
        env = slurm_torch_env(os.environ, self.master_port)
        if env:
            os.environ.update(env)
            print(
                f"[slurm] torch.distributed rank {env['RANK']}/{env['WORLD_SIZE']} (local {env['LOCAL_RANK']}), "
                f"master {env['MASTER_ADDR']}:{env['MASTER_PORT']}",
                flush=True,
            )
