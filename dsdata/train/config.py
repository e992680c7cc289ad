"""Training configuration: one TOML file (models/*.toml) plus `--set section.key=value` overrides."""
from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any

from dsdata.train.model import ModelArgs


class ConfigError(ValueError):
    """A configuration mistake the user can fix (printed as one line)."""


@dataclass
class TrainingConfig:
    steps: int = 1000
    seq_len: int = 256
    global_batch_size: int = 32  # sequences per optimizer step, whatever the parallel layout
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "fp32"  # fp32 | bf16 (autocast) | fp16 (autocast + dynamic loss scaling)
    fp32_retry: bool = True  # redo a step in fp32 when its loss is not finite
    unfreeze_fraction: float = 0.0  # progressive unfreezing: lower half frozen for this share of steps (e.g. 0.3)
    unfreeze_layers: int = 0  # how many lower layers are frozen (0: half of them)
    threads: int = 0  # torch.set_num_threads per process on CPU (0: leave torch's default)


@dataclass
class OptimizerConfig:
    name: str = "adamw"  # adamw | deepopt | lambdaopt
    lr: float = 3e-4
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.1
    beta2_final: float = 0.9999  # DeepOpt: β2 rises from beta2 to this (capped below 1)
    schedule_steps: int = 0  # DeepOpt's T for the β schedules (0: training.steps)


@dataclass
class ScheduleConfig:
    warmup_steps: int = 500
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of optimizer.lr
    decay_steps: int = 0  # cosine length after warm-up (0: until training.steps)


@dataclass
class PrecisionConfig:
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000


@dataclass
class ClippingConfig:
    max_norm: float = 1.0  # fixed threshold until `min_history` norms are known
    dynamic: bool = True
    factor: float = 0.8  # threshold = factor × median of the last `window` global norms
    window: int = 100
    min_history: int = 50


@dataclass
class DataConfig:
    path: str = ""  # shard directory of a `dsdata run` (its shards/ folder or the run dir); empty: synthetic
    seed: int = 0
    verify: bool = True
    prefetch: bool = True
    curriculum: dict = field(default_factory=dict)  # spec for dsdata.train.curriculum (empty: none)
    synthetic_vocab: int = 256  # vocabulary of the synthetic source when no path is given


@dataclass
class CheckpointConfig:
    interval: int = 500  # save every N steps (0: only at the end and on SIGTERM)
    keep: int = 3
    dir: str = ""  # default RUN_DIR/checkpoints


@dataclass
class LoggingConfig:
    console_interval: int = 10
    tensorboard: bool = True
    histogram_interval: int = 100  # 0: no histograms
    anomaly_window: int = 100
    anomaly_sigma: float = 3.0


@dataclass
class ParallelConfig:
    """The layout; the global batch is split as data_parallel_size × micro_batch_size × accumulation."""

    data_parallel: str = "ddp"  # ddp | fsdp
    data_parallel_size: int = 0  # 0: world size / (tensor × pipeline)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    pipeline_schedule: str = "1f1b"  # gpipe | 1f1b
    micro_batch_size: int = 0  # 0: derived from gradient_accumulation_steps
    gradient_accumulation_steps: int = 0  # 0: derived from micro_batch_size (both 0: one micro-batch)
    powersgd_rank: int = 0  # >0: DDP gradients compressed with PowerSGD of this rank
    powersgd_start_step: int = 10


@dataclass
class ExportConfig:
    hf_dir: str = ""  # default RUN_DIR/hf; written at the end of training
    enabled: bool = True


SECTIONS = {
    "model": ModelArgs, "training": TrainingConfig, "optimizer": OptimizerConfig, "schedule": ScheduleConfig,
    "precision": PrecisionConfig, "clipping": ClippingConfig, "data": DataConfig, "checkpoint": CheckpointConfig,
    "logging": LoggingConfig, "parallel": ParallelConfig, "export": ExportConfig,
}


@dataclass
class Config:
    model: ModelArgs
    training: TrainingConfig
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    precision: PrecisionConfig
    clipping: ClippingConfig
    data: DataConfig
    checkpoint: CheckpointConfig
    logging: LoggingConfig
    parallel: ParallelConfig
    export: ExportConfig
    source: str = ""


def _parse_value(text: str) -> Any:
    """A TOML value (number, bool, string, array, inline table); bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `section.key=value` (nested keys allowed, e.g. data.curriculum.kind=linear)."""
    raw = copy.deepcopy(raw)
    for item in overrides:
        key, sep, value = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) < 2 or not all(parts):
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. training.steps=40")
        if parts[0] not in SECTIONS:
            raise ConfigError(f"--set {item!r}: unknown section '{parts[0]}' (known: {', '.join(SECTIONS)})")
        node = raw.setdefault(parts[0], {})
        for part in parts[1:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _parse_value(value.strip())
    return raw


def _section(name: str, cls, values: dict[str, Any], source: str):
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: [{name}] must be a table")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"{source}: [{name}] has unknown key(s) {unknown}; known: {sorted(known)}")
    coerced = {}
    for key, value in values.items():
        default = getattr(cls(), key) if name != "model" else getattr(ModelArgs(), key)
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ConfigError(f"{source}: {name}.{key} must be true or false, got {value!r}")
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float) and value.is_integer():
            value = int(value)
        if default is not None and not isinstance(value, type(default)):
            raise ConfigError(f"{source}: {name}.{key} must be a {type(default).__name__}, got {value!r}")
        coerced[key] = value
    try:
        return ModelArgs.from_dict(coerced) if cls is ModelArgs else cls(**coerced)
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def config_from_dict(raw: dict[str, Any], source: str = "<config>") -> Config:
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {unknown}; known: {list(SECTIONS)}")
    parts = {name: _section(name, cls, raw.get(name, {}), source) for name, cls in SECTIONS.items()}
    config = Config(**parts, source=source)
    validate(config, source)
    return config


def load_config(path: str, overrides: list[str] | None = None) -> Config:
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found (see models/*.toml)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    return config_from_dict(apply_overrides(raw, overrides or []), path)


def validate(config: Config, source: str) -> None:
    t = config.training
    if t.precision not in ("fp32", "bf16", "fp16"):
        raise ConfigError(f"{source}: training.precision = {t.precision!r}; choose fp32, bf16 or fp16")
    if t.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"{source}: training.device = {t.device!r}; choose auto, cpu or cuda")
    if t.seq_len > config.model.max_seq_len:
        raise ConfigError(f"{source}: training.seq_len ({t.seq_len}) exceeds model.max_seq_len ({config.model.max_seq_len})")
    if t.steps < 1 or t.global_batch_size < 1:
        raise ConfigError(f"{source}: training.steps and training.global_batch_size must be >= 1")
    if not 0.0 <= t.unfreeze_fraction < 1.0:
        raise ConfigError(f"{source}: training.unfreeze_fraction must be in [0, 1)")
    if config.optimizer.name not in ("adamw", "deepopt", "lambdaopt"):
        raise ConfigError(f"{source}: optimizer.name = {config.optimizer.name!r}; choose adamw, deepopt or lambdaopt")
    if config.parallel.data_parallel not in ("ddp", "fsdp"):
        raise ConfigError(f"{source}: parallel.data_parallel = {config.parallel.data_parallel!r}; choose ddp or fsdp")
    if config.parallel.pipeline_schedule not in ("gpipe", "1f1b"):
        raise ConfigError(f"{source}: parallel.pipeline_schedule = {config.parallel.pipeline_schedule!r}; choose gpipe or 1f1b")
