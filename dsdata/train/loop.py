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

from dsdata.stop_signals import STOP_SIGNALS
from dsdata.train.batches import build_batches
from dsdata.train.checkpoint import STATE_FILE, CheckpointError, Checkpointer, GlobalRng
from dsdata.train.clipping import DynamicGradClipper, scale_gradients
from dsdata.train.config import Config, ConfigError
from dsdata.train.distributed import init_distributed
from dsdata.train.metrics import LossAnomalyDetector, MetricsWriter
from dsdata.train.model import Transformer, compile_blocks, lm_cross_entropy, set_training_step
from dsdata.train.optim import WarmupCosineSchedule, build_optimizer
from dsdata.train.parallel.collectives import any_rank
from dsdata.train.parallel.layout import build_layout
from dsdata.train.precision import DynamicLossScaler, autocast

log = logging.getLogger("dsdata.train")


def train(config: Config, run_dir: str) -> dict:
    """Train (or resume) the run in run_dir; returns a summary dict (on every rank)."""
    return Trainer(config, run_dir).run()


class Trainer:
    """One run: the model, its layout and everything that carries state across steps."""

    def __init__(self, config: Config, run_dir: str):
        self.run_dir = run_dir
        self.env = init_distributed(config.training.device)
        if config.training.threads:
            torch.set_num_threads(config.training.threads)
        self.layout = build_layout(config, self.env)
        t = config.training
        self.batches = build_batches(config.data, t.seq_len, t.steps, t.global_batch_size)
        self.config = config = replace(config, model=_model_args_for_data(config, self.batches))

        torch.manual_seed(t.seed)
        self.model = Transformer(config.model)
        self.parameter_count = sum(p.numel() for p in self.model.parameters())  # before a layout splits it
        self.model_train = self.layout.parallelize(self.model)
        self.compiled = t.compile if t.compile is not None else self.env.device.type == "cuda"
        self._lm_loss = lm_cross_entropy
        if self.compiled:
            compile_blocks(self.model)
            if not self.layout.vocab_parallel:  # loss_parallel's DTensor logits stay eager
                self._lm_loss = torch.compile(lm_cross_entropy)
        self.optimizer = build_optimizer(self.model, config.optimizer, t.steps, self.env.device)
        sc = config.schedule
        self.scheduler = WarmupCosineSchedule(self.optimizer, config.optimizer.lr, sc.warmup_steps,
                                              sc.decay_steps or max(1, t.steps - sc.warmup_steps), sc.min_lr_ratio)
        pc = config.precision
        self.scaler = (DynamicLossScaler(pc.init_scale, pc.growth_factor, pc.backoff_factor, pc.growth_interval)
                       if t.precision == "fp16" else None)
        cc = config.clipping
        self.clipper = DynamicGradClipper(cc.max_norm, cc.factor, cc.window, cc.min_history, cc.dynamic)
        self.anomaly = LossAnomalyDetector(config.logging.anomaly_window, config.logging.anomaly_sigma)
        self.checkpointer = Checkpointer(config.checkpoint.dir or os.path.join(run_dir, "checkpoints"),
                                         config.checkpoint.keep, self.layout)
        self.metrics = MetricsWriter(run_dir, self.layout.writes_metrics, config.logging.tensorboard,
                                     config.logging.console_interval, t.steps, config.logging.progress)
        self.step = 0
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.frozen = _lower_layer_parameters(self.model, config) if t.unfreeze_fraction > 0 else []
        self.frozen_until = int(t.unfreeze_fraction * t.steps)

    def _checkpointed(self) -> dict[str, object]:
        """What a checkpoint carries besides model and optimizer (DCP), in trainer_state.json: save and
        load both read this one list.  None: not used by this run (no loss scaler in fp32)."""
        return {"scheduler": self.scheduler, "scaler": self.scaler, "clipper": self.clipper,
                "anomaly": self.anomaly, "loader": self.batches, "rng": GlobalRng()}

    def state_dict(self) -> dict:
        return {"step": self.step,
                **{name: (part.state_dict() if part is not None else None) for name, part in self._checkpointed().items()}}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        for name, part in self._checkpointed().items():
            if part is None or (part is self.scaler and state.get(name) is None):  # fp16 after fp32: a fresh scaler
                continue
            part.load_state_dict(state[name])

    def save_checkpoint(self) -> None:
        self.checkpointer.save(self.step, self.model_train, self.optimizer, self.state_dict())

    def resume(self) -> int | None:
        """Load the newest complete checkpoint, if any; returns its step."""
        latest = self.checkpointer.latest()
        if latest is not None:
            state = self.checkpointer.load(latest, self.model_train, self.optimizer)
            try:
                self.load_state_dict(state)
            except (KeyError, TypeError, ValueError) as exc:
                raise CheckpointError(f"checkpoint {self.checkpointer.path(latest)}: {STATE_FILE} does not fit "
                                      f"this run ({type(exc).__name__}: {exc})") from None
            self.metrics.truncate_after(self.step)
            if self.layout.writes_metrics:
                log.info("resumed from %s at step %d", self.checkpointer.path(latest), self.step)
        return latest

    def describe(self) -> list[str]:
        """The run's set-up, logged at the start (rank 0)."""
        t, args, env = self.config.training, self.config.model, self.env
        processes = f"{env.world_size} process{'es' if env.world_size > 1 else ''}"
        backend = f" ({env.backend})" if env.backend else ""
        data = (f"{self.batches.path} ({args.vocab_size}-token vocabulary)" if self.config.data.path
                else f"synthetic stream ({args.vocab_size}-token vocabulary; set data.path for shards)")
        if self.config.data.sources:
            data = ", ".join(f"{n} {w:.3f}" for n, w in zip(self.batches.names, self.batches.weights))
            data = f"mixture of {len(self.batches.names)} shard sets ({data}; {args.vocab_size}-token vocabulary)"
        variant = args.attention + (f", MoE {args.moe_experts} experts" if args.moe_experts else "")
        return [f"run {self.run_dir}: {processes}{backend} on {env.device}, layout {self.layout.describe()}",
                f"model {_count(self.parameter_count)} parameters ({args.n_layers} layers, dim {args.dim}, {variant}), "
                f"{t.precision}, optimizer {self.config.optimizer.name}, {'compiled blocks' if self.compiled else 'eager'}",
                f"data {data}; {t.global_batch_size} × {t.seq_len} = {t.global_batch_size * t.seq_len} tokens per step, "
                f"{t.steps} steps"]

    def run(self) -> dict:
        total = self.config.training.steps
        finished = self.checkpointer.latest()
        if finished is not None and finished >= total:
            return self._already_complete(finished)
        if self.layout.writes_metrics:
            for line in self.describe():
                log.info("%s", line)
        latest = self.resume()
        stop = _StopFlag()
        previous_handlers = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
        last_loss = float("nan")
        stopped_by = None
        try:
            while self.step < total:
                if any_rank(stop.requested, self.env):
                    self.save_checkpoint()
                    stopped_by = stop.name or "SIGTERM"  # another rank's signal: torchrun forwards SIGTERM
                    break
                record = self.train_step()
                last_loss = record["loss"] if record["loss"] is not None else float("nan")
                interval = self.config.checkpoint.interval
                if interval and self.step % interval == 0 and self.step < total:
                    self.save_checkpoint()
            else:
                if latest != total:
                    self.save_checkpoint()
                if self.config.export.enabled:
                    self.export()
        finally:
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
            self.metrics.close()
            self.batches.close()
        if stopped_by:
            return self._summary(last_loss, stopped_by=stopped_by,
                                 checkpoint=self.checkpointer.path(self.step))
        return self._summary(last_loss)

    def _summary(self, loss: float | None, **extra) -> dict:
        return {"steps": self.step, "loss": _finite_or_none(loss) if loss is not None else None,
                "run_dir": self.run_dir, "vocab_size": self.config.model.vocab_size, "compiled": self.compiled,
                **extra}

    def _already_complete(self, step: int) -> dict:
        """A finished run started again: nothing is trained, saved or exported."""
        self.step = step
        if self.layout.writes_metrics:
            log.info("already complete at step %d (checkpoint %s); nothing to train or export — use another "
                     "--run-dir or raise training.steps to continue", step, self.checkpointer.path(step))
        last = self.metrics.last_record() if self.layout.writes_metrics else None
        self.metrics.close()
        self.batches.close()
        return self._summary(last.get("loss") if isinstance(last, dict) else None, already_complete=True)

    def train_step(self) -> dict:
        """One optimizer step (the module docstring's line); returns the step's metrics record."""
        t, layout = self.config.training, self.layout
        began = time.perf_counter()
        set_training_step(self.model, self.step)
        micro_batches = layout.local_micro_batches(self.batches.next_batch(self.step))
        histograms = bool(layout.writes_metrics and self.config.logging.histogram_interval
                          and (self.step + 1) % self.config.logging.histogram_interval == 0)
        activations = _ActivationCapture(self.model) if histograms else None

        loss, grad_norm, precision, multiplier, grads = self._forward_backward(micro_batches)
        if activations is not None:
            activations.remove()
        threshold = self.clipper.threshold()
        applied = math.isfinite(loss) and math.isfinite(grad_norm)
        if applied:
            self.clipper.clip(grads, grad_norm)
            self.clipper.record(grad_norm)
            if histograms:
                self.metrics.histograms(self.step + 1, {f"grad/{n}": p.grad for n, p in self.model.named_parameters()
                                                        if p.grad is not None and not _is_dtensor(p.grad)})
            self.optimizer.step()
        elif layout.writes_metrics:
            log.warning("step %d skipped: %s", self.step + 1,
                        "gradient overflow (loss scale backed off)" if math.isfinite(loss) else "non-finite loss")
        if self.scaler is not None and precision == "fp16":
            self.scaler.update(found_overflow=not applied)
        lr = self.scheduler.get_last_lr()
        self.scheduler.step()
        self.step += 1

        record = {"step": self.step, "loss": _finite_or_none(loss), "lr": lr, "grad_norm": _finite_or_none(grad_norm),
                  "clip_threshold": threshold, "loss_scale": multiplier if self.scaler is not None else 1.0,
                  "tokens_per_s": t.global_batch_size * t.seq_len / max(time.perf_counter() - began, 1e-9),
                  "skipped": not applied, "fp32_retry": precision != t.precision}
        record.update(self.batches.step_metrics())  # data.sources: the realised mix so far (mix/<name>)
        self._log_step(record, loss, activations)
        return record

    def _unscaled_gradients(self, multiplier: float) -> list[torch.Tensor]:
        """The gradients to clip and apply: frozen layers' dropped (progressive unfreezing), the loss scale removed."""
        if self.step < self.frozen_until:
            for p in self.frozen:
                p.grad = None
        grads = [p.grad for p in self.params if p.grad is not None]
        if multiplier != 1.0:
            scale_gradients(grads, 1.0 / multiplier)
        return grads

    def _log_step(self, record: dict, loss: float, activations: "_ActivationCapture | None") -> None:
        """Loss-anomaly check (every rank: its history is checkpointed), then metrics.jsonl, TensorBoard, console."""
        warning = self.anomaly.check(loss)
        if not self.layout.writes_metrics:
            return
        if warning:
            log.warning("step %d: loss anomaly: %s", self.step, warning)
        aux = self.model.aux_loss()
        if aux is not None:
            record["moe_aux_loss"] = float(aux.detach())
        if warning:
            record["anomaly"] = True
        self.metrics.write(record)
        if activations is not None:
            self.metrics.histograms(self.step, {f"param/{n}": p for n, p in self.model.named_parameters()
                                                if not _is_dtensor(p)})
            self.metrics.histograms(self.step, activations.values)

    def _forward_backward(self, micro_batches: list[torch.Tensor]):
        """(global loss, global grad norm, precision used, loss multiplier, unscaled gradients); one
        host sync reads loss and norm, and a non-finite loss under bf16/fp16 is redone in fp32."""
        t = self.config.training
        precision = t.precision
        while True:
            self.optimizer.zero_grad(set_to_none=True)
            multiplier = self.scaler.scale if (self.scaler is not None and precision == "fp16") else 1.0
            local = self.layout.forward_backward(self.model_train, micro_batches, self._loss, multiplier,
                                                 lambda p=precision: autocast(p, self.env.device))
            loss_t = self.layout.mean_over_data_parallel(local)
            grads = self._unscaled_gradients(multiplier)
            norm_t = self.layout.grad_norm(grads)
            loss, grad_norm = torch.stack([loss_t.detach().float().reshape(()),
                                           norm_t.detach().float().reshape(())]).tolist()
            if math.isfinite(loss) or precision == "fp32" or not t.fp32_retry:
                return loss, grad_norm, precision, multiplier, grads
            if self.layout.writes_metrics:
                log.warning("step %d: non-finite loss under %s; retrying the step in fp32", self.step + 1, precision)
            precision = "fp32"

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to differentiate: LM loss + weighted MoE balance loss, LM loss to report)."""
        args = self.config.model
        lm_loss = self._lm_loss(logits, targets)
        aux = self.model.aux_loss()
        total = lm_loss + args.moe_aux_loss_weight * aux if aux is not None else lm_loss
        return total, lm_loss

    def export(self) -> None:
        """The Hugging Face directory (rank 0), from the whole model gathered over the layout."""
        from dsdata.train.export import export_hf

        state = self.layout.full_model_state_dict(self.model_train)
        if self.layout.writes_metrics:
            out = self.config.export.hf_dir or os.path.join(self.run_dir, "hf")
            tokenizer, eos_id = _shard_tokenizer(self.batches)
            kind = export_hf(state, self.config.model, out, tokenizer, eos_id)
            log.info("exported %s model to %s", kind, out)
        self.layout.barrier()


def _model_args_for_data(config: Config, batches):
    """model.vocab_size = 0 takes the shards' tokenizer vocabulary; a smaller one than the data's is refused."""
    args = config.model
    data_vocab = batches.vocab_size
    if args.vocab_size == 0:
        if not data_vocab:
            raise ConfigError("model.vocab_size = 0 means 'from the shards', but the data has no tokenizer "
                              "vocab_size; set model.vocab_size")
        return replace(args, vocab_size=data_vocab)
    if data_vocab and data_vocab > args.vocab_size:
        raise ConfigError(f"model.vocab_size ({args.vocab_size}) is smaller than the shards' tokenizer "
                          f"({data_vocab}); set model.vocab_size = {data_vocab} or 0")
    return args


def _lower_layer_parameters(model: torch.nn.Module, config: Config) -> list[torch.nn.Parameter]:
    """The parameters progressive unfreezing holds fixed: the lower unfreeze_layers (default half)."""
    count = config.training.unfreeze_layers or config.model.n_layers // 2
    prefixes = tuple(f"layers.{i}." for i in range(count))
    return [p for name, p in model.named_parameters() if name.startswith(prefixes)]


def _shard_tokenizer(batches) -> tuple[str | None, int | None]:
    """(the shards' tokenizer named by their manifest, the manifest's end-of-document id).  The manifest
    is untrusted and the export copies the tokenizer out, so a tokenizer.json is used only when its
    sha256 is the manifest's (a manifest naming ~/.aws/credentials.json cannot know that hash)."""
    shards = batches.tokenizer()
    if shards is None:
        return None, None
    info, base = shards
    eos_id = info.get("eos_id")
    candidate = info.get("path")
    if not isinstance(candidate, str) or not candidate or "\x00" in candidate:
        return None, eos_id
    if not os.path.isabs(candidate):
        # relative to the shard directory (a bundled tokenizer is "tokenizer": dsdata/shards/tokenizer.py)
        base = base if os.path.isdir(base) else os.path.dirname(base)
        candidate = os.path.join(base, candidate)
    if not os.path.exists(candidate):
        return None, eos_id
    json_path = candidate if os.path.isfile(candidate) else os.path.join(candidate, "tokenizer.json")
    recorded = info.get("sha256")
    # A tokenizer.json there, or a hash recorded: both must be there and agree.
    if os.path.isfile(json_path) or recorded:
        from dsdata.io.outfiles import file_sha256

        if not (os.path.isfile(json_path) and isinstance(recorded, str) and file_sha256(json_path) == recorded):
            log.warning("export: the tokenizer the shards' manifest names (%s) is not the one they were written "
                        "with (its sha256 differs from the manifest's); the exported model has no tokenizer",
                        json_path)
            return None, eos_id
    return candidate, eos_id


def _count(n: int) -> str:
    """12,345 / 1.23M / 1.01B."""
    return f"{n:,}" if n < 1_000_000 else f"{n / 1e6:.2f}M" if n < 1_000_000_000 else f"{n / 1e9:.2f}B"


def _finite_or_none(value: float) -> float | None:
    """JSON has no NaN/inf: a non-finite value is logged as null."""
    return value if math.isfinite(value) else None


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


class _StopFlag:
    """Set by SIGINT or SIGTERM; the loop checkpoints and exits at the next step boundary (a second
    signal while it saves changes nothing)."""

    def __init__(self):
        self.requested = False
        self.name = ""

    def __call__(self, signum, frame):
        if not self.requested:
            self.requested, self.name = True, signal.Signals(signum).name


class _ActivationCapture:
    """Forward hooks keeping each block's first output of the step (for TensorBoard histograms)."""

    def __init__(self, model):
        self.values: dict[str, torch.Tensor] = {}
        self.handles = [block.register_forward_hook(self._hook(f"activation/layer{name}"))
                        for name, block in model.layers.items()]

    def _hook(self, name):
        def hook(module, inputs, output):
            if name not in self.values and not _is_dtensor(output):
                self.values[name] = output.detach()
        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()
