"""Process-group, device, precision and seeding helpers.

Works the same under ``torchrun --nproc-per-node N pretrain.py ...`` (NCCL on CUDA, gloo on CPU) and plain
``python pretrain.py ...`` (no process group is created or needed -- pitfall 15). Every collective here is
a no-op when ``world_size == 1``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import shutil
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from core.errors import PlatformError
from training.config import ConfigError

T = TypeVar("T")


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    initialized_here: bool = False  # we created the process group (so we destroy it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """``auto`` -> ``cuda:<local_rank>`` when CUDA is available, else ``cpu``."""
    if device == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} but CUDA is not available")
        if dev.index is None:
            dev = torch.device(f"cuda:{local_rank}")
    return dev


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the torchrun process group when launched by torchrun (WORLD_SIZE > 1), else single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if world_size <= 1:
        return DistInfo(0, 1, 0, dev, False)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    created = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        created = True
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev, created)


def run_on_main(info: DistInfo, fn: Callable[[], T]) -> Optional[T]:
    """Run ``fn`` on rank 0 only; every rank returns its result, or raises the same bad-input error (a
    ``PlatformError`` raised by ``fn``: its type and one-line message), so no rank is left waiting in a collective
    while rank 0 stops (torchrun)."""
    out, err = None, None
    if info.is_main:
        try:
            out = fn()
        except PlatformError as e:
            err = (type(e), str(e))
    out, err = broadcast_object((out, err))
    if err is not None:
        raise err[0](err[1])
    return out


def shutdown_distributed(info: DistInfo, barrier: bool = False) -> None:
    """Destroy the process group this process created. ``barrier`` (a normal exit): wait for every rank first, so no
    rank tears its connections down while another still uses them (with gloo, rank 0 finishing its summary while
    rank 1 had already exited could abort rank 0 with "terminate called without an active exception"). Not on an
    error path: the other ranks may be gone. Garbage is collected before and after the group goes, so no cycle
    still holding distributed state is first freed while the interpreter shuts down: without it, 7 of 60 two-rank
    gloo runs of ``pretrain_encoder.py`` (two side by side on 2 cores) aborted or segfaulted at exit, after the
    barrier and the summary; with it 0 of 60 (record 2026-11-29-cell-rules, "Noticed")."""
    if info.initialized_here and dist.is_initialized():
        if barrier and info.world_size > 1:
            dist.barrier()
        gc.collect()
        dist.destroy_process_group()
        gc.collect()


@contextlib.contextmanager
def process_group(device: str = "auto"):
    """``init_distributed(device)`` for a with-block; leaving it shuts the group down, at a barrier when the block
    ended normally (:func:`shutdown_distributed`)."""
    info = init_distributed(device)
    try:
        yield info
    except BaseException:
        shutdown_distributed(info)
        raise
    shutdown_distributed(info, barrier=True)


def local_batch_size(global_batch_size: int, world_size: int) -> int:
    if global_batch_size % world_size != 0:
        raise ConfigError(
            f"global_batch_size={global_batch_size} is not divisible by the world size {world_size}; "
            f"choose a multiple of {world_size}"
        )
    return global_batch_size // world_size


def seed_everything(seed: int, rank: int = 0) -> None:
    """Per-rank seeding (rank offsets the seed so dropout/exploration differ across ranks)."""
    s = int(seed) + 1000003 * int(rank)
    random.seed(s)
    np.random.seed(s % (2**32))
    torch.manual_seed(s)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(s)


def autocast_dtype(device: torch.device) -> Optional[torch.dtype]:
    """bf16 on CUDA, none (fp32) on CPU (pitfall 24)."""
    return torch.bfloat16 if device.type == "cuda" else None


def autocast(device: torch.device):
    dt = autocast_dtype(device)
    if dt is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dt)


def should_compile(compile_flag: Optional[bool], device: torch.device) -> bool:
    """torch.compile: ``None`` = on for CUDA, off for CPU; ``True`` / ``False`` as asked, on any device. On CPU
    the inductor backend needs a C++ compiler: without one, compile=true falls back to eager, loudly."""
    if compile_flag is None:
        return device.type == "cuda"
    if compile_flag and device.type == "cpu" and not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        print("[train] WARNING: compile=true on CPU needs a C++ compiler (none on PATH); running eager", flush=True)
        return False
    return bool(compile_flag)


# ---------------------------------------------------------------------------------------------------
# Collectives (no-ops in a single process)
# ---------------------------------------------------------------------------------------------------
def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum_(t: torch.Tensor) -> torch.Tensor:
    if _active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_grads_(params: Iterable[torch.nn.Parameter]) -> None:
    """Sum gradients over ranks in one flat buffer (the loss is already divided by the global batch).

    Parameters without a gradient on this rank contribute zeros, so every rank issues the same collective.
    A parameter without a gradient on *every* rank keeps ``grad = None`` (as in one process, where the
    optimizer then skips it: no weight decay, no momentum-only step); the buffer carries one has-grad flag
    per parameter for that.
    """
    if not _active():
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    device = params[0].device
    flags = torch.tensor([float(p.grad is not None) for p in params], device=device)
    flat = torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params] + [flags]
    )
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    has_grad = flat[-len(params) :].tolist()  # one small device->host copy
    off = 0
    for p, any_rank in zip(params, has_grad):
        n = p.numel()
        if any_rank == 0:
            p.grad = None
        else:
            g = flat[off : off + n].view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
        off += n


def all_reduce_dict_(metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Sum a dict of scalar tensors over ranks (one collective, fixed key order)."""
    if not metrics:
        return metrics
    keys = sorted(metrics)
    stacked = torch.stack([metrics[k].detach().float().reshape(()) for k in keys])
    all_reduce_sum_(stacked)
    return {k: stacked[i] for i, k in enumerate(keys)}


def broadcast_module_(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank."""
    if not _active():
        return
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=src)


def gather_objects(obj: Any) -> list[Any]:
    """All ranks' objects (list indexed by rank); ``[obj]`` in a single process."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    if _active():
        dist.barrier()
