"""Process group set-up and the data-parallel layout (DDP or FSDP2, optional PowerSGD).

The training loop talks to a *layout* object only: it wraps the model, splits the global batch into
this rank's micro-batches, runs forward/backward, and reduces losses and gradient norms.  This module
provides `DataParallelLayout`; the hybrid layouts (tensor / pipeline parallel, issue 9) live in
`dsdata/train/parallel/` and are picked up by `build_layout` when that package defines
`build_layout(config, env)` returning an object with the same methods (subclassing this one).
"""
from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from dsdata.train.config import Config, ConfigError


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None: single process without a process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# (device type, dtype) pairs whose device copy or widening raised once: widened on the host from then on.
_HOST_WIDENED: set[tuple[str, torch.dtype]] = set()


def token_ids_on(device: torch.device | str, tokens: torch.Tensor) -> torch.Tensor:
    """int64 token ids on `device` from a batch in the shard's dtype (uint16/uint32) or int64.

    The batch crosses to the device in its own dtype (uint16: a quarter of int64's bytes) and is
    widened there.  torch's uint16/uint32 are "shell" dtypes with few kernels.  Verified on CPU (torch
    2.13, tests/test_loader.py): slicing, split, cat, .to, .long of both.  NOT verified: the copy to a
    CUDA device and the widening there (no GPU where this was written).  If either raises, this
    (device type, dtype) is widened on the host from then on — uint16 → int32 (exact, half of int64's
    bytes), wider ones → int64 — and the device finishes with .long(); one warning says so.
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


def split_batch(global_batch: int, dp: int, pp: int, micro_batch: int, accumulation: int,
                schedule: str) -> tuple[int, int]:
    """(micro_batch_size, micro-batches per step) with dp × micro × accumulation = global batch.

    Unset values are derived; with a pipeline the default is 2·pp micro-batches (fewer idle stages)
    when the batch allows it, else pp.
    """
    if global_batch % dp:
        raise ConfigError(f"training.global_batch_size ({global_batch}) is not divisible by the "
                          f"data-parallel size ({dp})")
    per_rank = global_batch // dp
    if micro_batch and accumulation:
        if micro_batch * accumulation != per_rank:
            raise ConfigError(f"parallel.micro_batch_size ({micro_batch}) × parallel.gradient_accumulation_steps "
                              f"({accumulation}) must equal training.global_batch_size / data_parallel_size "
                              f"= {global_batch} / {dp} = {per_rank}")
    elif micro_batch:
        if per_rank % micro_batch:
            raise ConfigError(f"training.global_batch_size / data_parallel_size = {per_rank} is not divisible by "
                              f"parallel.micro_batch_size ({micro_batch})")
        accumulation = per_rank // micro_batch
    elif accumulation:
        if per_rank % accumulation:
            raise ConfigError(f"training.global_batch_size / data_parallel_size = {per_rank} is not divisible by "
                              f"parallel.gradient_accumulation_steps ({accumulation})")
        micro_batch = per_rank // accumulation
    elif pp > 1:
        accumulation = next((n for n in (2 * pp, pp) if per_rank % n == 0), 0)
        if not accumulation:
            raise ConfigError(f"training.global_batch_size / data_parallel_size = {per_rank} cannot be cut into "
                              f"{pp} pipeline micro-batches; set parallel.micro_batch_size")
        micro_batch = per_rank // accumulation
    else:
        micro_batch, accumulation = per_rank, 1
    if pp > 1 and schedule == "1f1b" and accumulation < pp:
        raise ConfigError(f"the 1f1b pipeline schedule needs at least pipeline_parallel_size ({pp}) micro-batches, "
                          f"got {accumulation}; lower parallel.micro_batch_size or use pipeline_schedule = 'gpipe'")
    return micro_batch, accumulation


LossFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class DataParallelLayout:
    """Pure data parallelism over all ranks (the layout when tensor = pipeline = 1)."""

    def __init__(self, config: Config, env: DistEnv):
        pc = config.parallel
        if pc.tensor_parallel_size > 1 or pc.pipeline_parallel_size > 1:
            raise ConfigError("parallel.tensor_parallel_size / pipeline_parallel_size > 1 need the hybrid "
                              "layouts of dsdata/train/parallel/, which this installation lacks")
        dp = pc.data_parallel_size or env.world_size
        if dp != env.world_size:
            raise ConfigError(f"parallel.data_parallel_size ({dp}) × tensor (1) × pipeline (1) must equal the "
                              f"world size ({env.world_size})")
        self.config, self.env = config, env
        self.dp_size, self.dp_rank = dp, env.rank
        self.micro_batch_size, self.accumulation = split_batch(
            config.training.global_batch_size, dp, 1, pc.micro_batch_size, pc.gradient_accumulation_steps, "gpipe")
        self.mesh = None
        if env.world_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            self.mesh = init_device_mesh(env.device.type, (dp,), mesh_dim_names=("dp",))
        self.wrapped: nn.Module | None = None

    # ---------------------------------------------------------------- model

    def parallelize(self, model: nn.Module) -> nn.Module:
        """Wrap the plain model for data parallelism; returns the module to train."""
        model.to(self.env.device)
        if self.env.world_size == 1:
            self.wrapped = model
            return model
        pc = self.config.parallel
        if pc.data_parallel == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for block in model.layers.values():
                fully_shard(block, mesh=self.mesh)
            fully_shard(model, mesh=self.mesh)
            self.wrapped = model
            return model
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.env.device.index] if self.env.device.type == "cuda" else None
        # Buffers (RoPE tables, the sparse gate snapshot) are identical on every rank by construction:
        # no need to broadcast them before each forward.
        import inspect

        if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
            no_buffer_sync = {"forward_sync_buffers": False}
        else:  # torch < 2.13
            no_buffer_sync = {"broadcast_buffers": False}
        ddp = DistributedDataParallel(model, device_ids=device_ids, **no_buffer_sync)
        if pc.powersgd_rank > 0:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=pc.powersgd_rank,
                                                start_powerSGD_iter=max(2, pc.powersgd_start_step),
                                                random_seed=self.config.training.seed)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        self.wrapped = ddp
        return ddp

    def model_parts(self) -> list[nn.Module]:
        """The wrapped model(s) whose state goes into checkpoints (several for pipeline stages)."""
        return [self.wrapped]

    def plain_model(self, model: nn.Module) -> nn.Module:
        return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model

    # ---------------------------------------------------------------- batches

    def local_micro_batches(self, global_batch: torch.Tensor) -> list[torch.Tensor]:
        """This rank's rows of the global batch (contiguous slice), cut into micro-batches (views, in the
        batch's dtype: forward_backward widens the ids to int64 on the device)."""
        per_rank = self.micro_batch_size * self.accumulation
        mine = global_batch[self.dp_rank * per_rank:(self.dp_rank + 1) * per_rank]
        return list(mine.split(self.micro_batch_size))

    def forward_backward(self, model: nn.Module, micro_batches: list[torch.Tensor], loss_fn: LossFn,
                         loss_multiplier: float, autocast_ctx: Callable) -> torch.Tensor:
        """Backward of Σ loss · multiplier / accumulation; returns this rank's mean loss (detached).

        loss_fn(logits, targets) -> (loss to differentiate, language-model loss to report).
        """
        reported = torch.zeros((), device=self.env.device)
        n = len(micro_batches)
        for i, tokens in enumerate(micro_batches):
            tokens = token_ids_on(self.env.device, tokens)  # shard dtype across, int64 on the device
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            with self._sync_context(model, last=i == n - 1):
                with autocast_ctx():
                    logits = model(inputs)
                    total, lm_loss = loss_fn(logits, targets)
                (total * (loss_multiplier / n)).backward()
            reported += lm_loss.detach().float() / n
        return reported

    def _sync_context(self, model: nn.Module, last: bool):
        if self.env.world_size == 1:
            return contextlib.nullcontext()
        if hasattr(model, "no_sync"):  # DDP: all-reduce only on the last micro-batch
            return contextlib.nullcontext() if last else model.no_sync()
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
            model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    # ---------------------------------------------------------------- reductions

    def mean_over_data_parallel(self, value: torch.Tensor) -> torch.Tensor:
        """Mean of a per-rank scalar over the data-parallel ranks (the global loss)."""
        if self.env.world_size == 1:
            return value
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value / self.dp_size

    def max_over_all(self, value: torch.Tensor) -> torch.Tensor:
        if self.env.world_size == 1:
            return value
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return value

    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Global L2 norm of the (already data-parallel averaged) gradients."""
        if not grads:
            return torch.zeros((), device=self.env.device)
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False)
        if hasattr(norm, "full_tensor"):  # FSDP2: each rank holds a shard of every gradient
            norm = norm.full_tensor()
        return norm

    def barrier(self) -> None:
        if self.env.world_size > 1:
            dist.barrier()

    @property
    def writes_metrics(self) -> bool:
        """The one rank that writes metrics.jsonl / TensorBoard / exports."""
        return self.env.rank == 0


def build_layout(config: Config, env: DistEnv) -> DataParallelLayout:
    """The layout for this config: the hybrid package's when present, else pure data parallel."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("dsdata.train.parallel") is not None:
        parallel = importlib.import_module("dsdata.train.parallel")
        if hasattr(parallel, "build_layout"):
            return parallel.build_layout(config, env)
    return DataParallelLayout(config, env)
