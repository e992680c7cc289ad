"""Optimizers (DeepOpt, LambdaOpt, AdamW baseline) and the warm-up + cosine learning-rate schedule.

All state is tensors, so torch.distributed.checkpoint saves and reshards it like the model.  An
optimizer is one `OPTIMIZERS` row (`register_optimizer`, `OptimizerRow`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from dsdata.core.params import Integer, NoOptions, Number, Param, Settings
from dsdata.train.registry import Registry


def _full_norm(t: torch.Tensor) -> torch.Tensor:
    """L2 norm of a tensor that may be a sharded DTensor (then the norm over all its shards)."""
    norm = torch.linalg.vector_norm(t)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def _adam_moments(state: dict, p: torch.Tensor) -> tuple[dict, int]:
    """Adam's per-parameter state (step, first and second moments), created on first use; the
    step count is advanced and returned."""
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["step"] += 1
    return state, int(state["step"].item())


class DeepOpt(torch.optim.Optimizer):
    """Adam whose β1 and β2 follow a schedule over training (`betas_at`), with decoupled weight decay
    and bias correction by the products of the betas actually used; docs/train.md ("Optimizers")."""

    def __init__(self, params, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.999), beta2_final: float = 0.9999,
                 schedule_steps: int = 10000, eps: float = 1e-8, weight_decay: float = 0.0):
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"DeepOpt betas must be in [0, 1), got {betas}")
        if not betas[1] <= beta2_final < 1.0:
            raise ValueError(f"DeepOpt beta2_final must be in [beta2, 1), got {beta2_final}")
        if schedule_steps < 1:
            raise ValueError("DeepOpt schedule_steps must be >= 1")
        defaults = dict(lr=lr, betas=betas, beta2_final=beta2_final, schedule_steps=schedule_steps, eps=eps,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)
        self._product_cache: dict[tuple, tuple[int, float, float]] = {}

    def beta_products(self, step: int, group: dict) -> tuple[float, float]:
        """Π β1_i and Π β2_i for i = 1..step, in float64.

        Recomputed from the step count rather than stored: Optimizer.load_state_dict casts floating
        state to the parameter dtype, and fp32 products would make a resumed run drift.
        """
        key = (tuple(group["betas"]), group["beta2_final"], group["schedule_steps"])
        cached = self._product_cache.get(key)
        if cached is not None and cached[0] == step:
            return cached[1], cached[2]
        if cached is not None and cached[0] == step - 1:
            start, prod1, prod2 = step, cached[1], cached[2]
        else:
            start, prod1, prod2 = 1, 1.0, 1.0
        for i in range(start, step + 1):
            beta1, beta2 = self.betas_at(i, group)
            prod1 *= beta1
            prod2 *= beta2
        self._product_cache[key] = (step, prod1, prod2)
        return prod1, prod2

    @staticmethod
    def betas_at(step: int, group: dict) -> tuple[float, float]:
        progress = min(step / group["schedule_steps"], 1.0)
        beta1, beta2 = group["betas"]
        beta1_t = beta1 * (1.0 - 0.01 * progress)
        beta2_t = min(beta2 + (group["beta2_final"] - beta2) * progress, 1.0 - 1e-9)
        return beta1_t, beta2_t

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for t, params, grads, exp_avg, exp_avg_sq in _moments_by_step(self, group):
                beta1, beta2 = self.betas_at(t, group)
                prod1, prod2 = self.beta_products(t, group)
                # The per-parameter update, as foreach kernels over the whole group (same arithmetic).
                torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
                torch._foreach_mul_(exp_avg_sq, beta2)
                torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
                correction1 = 1.0 - prod1
                correction2 = 1.0 - prod2
                if wd:
                    torch._foreach_mul_(params, 1 - lr * wd)
                denom = torch._foreach_div(exp_avg_sq, correction2)
                torch._foreach_sqrt_(denom)
                torch._foreach_add_(denom, eps)
                torch._foreach_addcdiv_(params, exp_avg, denom, value=-lr / correction1)
        return loss


def _moments_by_step(optimizer: torch.optim.Optimizer, group: dict):
    """The group's parameters that have gradients, with their Adam moments, batched by step count
    (one batch in practice: parameters step together): (t, params, grads, exp_avg, exp_avg_sq)."""
    by_step: dict[int, list] = {}
    for p in group["params"]:
        if p.grad is None:
            continue
        state, t = _adam_moments(optimizer.state[p], p)
        by_step.setdefault(t, []).append((p, state))
    for t, items in by_step.items():
        yield (t, [p for p, _ in items], [p.grad for p, _ in items], [s["exp_avg"] for _, s in items],
               [s["exp_avg_sq"] for _, s in items])


class LambdaOpt(torch.optim.Optimizer):
    """AdamW moments with a LAMB layer-wise trust ratio ‖p‖/‖u‖ (1 when either norm is 0, clipped to
    max_trust) scaling the update u = m̂ / (√v̂ + eps) + wd · p; docs/train.md ("Optimizers")."""

    def __init__(self, params, lr: float = 3e-4, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, max_trust: float = 10.0):
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"LambdaOpt betas must be in [0, 1), got {betas}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, max_trust=max_trust))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for t, params, grads, exp_avg, exp_avg_sq in _moments_by_step(self, group):
                torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
                torch._foreach_mul_(exp_avg_sq, beta2)
                torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
                denom = torch._foreach_div(exp_avg_sq, 1 - beta2 ** t)
                torch._foreach_sqrt_(denom)
                torch._foreach_add_(denom, eps)
                updates = torch._foreach_div(exp_avg, 1 - beta1 ** t)
                torch._foreach_div_(updates, denom)
                if wd:
                    torch._foreach_add_(updates, params, alpha=wd)
                for p, update in zip(params, updates):
                    weight_norm, update_norm = _full_norm(p), _full_norm(update)
                    trust = torch.where((weight_norm > 0) & (update_norm > 0),
                                        (weight_norm / update_norm).clamp(max=group["max_trust"]),
                                        torch.ones_like(weight_norm))
                    p.add_(update * (-lr * trust).to(update.dtype))
        return loss


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only (not on norms, biases, gate biases)."""
    decay, no_decay, seen = [], [], set()
    for param in model.parameters():
        if id(param) in seen:  # tied embeddings appear once
            continue
        seen.add(id(param))
        (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


@dataclass
class DeepOptConfig(Settings):
    beta2_final: float = Param(0.9999, "β2 rises from optimizer.beta2 to this", Number(0, 1, open_max=True))
    schedule_steps: int = Param(0, "T of the β schedules (0: training.steps)", Integer(min=0))


@dataclass
class LambdaOptConfig(Settings):
    max_trust: float = Param(10.0, "the trust ratio's cap", Number(0, open_min=True))


@dataclass(frozen=True)
class OptimizerRow:
    """`build(groups, common, options, total_steps, device)` → the optimizer; `Config`: its options."""

    build: Callable[..., torch.optim.Optimizer]
    Config: type[Settings] = NoOptions


def _adamw(groups, common, options, total_steps, device):
    # On CUDA torch's fused kernel (one launch per group instead of ~10 per parameter); on CPU the
    # per-parameter loop, whose results are bit-for-bit those of earlier runs and checkpoints.
    kernel = {"fused": True} if device is not None and device.type == "cuda" else {"foreach": False}
    return torch.optim.AdamW(groups, lr=common.lr, betas=(common.beta1, common.beta2), eps=common.eps,
                             weight_decay=common.weight_decay, **kernel)


def _deepopt(groups, common, options: DeepOptConfig, total_steps, device):
    return DeepOpt(groups, lr=common.lr, betas=(common.beta1, common.beta2), beta2_final=options.beta2_final,
                   schedule_steps=options.schedule_steps or total_steps, eps=common.eps,
                   weight_decay=common.weight_decay)


def _lambdaopt(groups, common, options: LambdaOptConfig, total_steps, device):
    return LambdaOpt(groups, lr=common.lr, betas=(common.beta1, common.beta2), eps=common.eps,
                     weight_decay=common.weight_decay, max_trust=options.max_trust)


def _row_problem(row) -> str | None:
    if not isinstance(row, OptimizerRow) or not callable(row.build):
        return f"{row!r} is not a dsdata.train.optim.OptimizerRow(build, Config)"
    return None


# The optimizers by `optimizer.name`; plugins: entry points `dsdata.optimizers`, each an OptimizerRow.
OPTIMIZERS = Registry("optimizer", "dsdata.optimizers", _row_problem, {
    "adamw": OptimizerRow(_adamw), "deepopt": OptimizerRow(_deepopt, DeepOptConfig),
    "lambdaopt": OptimizerRow(_lambdaopt, LambdaOptConfig),
})
DEFAULT_OPTIMIZER = "adamw"


def register_optimizer(name: str, build: Callable[..., torch.optim.Optimizer], config: type[Settings] = NoOptions) -> None:
    """Add an optimizer row (ValueError when the name is taken or the row is malformed)."""
    OPTIMIZERS.register(name, OptimizerRow(build, config))


def build_optimizer(model: nn.Module, config, total_steps: int,
                    device: torch.device | None = None) -> torch.optim.Optimizer:
    """The optimizer named by config.name (config: the [optimizer] table, an OptimizerConfig), weight
    decay on matrices only (`parameter_groups`)."""
    groups = parameter_groups(model, config.weight_decay)
    return OPTIMIZERS[config.name].build(groups, config, config.config, total_steps, device)


class WarmupCosineSchedule:
    """Linear warm-up to the peak lr over `warmup_steps`, then cosine decay to min_ratio · peak."""

    def __init__(self, optimizer: torch.optim.Optimizer, peak_lr: float, warmup_steps: int, decay_steps: int,
                 min_ratio: float = 0.1):
        self.optimizer, self.peak_lr = optimizer, peak_lr
        self.warmup_steps, self.decay_steps, self.min_ratio = max(0, warmup_steps), max(1, decay_steps), min_ratio
        self.step_count = 0
        self._apply()

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        progress = min((step - self.warmup_steps) / self.decay_steps, 1.0)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.peak_lr * (self.min_ratio + (1.0 - self.min_ratio) * cosine)

    def _apply(self) -> None:
        lr = self.lr_at(self.step_count)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        self.step_count += 1
        self._apply()

    def get_last_lr(self) -> float:
        return self.lr_at(self.step_count)

    def state_dict(self) -> dict:
        return {"step_count": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step_count"])
        self._apply()
