"""Process start-up (torchrun's environment, the device, the gloo / nccl process group) and moving
token batches to the device.  The layouts that use them live in dsdata/train/parallel/."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dsdata.train.config import ConfigError


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None: single process without a process group


# (device type, dtype) pairs whose device copy or widening raised once: widened on the host from then on.
_HOST_WIDENED: set[tuple[str, torch.dtype]] = set()


def token_ids_on(device: torch.device | str, tokens: torch.Tensor) -> torch.Tensor:
    """int64 token ids on `device` from a batch in the shard's dtype (uint16/uint32) or int64, widened on
    the device, or on the host once that raised for this (device type, dtype): docs/shards.md ("Loader").
    """
    if tokens.dtype == torch.int64:
        return tokens.to(device, non_blocking=True)
    key = (torch.device(device).type, tokens.dtype)
    if key not in _HOST_WIDENED:
        try:
            return tokens.to(device, non_blocking=True).long()
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            _HOST_WIDENED.add(key)
            warnings.warn(f"{tokens.dtype} token batches cannot be copied to / widened on {key[0]} ({exc}); "
                          "widening them on the host instead", RuntimeWarning, stacklevel=2)
    small = tokens.dtype in (torch.uint8, torch.int8, torch.int16, torch.uint16)
    return tokens.to(torch.int32 if small else torch.int64).to(device, non_blocking=True).long()


def init_distributed(device_choice: str = "auto") -> DistEnv:
    """Read torchrun's environment, pick the device, start gloo (CPU) or nccl (GPU) when world > 1."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device_choice == "auto" else device_choice == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise ConfigError("training.device = 'cuda' but no CUDA device is available; use training.device=cpu")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = None
    if world_size > 1:
        backend = "nccl" if use_cuda else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, device_id=device if use_cuda else None)
    return DistEnv(rank, world_size, local_rank, device, backend)


def shutdown_distributed(completed: bool) -> None:
    """Take this process's process groups down while the interpreter is whole (every exit path); a
    barrier first after a completed run only (a dead rank would hang it).  destroy_process_group()
    alone leaves gloo's threads held by DTensor's cached meshes, whose teardown at exit could abort."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if completed:
            dist.barrier()
    finally:
        dist.destroy_process_group()
        _release_process_groups()


def _release_process_groups() -> None:
    """Drop the references torch keeps to destroyed process groups (see shutdown_distributed)."""
    import gc

    try:
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache

        _clear_sharding_prop_cache()
    except ImportError:  # a torch without DTensor's caches keeps no meshes in them
        pass
    gc.collect()
    from torch.distributed.device_mesh import DeviceMesh

    for mesh in [o for o in gc.get_objects() if isinstance(o, DeviceMesh)]:
        groups = getattr(mesh, "_pg_registry", None)  # torch 2.13: the mesh's ProcessGroup objects
        if isinstance(groups, dict):
            groups.clear()
    gc.collect()
