"""The training loop: one code path for 1 CPU process, N gloo processes, or N GPUs with nccl.

Per step: draw the global batch → this rank's micro-batches → forward/backward under autocast
(bf16, or fp16 with the loss scaled) → global loss; a non-finite loss redoes the step in fp32 →
unscale → global grad norm (an overflow skips the step and backs the scale off) → dynamic clipping
→ optimizer step → LR schedule → metrics (rank 0) → checkpoint every N steps and on SIGTERM.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import time
from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dsdata.train.batches import build_batches
from dsdata.train.checkpoint import Checkpointer, rng_state, set_rng_state
from dsdata.train.clipping import DynamicGradClipper
from dsdata.train.config import Config, ConfigError
from dsdata.train.distributed import build_layout, init_distributed
from dsdata.train.metrics import LossAnomalyDetector, MetricsWriter
from dsdata.train.model import Transformer, set_training_step
from dsdata.train.optim import WarmupCosineSchedule, build_optimizer
from dsdata.train.precision import DynamicLossScaler, autocast

log = logging.getLogger("dsdata.train")


class _StopFlag:
    """Set by SIGTERM; the loop checkpoints and exits at the next step boundary."""

    def __init__(self):
        self.requested = False

    def __call__(self, signum, frame):
        self.requested = True


def _frozen_parameters(model: torch.nn.Module, config: Config) -> list[torch.nn.Parameter]:
    n_layers = config.model.n_layers
    count = config.training.unfreeze_layers or n_layers // 2
    prefixes = tuple(f"layers.{i}." for i in range(count))
    return [p for name, p in model.named_parameters() if name.startswith(prefixes)]


def train(config: Config, run_dir: str) -> dict:
    """Train (or resume) the run in run_dir; returns a summary dict (on every rank)."""
    env = init_distributed(config.training.device)
    if config.training.threads:
        torch.set_num_threads(config.training.threads)
    layout = build_layout(config, env)
    t = config.training
    total_steps = t.steps

    batches = build_batches(config.data, t.seq_len, total_steps)
    args = config.model
    data_vocab = getattr(batches, "vocab_size", None)
    if args.vocab_size == 0:
        if not data_vocab:
            raise ConfigError("model.vocab_size = 0 means 'from the shards', but the data has no tokenizer "
                              "vocab_size; set model.vocab_size")
        args = replace(args, vocab_size=data_vocab)
    elif data_vocab and data_vocab > args.vocab_size:
        raise ConfigError(f"model.vocab_size ({args.vocab_size}) is smaller than the shards' tokenizer "
                          f"({data_vocab}); set model.vocab_size = {data_vocab} or 0")
    config = replace(config, model=args)

    torch.manual_seed(t.seed)
    model = Transformer(args)
    model_train = layout.parallelize(model)
    optimizer = build_optimizer(model, config.optimizer, total_steps)
    sc = config.schedule
    scheduler = WarmupCosineSchedule(optimizer, config.optimizer.lr, sc.warmup_steps,
                                     sc.decay_steps or max(1, total_steps - sc.warmup_steps), sc.min_lr_ratio)
    pc = config.precision
    scaler = DynamicLossScaler(pc.init_scale, pc.growth_factor, pc.backoff_factor, pc.growth_interval) \
        if t.precision == "fp16" else None
    cc = config.clipping
    clipper = DynamicGradClipper(cc.max_norm, cc.factor, cc.window, cc.min_history, cc.dynamic)
    anomaly = LossAnomalyDetector(config.logging.anomaly_window, config.logging.anomaly_sigma)

    checkpointer = Checkpointer(config.checkpoint.dir or os.path.join(run_dir, "checkpoints"),
                                config.checkpoint.keep, layout)
    metrics = MetricsWriter(run_dir, layout.writes_metrics, config.logging.tensorboard,
                            config.logging.console_interval, total_steps)
    start = 0
    latest = checkpointer.latest()
    if latest is not None:
        state = checkpointer.load(latest, model_train, optimizer)
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        clipper.load_state_dict(state["clipper"])
        anomaly.load_state_dict(state["anomaly"])
        batches.load_state_dict(state["loader"])
        set_rng_state(state["rng"])
        start = int(state["step"])
        metrics.truncate_after(start)
        if layout.writes_metrics:
            log.info("resumed from %s at step %d", checkpointer.path(latest), start)

    def trainer_state(step: int) -> dict:
        return {"step": step, "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict() if scaler else None, "clipper": clipper.state_dict(),
                "anomaly": anomaly.state_dict(), "loader": batches.state_dict(), "rng": rng_state()}

    stop = _StopFlag()
    previous_handler = signal.signal(signal.SIGTERM, stop)
    frozen = _frozen_parameters(model, config) if t.unfreeze_fraction > 0 else []
    frozen_until = int(t.unfreeze_fraction * total_steps)
    params = [p for p in model.parameters() if p.requires_grad]
    vocab = args.vocab_size

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor):
        lm_loss = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))
        aux = model.aux_loss()
        total = lm_loss + args.moe_aux_loss_weight * aux if aux is not None else lm_loss
        return total, lm_loss

    step = start
    last_loss = float("nan")
    try:
        while step < total_steps:
            if _agreed(stop.requested, layout, env):
                checkpointer.save(step, model_train, optimizer, trainer_state(step))
                if layout.writes_metrics:
                    log.warning("SIGTERM: checkpoint saved at step %d; exiting", step)
                break
            began = time.perf_counter()
            set_training_step(model, step)
            micro_batches = layout.local_micro_batches(batches.next_batch(step, t.global_batch_size))
            record_histograms = (layout.writes_metrics and config.logging.histogram_interval
                                 and (step + 1) % config.logging.histogram_interval == 0)
            activations = _capture_activations(model) if record_histograms else None

            precision, retried = t.precision, False
            while True:
                optimizer.zero_grad(set_to_none=True)
                multiplier = scaler.scale if (scaler is not None and precision == "fp16") else 1.0
                local = layout.forward_backward(model_train, micro_batches, loss_fn, multiplier,
                                                lambda p=precision: autocast(p, env.device))
                loss = float(layout.mean_over_data_parallel(local))
                if math.isfinite(loss) or precision == "fp32" or not t.fp32_retry:
                    break
                if layout.writes_metrics:
                    log.warning("step %d: non-finite loss under %s; retrying the step in fp32", step + 1, precision)
                precision, retried = "fp32", True
            if activations is not None:
                activations.remove()

            if step < frozen_until:
                for p in frozen:
                    p.grad = None
            grads = [p.grad for p in params if p.grad is not None]
            if multiplier != 1.0:
                for g in grads:
                    g.div_(multiplier)
            grad_norm = float(layout.grad_norm(grads))
            threshold = clipper.threshold()
            applied = math.isfinite(loss) and math.isfinite(grad_norm)
            if applied:
                clipper.clip(grads, grad_norm)
                clipper.record(grad_norm)
                if record_histograms:
                    metrics.histograms(step + 1, {f"grad/{n}": p.grad for n, p in model.named_parameters()
                                                  if p.grad is not None and not hasattr(p.grad, "to_local")})
                optimizer.step()
            elif layout.writes_metrics:
                log.warning("step %d skipped: %s", step + 1,
                            "gradient overflow (loss scale backed off)" if math.isfinite(loss) else "non-finite loss")
            scale_used = multiplier if scaler is not None else 1.0
            if scaler is not None and precision == "fp16":
                scaler.update(found_overflow=not applied)
            lr = scheduler.get_last_lr()
            scheduler.step()
            step += 1
            last_loss = loss

            elapsed = time.perf_counter() - began
            warning = anomaly.check(loss)
            if layout.writes_metrics:
                if warning:
                    log.warning("step %d: loss anomaly: %s", step, warning)
                record = {"step": step, "loss": _finite_or_none(loss), "lr": lr, "grad_norm": _finite_or_none(grad_norm),
                          "clip_threshold": threshold, "loss_scale": scale_used,
                          "tokens_per_s": t.global_batch_size * t.seq_len / max(elapsed, 1e-9),
                          "skipped": not applied, "fp32_retry": retried}
                aux = model.aux_loss()
                if aux is not None:
                    record["moe_aux_loss"] = float(aux.detach())
                if warning:
                    record["anomaly"] = True
                metrics.write(record)
                if record_histograms:
                    metrics.histograms(step, {f"param/{n}": p for n, p in model.named_parameters()
                                              if not hasattr(p, "to_local")})
                    metrics.histograms(step, activations.values)
            if config.checkpoint.interval and step % config.checkpoint.interval == 0 and step < total_steps:
                checkpointer.save(step, model_train, optimizer, trainer_state(step))
        else:
            if latest != total_steps:
                checkpointer.save(step, model_train, optimizer, trainer_state(step))
            if config.export.enabled:
                _export(config, run_dir, model_train, batches, layout)
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        metrics.close()
    return {"steps": step, "loss": last_loss, "run_dir": run_dir, "vocab_size": vocab}


def _finite_or_none(value: float) -> float | None:
    """JSON has no NaN/inf: a non-finite value is logged as null."""
    return value if math.isfinite(value) else None


def _agreed(flag: bool, layout, env) -> bool:
    """True on every rank when any rank got SIGTERM (all ranks must checkpoint together)."""
    if env.world_size == 1:
        return flag
    value = torch.tensor(1.0 if flag else 0.0, device=env.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class _ActivationCapture:
    """Forward hooks keeping each block's first output of the step (for TensorBoard histograms)."""

    def __init__(self, model):
        self.values: dict[str, torch.Tensor] = {}
        self.handles = []
        for name, block in model.layers.items():
            self.handles.append(block.register_forward_hook(self._hook(f"activation/layer{name}")))

    def _hook(self, name):
        def hook(module, inputs, output):
            if name not in self.values and not hasattr(output, "to_local"):
                self.values[name] = output.detach()
        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _capture_activations(model) -> _ActivationCapture:
    return _ActivationCapture(model)


def _export(config: Config, run_dir: str, model_train, batches, layout) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from dsdata.train.export import export_hf

    if hasattr(layout, "full_model_state_dict"):  # pipeline stages: rank 0 gathers the other stages' weights
        state = layout.full_model_state_dict(model_train)
    else:
        state = get_model_state_dict(model_train, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if layout.writes_metrics:
        tokenizer = None
        dataset = getattr(batches, "dataset", None)
        if dataset is not None:
            info = dataset.manifest.get("tokenizer") or {}
            candidate = info.get("path")
            if candidate and not os.path.isabs(candidate):
                candidate = os.path.join(os.path.dirname(batches.path), candidate)
            tokenizer = candidate if candidate and os.path.exists(candidate) else None
        out = config.export.hf_dir or os.path.join(run_dir, "hf")
        kind = export_hf(state, config.model, out, tokenizer)
        log.info("exported %s model to %s", kind, out)
    layout.barrier()
