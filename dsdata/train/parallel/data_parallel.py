"""DataParallelLayout: pure data parallelism over all ranks (DDP or FSDP2, optional PowerSGD); with
one process the model is trained as it is."""
from __future__ import annotations

import contextlib
import inspect
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from dsdata.train.config import Config
from dsdata.train.distributed import DistEnv, token_ids_on
from dsdata.train.parallel.dims import resolve_dims
from dsdata.train.parallel.protocol import Layout, LossFn


class DataParallelLayout(Layout):
    def __init__(self, config: Config, env: DistEnv):
        self.config, self.env = config, env
        self.dims = resolve_dims(config.parallel, env.world_size, config.training.global_batch_size)
        self.dp_rank = env.rank
        self.mesh = None
        if env.world_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            self.mesh = init_device_mesh(env.device.type, (self.dims.dp,), mesh_dim_names=("dp",))

    def describe(self) -> str:
        pc = self.config.parallel
        kind = "one process" if self.env.world_size == 1 else pc.data_parallel
        if self.env.world_size > 1 and pc.data_parallel == "ddp" and pc.powersgd_rank > 0:
            kind += f" + PowerSGD rank {pc.powersgd_rank}"
        return f"{kind}, {self.dims.describe()}"

    def parallelize(self, model: nn.Module) -> nn.Module:
        model.to(self.env.device)
        if self.env.world_size == 1:
            return model
        pc = self.config.parallel
        if pc.data_parallel == "fsdp":
            from torch.distributed.fsdp import fully_shard

            for block in model.layers.values():
                fully_shard(block, mesh=self.mesh)
            fully_shard(model, mesh=self.mesh)
            return model
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [self.env.device.index] if self.env.device.type == "cuda" else None
        # Buffers (RoPE tables, the sparse gate snapshot) are identical on every rank by construction:
        # no need to broadcast them before each forward.
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
        return ddp

    def forward_backward(self, model: nn.Module, micro_batches: list[torch.Tensor], loss_fn: LossFn,
                         loss_multiplier: float, autocast_ctx: Callable) -> torch.Tensor:
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
        """Gradients are all-reduced on the last micro-batch only."""
        if self.env.world_size == 1:
            return contextlib.nullcontext()
        if self.config.parallel.data_parallel == "ddp":
            return contextlib.nullcontext() if last else model.no_sync()
        model.set_requires_gradient_sync(last)  # FSDP2
        return contextlib.nullcontext()

    def mean_over_data_parallel(self, value: torch.Tensor) -> torch.Tensor:
        if self.env.world_size == 1:
            return value
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value / self.dims.dp

    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        if not grads:
            return torch.zeros((), device=self.env.device)
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False)
        if self.env.world_size > 1 and self.config.parallel.data_parallel == "fsdp":
            norm = norm.full_tensor()  # each rank holds a shard of every gradient
        return norm

    def optimizer_state_to_save(self, optim_state: dict) -> dict:
        return optim_state  # every rank holds every parameter (FSDP2: a shard of each)

    def names_on_any_rank(self, names: list[str]) -> list[str]:
        return names  # the same on every rank

    def after_checkpoint_load(self, model: nn.Module, optimizer: torch.optim.Optimizer, keep: set[str]) -> set[str]:
        return keep

    def full_model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
