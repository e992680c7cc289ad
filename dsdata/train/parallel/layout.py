"""HybridLayout: data × pipeline × tensor parallelism over one (dp, pp, tp) DeviceMesh, and
`build_layout`, the one factory the trainer calls.  `parallelize` applies, as torchtitan's
`parallelize_llama` does: the pipeline split, tensor parallel, then the pipeline schedule.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from dsdata.train.config import Config, ConfigError
from dsdata.train.distributed import DistEnv, token_ids_on
from dsdata.train.parallel.collectives import union_of_names
from dsdata.train.parallel.data_parallel import DataParallelLayout
from dsdata.train.parallel.dims import resolve_dims
from dsdata.train.parallel.gradients import (average_over_data_parallel, full, global_grad_norm,
                                             sum_partial_gradients)
from dsdata.train.parallel.pipeline import (balanced_split, build_schedule, gather_stages, layer_parameter_counts,
                                            prune_to_stage)
from dsdata.train.parallel.protocol import Layout, LossFn
from dsdata.train.parallel.tensor import apply_tensor_parallel, check_tensor_parallel
from dsdata.train.parallel.tied import TiedEmbedding


def build_layout(config: Config, env: DistEnv) -> Layout:
    """Pure data parallel (DDP / FSDP2) unless tensor or pipeline parallel is asked for."""
    pc = config.parallel
    if pc.tensor_parallel_size == 1 and pc.pipeline_parallel_size == 1:
        return DataParallelLayout(config, env)
    return HybridLayout(config, env)


class HybridLayout(Layout):
    """The layout when tensor_parallel_size or pipeline_parallel_size > 1 (see the module docstring)."""

    def __init__(self, config: Config, env: DistEnv):
        pc = config.parallel
        self.config, self.env = config, env
        self.dims = d = resolve_dims(pc, env.world_size, config.training.global_batch_size)
        if pc.data_parallel == "fsdp" and d.dp > 1:
            raise ConfigError("parallel.data_parallel = 'fsdp' is supported for pure data parallelism only; with "
                              "tensor/pipeline parallel use 'ddp' (gradients all-reduced over the dp mesh dimension)")
        if pc.powersgd_rank > 0 and d.dp > 1:
            raise ConfigError("parallel.powersgd_rank needs pure DDP (tensor_parallel_size = pipeline_parallel_size = 1)")
        self.dp_rank, self.pp_rank, self.tp_rank = d.coordinates(env.rank)
        self.is_first_stage, self.is_last_stage = self.pp_rank == 0, self.pp_rank == d.pp - 1
        self.mesh = None
        self.groups: dict[str, object] = {}
        if env.world_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            self.mesh = init_device_mesh(env.device.type, (d.dp, d.pp, d.tp), mesh_dim_names=("dp", "pp", "tp"))
            self.groups = {name: self.mesh.get_group(name) for name in ("dp", "pp", "tp")}
        self.tied: TiedEmbedding | None = None  # pipeline stages of a tied-embedding model
        self.schedule = None  # the pipeline schedule (pp > 1)
        self.tp_partial_params: list[nn.Parameter] = []
        self.model_args = None
        self.vocab_parallel = False  # logits sharded over tp into loss_parallel

    def describe(self) -> str:
        extra = ", vocab-parallel loss" if self.vocab_parallel else ""
        return f"hybrid, {self.dims.describe()}{extra}"

    def parallelize(self, model: nn.Module) -> nn.Module:
        args = self.model_args = model.args
        check_tensor_parallel(args, self.dims.tp)
        if self.dims.pp > 1 and args.moe_experts:
            raise ConfigError("model.moe_experts with parallel.pipeline_parallel_size > 1 is not supported: the "
                              "load-balancing loss of earlier stages cannot reach the last stage's loss; use tensor/"
                              "data parallelism for MoE models")
        model.to(self.env.device)
        self._apply_pipeline_split(model)
        self._apply_tensor_parallel(model)
        if self.tied is not None:
            self.tied.bind(model)
        self._apply_pipeline_schedule(model)
        return model

    def _apply_pipeline_split(self, model: nn.Module) -> None:
        d = self.dims
        if d.pp == 1:
            return
        stage_layers = balanced_split(*layer_parameter_counts(model), d.pp)[self.pp_rank]
        prune_to_stage(model, stage_layers, self.is_first_stage, self.is_last_stage)
        if model.args.tie_embeddings:
            self.tied = TiedEmbedding(d, self.env.rank, self.groups["pp"])

    def _apply_tensor_parallel(self, model: nn.Module) -> None:
        if self.dims.tp == 1:
            return
        args = model.args
        # MoE: the trainer adds the (plain-tensor) load-balancing loss to the LM loss, which a
        # vocab-parallel loss would make a DTensor; keep the output replicated instead.
        self.vocab_parallel = args.vocab_size % self.dims.tp == 0 and not args.moe_experts
        self.tp_partial_params = apply_tensor_parallel(model, self.mesh["tp"], self.vocab_parallel)

    def _apply_pipeline_schedule(self, model: nn.Module) -> None:
        d = self.dims
        if d.pp == 1:
            return
        from torch.distributed.pipelining import PipelineStage

        stage = PipelineStage(model, self.pp_rank, d.pp, self.env.device, group=self.groups["pp"])
        self.schedule = build_schedule(stage, d.schedule, d.accumulation, self._pipeline_loss)

    def forward_backward(self, model: nn.Module, micro_batches: list[torch.Tensor], loss_fn: LossFn,
                         loss_multiplier: float, autocast_ctx: Callable) -> torch.Tensor:
        if self.schedule is None:
            reported = self._run_directly(model, micro_batches, loss_fn, loss_multiplier, autocast_ctx)
        else:
            reported = self._run_schedule(micro_batches, loss_fn, loss_multiplier, autocast_ctx)
        self._synchronize_gradients(model)
        return reported

    def _loss_context(self):
        if self.vocab_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return contextlib.nullcontext()

    def _run_directly(self, model, micro_batches, loss_fn, loss_multiplier, autocast_ctx) -> torch.Tensor:
        device = self.env.device
        n = len(micro_batches)
        reported = torch.zeros((), device=device)
        for tokens in micro_batches:
            tokens = token_ids_on(device, tokens)  # shard dtype across, int64 on the device
            with self._loss_context():  # backward too: the vocab-parallel loss has its own backward
                with autocast_ctx():
                    logits = model(tokens[:, :-1])
                    total, lm_loss = loss_fn(logits, tokens[:, 1:])
                (total * (loss_multiplier / n)).backward()
            reported += full(lm_loss).detach().float() / n
        return reported

    def _run_schedule(self, micro_batches, loss_fn, loss_multiplier, autocast_ctx) -> torch.Tensor:
        n = len(micro_batches)
        tokens = token_ids_on(self.env.device, torch.cat(micro_batches))
        self._step_loss_fn, self._step_multiplier, self._step_losses = loss_fn, loss_multiplier, []
        with self._loss_context(), autocast_ctx():
            if self.is_first_stage:
                self.schedule.step(tokens[:, :-1], return_outputs=False)
            elif self.is_last_stage:
                self.schedule.step(target=tokens[:, 1:], return_outputs=False)
            else:
                self.schedule.step(return_outputs=False)
        # The last `n` calls are the micro-batches: the schedule's first step also calls the loss
        # once while it infers the stages' shapes.
        reported = (torch.stack(self._step_losses[-n:]).mean() if self._step_losses
                    else torch.zeros((), device=self.env.device))
        self._step_loss_fn = None
        return reported

    def _pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        total, lm_loss = self._step_loss_fn(output, target)
        self._step_losses.append(full(lm_loss).detach().float())
        return total * self._step_multiplier

    def _synchronize_gradients(self, model: nn.Module) -> None:
        """Make every gradient equal to one process's: tp partial sums, tied copies, dp mean."""
        if self.dims.tp > 1:
            sum_partial_gradients(self.tp_partial_params, self.groups["tp"])
        if self.tied is not None:
            self.tied.sum_gradients()
        if self.dims.dp > 1:
            average_over_data_parallel(model.parameters(), self.groups["dp"], self.dims.dp)

    def mean_over_data_parallel(self, value: torch.Tensor) -> torch.Tensor:
        """Only last-stage ranks hold the loss; tp ranks hold copies."""
        if self.env.world_size == 1:
            return value
        value = full(value).detach().clone().float()
        if not self.is_last_stage:
            value.zero_()
        dist.all_reduce(value)
        return value / (self.dims.dp * self.dims.tp)

    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        duplicate = self.tied.duplicate_gradient() if self.tied is not None else None
        return global_grad_norm(grads, duplicate, self.groups["tp"] if self.dims.tp > 1 else None,
                                self.groups["pp"] if self.dims.pp > 1 else None, self.env.device)

    def optimizer_state_to_save(self, optim_state: dict) -> dict:
        """List every stage's parameters in the saved param groups (DCP keeps one rank's copy of them), so
        the checkpoint loads under a layout with other stages, or none."""
        if self.dims.pp == 1:
            return optim_state
        groups = []
        for group in optim_state["param_groups"]:
            names = union_of_names(list(group["params"]), self.env)
            if self.tied is not None:
                # One process names a tied weight once (tok_embeddings.weight); listing the last stage's
                # copy too would make it demand optimizer state under the second name.
                names = [n for n in names if n != "output.weight"]
            groups.append(dict(group, params=names))
        return dict(optim_state, param_groups=groups)

    def names_on_any_rank(self, names: list[str]) -> list[str]:
        return union_of_names(names, self.env)

    def after_checkpoint_load(self, model: nn.Module, optimizer: torch.optim.Optimizer, keep: set[str]) -> set[str]:
        return self.tied.load_from_first_stage(optimizer, keep) if self.tied is not None else keep

    def full_model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Gathered over tp shards (DTensor full_tensor) and pipeline stages (sent to rank 0)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        mine = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
        mine = {k: full(v).detach().cpu() for k, v in mine.items()}
        if self.dims.pp == 1:
            return mine if self.env.rank == 0 else {}
        return gather_stages(mine, self.model_args, self.dims, self.env.rank, self.env.device)
