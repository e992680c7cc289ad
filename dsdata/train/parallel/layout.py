"""HybridLayout: data × pipeline × tensor parallelism over one (dp, pp, tp) DeviceMesh.

It implements the layout interface of dsdata/train/distributed.py, so the training loop (loss,
scaling, clipping, optimizer, checkpoints, metrics) is the same code for every layout:

- `parallelize` prunes the plain model to this rank's pipeline stage, shards it with tensor
  parallelism and wraps the stage in a `torch.distributed.pipelining` schedule;
- `forward_backward` runs this rank's micro-batches (directly, or through the GPipe / 1F1B schedule)
  and then makes the gradients those of one process: sums partial gradients over tp, sums the two
  copies of a tied embedding across the first and last stage, averages over dp (one flat all-reduce
  per dtype, as DDP's buckets do);
- the reported loss lives on the last stage; `mean_over_data_parallel` sums it over all ranks (other
  stages contribute zero) so every rank — and rank 0, which writes metrics.jsonl — has the global loss;
- `grad_norm` adds squared norms over tp shards and pipeline stages (each parameter counted once).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from dsdata.train.config import Config, ConfigError
from dsdata.train.distributed import DataParallelLayout, DistEnv, LossFn, token_ids_on
from dsdata.train.parallel.dims import ParallelDims, resolve_dims
from dsdata.train.parallel.pipeline import balanced_split, build_schedule, layer_parameter_counts, prune_to_stage
from dsdata.train.parallel.tensor import apply_tensor_parallel, check_tensor_parallel


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _plain_scalar(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class HybridLayout(DataParallelLayout):
    """The layout when tensor_parallel_size or pipeline_parallel_size > 1 (see the module docstring)."""

    def __init__(self, config: Config, env: DistEnv):
        pc = config.parallel
        self.config, self.env = config, env
        self.dims: ParallelDims = resolve_dims(pc, env.world_size, config.training.global_batch_size)
        if pc.data_parallel == "fsdp" and self.dims.dp > 1:
            raise ConfigError("parallel.data_parallel = 'fsdp' is supported for pure data parallelism only; with "
                              "tensor/pipeline parallel use 'ddp' (gradients all-reduced over the dp mesh dimension)")
        if pc.powersgd_rank > 0 and self.dims.dp > 1:
            raise ConfigError("parallel.powersgd_rank needs pure DDP (tensor_parallel_size = pipeline_parallel_size = 1)")
        d = self.dims
        self.dp_size = d.dp
        self.dp_rank, self.pp_rank, self.tp_rank = d.coordinates(env.rank)
        self.micro_batch_size, self.accumulation = d.micro_batch_size, d.accumulation
        self.is_first_stage, self.is_last_stage = self.pp_rank == 0, self.pp_rank == d.pp - 1
        self.mesh = None
        self.groups: dict[str, object] = {}
        if env.world_size > 1:
            from torch.distributed.device_mesh import init_device_mesh

            self.mesh = init_device_mesh(env.device.type, (d.dp, d.pp, d.tp), mesh_dim_names=("dp", "pp", "tp"))
            self.groups = {name: self.mesh.get_group(name) for name in ("dp", "pp", "tp")}
        self.tie_group = None
        self.wrapped: nn.Module | None = None
        self.schedule = None
        self.tied_param: nn.Parameter | None = None  # this stage's copy of a cross-stage tied embedding
        self.tp_partial_params: list[nn.Parameter] = []
        self.stage_layers: list[int] = []
        self.model_args = None
        self.vocab_parallel = False  # logits sharded over tp into loss_parallel

    # ---------------------------------------------------------------- model

    def parallelize(self, model: nn.Module) -> nn.Module:
        d = self.dims
        args = model.args
        self.model_args = args
        check_tensor_parallel(args, d.tp)
        if d.pp > 1 and args.moe_experts:
            raise ConfigError("model.moe_experts with parallel.pipeline_parallel_size > 1 is not supported: the "
                              "load-balancing loss of earlier stages cannot reach the last stage's loss; use tensor/"
                              "data parallelism for MoE models")
        model.to(self.env.device)
        tied = bool(args.tie_embeddings)
        splits = balanced_split(*layer_parameter_counts(model), d.pp)
        self.stage_layers = splits[self.pp_rank]
        if d.pp > 1:
            prune_to_stage(model, self.stage_layers, self.is_first_stage, self.is_last_stage)
            if tied:
                self.tie_group = self._make_tie_group()
        if d.tp > 1:
            # MoE: the trainer adds the (plain-tensor) load-balancing loss to the LM loss, which a
            # vocab-parallel loss would make a DTensor; keep the output replicated instead.
            self.vocab_parallel = args.vocab_size % d.tp == 0 and not args.moe_experts
            self.tp_partial_params = apply_tensor_parallel(model, self.mesh["tp"], self.vocab_parallel)
        if d.pp > 1 and tied:
            self.tied_param = model.tok_embeddings.weight if self.is_first_stage else model.output.weight
        if d.pp > 1:
            from torch.distributed.pipelining import PipelineStage

            stage = PipelineStage(model, self.pp_rank, d.pp, self.env.device, group=self.groups["pp"])
            self.schedule = build_schedule(stage, d.schedule, d.accumulation, self._pipeline_loss)
        self.wrapped = model
        return model

    def _make_tie_group(self):
        """Process group of (first stage, last stage) for this rank's (dp, tp) coordinate."""
        d = self.dims
        if d.pp == 2:
            return self.groups["pp"]
        mine = None
        for dp in range(d.dp):  # every rank creates every group, in the same order
            for tp in range(d.tp):
                group = dist.new_group([d.rank_of(dp, 0, tp), d.rank_of(dp, d.pp - 1, tp)])
                if (dp, tp) == (self.dp_rank, self.tp_rank):
                    mine = group
        return mine

    def plain_model(self, model: nn.Module) -> nn.Module:
        return model

    # ---------------------------------------------------------------- forward / backward

    def _loss_context(self):
        if self.vocab_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return contextlib.nullcontext()

    def _pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        total, lm_loss = self._step_loss_fn(output, target)
        self._step_losses.append(_plain_scalar(lm_loss).detach().float())
        return total * self._step_multiplier

    def forward_backward(self, model: nn.Module, micro_batches: list[torch.Tensor], loss_fn: LossFn,
                         loss_multiplier: float, autocast_ctx: Callable) -> torch.Tensor:
        device = self.env.device
        n = len(micro_batches)
        if self.schedule is None:
            reported = torch.zeros((), device=device)
            for tokens in micro_batches:
                tokens = token_ids_on(device, tokens)  # shard dtype across, int64 on the device
                with self._loss_context():  # backward too: the vocab-parallel loss has its own backward
                    with autocast_ctx():
                        logits = model(tokens[:, :-1])
                        total, lm_loss = loss_fn(logits, tokens[:, 1:])
                    (total * (loss_multiplier / n)).backward()
                reported += _plain_scalar(lm_loss).detach().float() / n
        else:
            tokens = token_ids_on(device, torch.cat(micro_batches))
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
                        else torch.zeros((), device=device))
            self._step_loss_fn = None
        self._synchronize_gradients(model)
        return reported

    @torch.no_grad()
    def _synchronize_gradients(self, model: nn.Module) -> None:
        """Make every gradient equal to one process's: tp partial sums, tied copies, dp mean."""
        if self.dims.tp > 1:
            for p in self.tp_partial_params:
                if p.grad is not None:
                    dist.all_reduce(_local(p.grad), group=self.groups["tp"])
        tied = self.tied_param
        if self.tie_group is not None and tied is not None and tied.grad is not None:
            if hasattr(tied.grad, "placements") and tied.grad.placements != tied.placements:
                # The vocab-parallel embedding's backward may hand back a replicated gradient; the output
                # side's is sharded like the weight: both copies must all-reduce the same shard.
                tied.grad = tied.grad.redistribute(tied.device_mesh, tied.placements)
            dist.all_reduce(_local(tied.grad), group=self.tie_group)
        if self.dims.dp > 1:
            grads = [_local(p.grad) for p in model.parameters() if p.grad is not None]
            by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
            for g in grads:
                by_dtype.setdefault(g.dtype, []).append(g)
            for same in by_dtype.values():
                flat = torch.cat([g.reshape(-1) for g in same])
                dist.all_reduce(flat, group=self.groups["dp"])
                flat.div_(self.dims.dp)
                offset = 0
                for g in same:
                    g.copy_(flat[offset:offset + g.numel()].view_as(g))
                    offset += g.numel()

    # ---------------------------------------------------------------- reductions

    def mean_over_data_parallel(self, value: torch.Tensor) -> torch.Tensor:
        """The global loss on every rank: only last-stage ranks hold it; tp ranks hold copies."""
        if self.env.world_size == 1:
            return value
        value = _plain_scalar(value).detach().clone().float()
        if not self.is_last_stage:
            value.zero_()
        dist.all_reduce(value)
        return value / (self.dims.dp * self.dims.tp)

    @torch.no_grad()
    def grad_norm(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """Global L2 norm over all stages and tensor-parallel shards (tied copy counted once)."""
        device = self.env.device
        duplicate = self.tied_param.grad if (self.tied_param is not None and not self.is_first_stage) else None
        sharded = torch.zeros((), device=device, dtype=torch.float64)
        replicated = torch.zeros((), device=device, dtype=torch.float64)
        for g in grads:
            if g is duplicate:
                continue
            square = _local(g).detach().double().pow(2).sum()
            if hasattr(g, "placements") and any(p.is_shard() for p in g.placements):
                sharded += square
            else:
                replicated += square
        if self.dims.tp > 1:
            dist.all_reduce(sharded, group=self.groups["tp"])
        total = sharded + replicated
        if self.dims.pp > 1:
            dist.all_reduce(total, group=self.groups["pp"])
        return total.sqrt().float()

    @torch.no_grad()
    def after_checkpoint_load(self, model: nn.Module, optimizer: torch.optim.Optimizer, keep: set[str]) -> set[str]:
        """Give the last stage's copy of a tied embedding the first stage's weight and optimizer state.

        A checkpoint saved without pipeline stages names the tied weight and its optimizer state once
        (tok_embeddings.weight); the copy on the last stage (output.weight) takes them from stage 0.
        """
        if self.tie_group is None or self.tied_param is None:
            return keep
        if "tok_embeddings.weight" in keep:
            keep = keep | {"output.weight"}
        source = self.dims.rank_of(self.dp_rank, 0, self.tp_rank)
        state = optimizer.state.get(self.tied_param, {})
        tensors = [_local(self.tied_param.data)] + [_local(state[k]) for k in sorted(state) if torch.is_tensor(state[k])]
        for tensor in tensors:
            dist.broadcast(tensor, src=source, group=self.tie_group)
        return keep

    def complete_param_groups(self, optim_state: dict) -> dict:
        """List every stage's parameters in the saved param groups (DCP keeps one rank's copy of them), so
        the checkpoint loads under a layout with other stages, or none."""
        if self.dims.pp == 1:
            return optim_state
        groups = []
        for group in optim_state["param_groups"]:
            names = self.union_over_ranks(list(group["params"]))
            if self.tie_group is not None:
                # One process names a tied weight once (tok_embeddings.weight); listing the last stage's
                # copy too would make it demand optimizer state under the second name.
                names = [n for n in names if n != "output.weight"]
            groups.append(dict(group, params=names))
        return dict(optim_state, param_groups=groups)

    def union_over_ranks(self, names: list[str]) -> list[str]:
        """Sorted union of every rank's names (checkpoints record which parameters had optimizer state)."""
        if self.env.world_size == 1:
            return sorted(set(names))
        device = self.env.device
        data = torch.tensor(list("\n".join(sorted(set(names))).encode("utf-8")), dtype=torch.uint8, device=device)
        size = torch.tensor([data.numel()], device=device)
        sizes = [torch.zeros_like(size) for _ in range(self.env.world_size)]
        dist.all_gather(sizes, size)
        longest = int(max(s.item() for s in sizes))
        padded = torch.zeros(longest, dtype=torch.uint8, device=device)
        padded[:data.numel()] = data
        gathered = [torch.zeros_like(padded) for _ in range(self.env.world_size)]
        dist.all_gather(gathered, padded)
        union = set()
        for blob, n in zip(gathered, sizes):
            text = bytes(blob[:int(n.item())].cpu().tolist()).decode("utf-8")
            union.update(x for x in text.split("\n") if x)
        return sorted(union)

    # ---------------------------------------------------------------- export

    def full_model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's state (CPU tensors) on rank 0, gathered over tp shards and pipeline stages;
        other ranks return {} (all ranks must call)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from dsdata.train.model import Transformer

        mine = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
        mine = {k: _plain_scalar(v).detach().cpu() for k, v in mine.items()}
        if self.dims.pp == 1:
            return mine if self.env.rank == 0 else {}
        if (self.dp_rank, self.tp_rank) != (0, 0):
            return {}
        with torch.device("meta"):
            reference = Transformer(self.model_args)
        splits = balanced_split(*layer_parameter_counts(reference), self.dims.pp)
        out = dict(mine) if self.env.rank == 0 else {}
        for stage in range(1, self.dims.pp):
            with torch.device("meta"):
                shapes = prune_to_stage(Transformer(self.model_args), splits[stage], False,
                                        stage == self.dims.pp - 1).state_dict()
            source = self.dims.rank_of(0, stage, 0)
            for key in sorted(shapes):
                if self.env.rank == source:  # nccl sends from the GPU, gloo from the CPU
                    dist.send(mine[key].to(self.env.device).contiguous(), dst=0)
                elif self.env.rank == 0:
                    buffer = torch.empty(shapes[key].shape, dtype=shapes[key].dtype, device=self.env.device)
                    dist.recv(buffer, src=source)
                    out.setdefault(key, buffer.cpu())
        return out


def build_layout(config: Config, env: DistEnv) -> DataParallelLayout:
    """Pure data parallel (the trainer's DDP / FSDP2 layout) unless tensor or pipeline parallel is asked for."""
    pc = config.parallel
    if pc.tensor_parallel_size == 1 and pc.pipeline_parallel_size == 1:
        resolve_dims(pc, env.world_size, config.training.global_batch_size)  # the same clear errors
        return DataParallelLayout(config, env)
    return HybridLayout(config, env)
