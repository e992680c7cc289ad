"""Training configuration: one TOML file (models/*.toml) plus `--set section.key=value` overrides."""
from __future__ import annotations

import copy
import math
import os
import tomllib
from dataclasses import dataclass, field, fields
from typing import Any, get_args, get_type_hints

from dsdata.io.untrusted_files import UntrustedFileError, read_regular_file
from dsdata.report.display import MODES
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
    compile: bool | None = None  # each block through torch.compile (unset: on for CUDA, off on CPU)


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
    # several shard sets mixed by weight instead of one path: [{path, weight | epochs, name?}]
    # (dsdata/train/mixture.py); the curriculum applies inside each source
    sources: list = field(default_factory=list)
    synthetic_vocab: int = 256  # vocabulary of the synthetic source when no path is given


@dataclass
class CheckpointConfig:
    interval: int = 500  # save every N steps (0: only at the end and on SIGTERM)
    keep: int = 3
    dir: str = ""  # default RUN_DIR/checkpoints


@dataclass
class LoggingConfig:
    console_interval: int = 10  # steps between progress lines (0: no progress lines or bar)
    progress: str = "auto"  # auto | bar | lines | off, as `dsdata run --progress`; --progress overrides it
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


@dataclass(frozen=True)
class Bound:
    """A numeric key's allowed range: low (inclusive unless low_open), high (exclusive) or none."""

    low: float
    low_open: bool = False
    high: float | None = None

    def admits(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        return above and (self.high is None or value < self.high)

    def __str__(self) -> str:
        low = f"{'>' if self.low_open else '>='} {self.low:g}"
        return low if self.high is None else f"{low} and < {self.high:g}"


_POSITIVE, _SIZE, _COUNT, _FRACTION = Bound(0, low_open=True), Bound(1), Bound(0), Bound(0, high=1)

# Every numeric key's range: a zero or negative size would otherwise end deep inside torch with a
# traceback.  Keys not listed (seeds) take any integer.
BOUNDS: dict[str, dict[str, Bound]] = {
    "model": {"dim": _SIZE, "n_layers": _SIZE, "n_heads": _SIZE, "n_kv_heads": _SIZE, "vocab_size": _COUNT,
              "ffn_hidden_dim": _COUNT, "multiple_of": _SIZE, "norm_eps": _POSITIVE, "rope_theta": _POSITIVE,
              "max_seq_len": _SIZE, "sparse_top_k": _SIZE, "sparse_window": _SIZE, "sparse_block": _SIZE,
              "sparse_gate_hidden": _SIZE, "sparse_refresh_steps": _SIZE, "lsh_chunk": _SIZE, "lsh_buckets": _COUNT,
              "moe_experts": _COUNT, "moe_top_k": _SIZE, "moe_capacity_factor": _POSITIVE,
              "moe_aux_loss_weight": _COUNT, "init_std": _COUNT},
    "training": {"steps": _SIZE, "seq_len": _SIZE, "global_batch_size": _SIZE, "unfreeze_fraction": _FRACTION,
                 "unfreeze_layers": _COUNT, "threads": _COUNT},
    "optimizer": {"lr": _POSITIVE, "beta1": _FRACTION, "beta2": _FRACTION, "eps": _POSITIVE, "weight_decay": _COUNT,
                  "beta2_final": _FRACTION, "schedule_steps": _COUNT},
    "schedule": {"warmup_steps": _COUNT, "min_lr_ratio": Bound(0, high=1.000001), "decay_steps": _COUNT},
    "precision": {"init_scale": _POSITIVE, "growth_factor": Bound(1), "backoff_factor": Bound(0, True, 1),
                  "growth_interval": _SIZE},
    "clipping": {"max_norm": _POSITIVE, "factor": _POSITIVE, "window": _SIZE, "min_history": _COUNT},
    "data": {"synthetic_vocab": Bound(2)},
    "data.sources": {"weight": _POSITIVE, "epochs": _POSITIVE},  # each source table's numbers
    "checkpoint": {"interval": _COUNT, "keep": _SIZE},
    "logging": {"console_interval": _COUNT, "histogram_interval": _COUNT, "anomaly_window": _SIZE,
                "anomaly_sigma": _POSITIVE},
    "parallel": {"data_parallel_size": _COUNT, "tensor_parallel_size": _SIZE, "pipeline_parallel_size": _SIZE,
                 "micro_batch_size": _COUNT, "gradient_accumulation_steps": _COUNT, "powersgd_rank": _COUNT,
                 "powersgd_start_step": _COUNT},
}


# A trainer config is a page of TOML; a bigger file is not one (and bounds what a bad one costs).
MAX_CONFIG_BYTES = 1 << 20

_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", dict: "a table", list: "an array"}


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
    hints = get_type_hints(cls)
    for key, value in values.items():
        default = getattr(cls(), key)
        # int | None keys (n_kv_heads, ffn_hidden_dim) default to None ("derived"): a given value is an int.
        kind = type(default) if default is not None else next(t for t in get_args(hints[key]) if t is not type(None))
        if kind is bool and not isinstance(value, bool):
            raise ConfigError(f"{source}: {name}.{key} must be true or false, got {value!r}")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ConfigError(f"{source}: {name}.{key} must be {_KIND_NAMES.get(kind, kind.__name__)}, got {value!r}")
        bound = BOUNDS.get(name, {}).get(key)
        if bound is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and bound.admits(value)):
            raise ConfigError(f"{source}: {name}.{key} must be {bound}, got {value!r}")
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
    """The config file (a regular file of at most MAX_CONFIG_BYTES: a FIFO or /dev/zero is one line,
    never a hang or a read without end) with `overrides` applied, checked."""
    if not os.path.lexists(path):
        raise ConfigError(f"{path}: config file not found (see models/*.toml)")
    try:
        raw = tomllib.loads(read_regular_file(path, "config file", MAX_CONFIG_BYTES).decode("utf-8"))
    except UntrustedFileError as exc:
        raise ConfigError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML (not UTF-8 at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    return config_from_dict(apply_overrides(raw, overrides or []), path)


def check_sources(sources: list, source: str) -> None:
    """data.sources: a list of {path, weight | epochs, name?} tables, one kind of share for all."""
    kinds = set()
    for i, item in enumerate(sources):
        where = f"{source}: data.sources[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{where} must be a table {{path = \"…\", weight = …}}, got {item!r}")
        unknown = sorted(set(item) - {"path", "weight", "epochs", "name"})
        if unknown:
            raise ConfigError(f"{where} has unknown key(s) {unknown}; known: ['epochs', 'name', 'path', 'weight']")
        if not isinstance(item.get("path"), str) or not item["path"]:
            raise ConfigError(f"{where}.path must be a shard directory (a `dsdata run` OUT or its shards/)")
        if "name" in item and (not isinstance(item["name"], str) or not item["name"]):
            raise ConfigError(f"{where}.name must be a non-empty string, got {item['name']!r}")
        shares = [key for key in ("weight", "epochs") if key in item]
        if len(shares) != 1:
            raise ConfigError(f"{where} needs exactly one of weight or epochs, got {shares or 'neither'}")
        key = shares[0]
        value, bound = item[key], BOUNDS["data.sources"][key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not bound.admits(value):
            raise ConfigError(f"{where}.{key} must be {bound}, got {value!r}")
        kinds.add(key)
    if len(kinds) > 1:
        raise ConfigError(f"{source}: data.sources mixes weight and epochs; give every source the same one")


def validate(config: Config, source: str) -> None:
    t = config.training
    if config.data.sources:
        if config.data.path:
            raise ConfigError(f"{source}: data.path and data.sources are both set; use one (sources mixes several)")
        check_sources(config.data.sources, source)
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
    if config.logging.progress not in MODES:
        raise ConfigError(f"{source}: logging.progress = {config.logging.progress!r}; choose {', '.join(MODES)}")
    if config.parallel.data_parallel not in ("ddp", "fsdp"):
        raise ConfigError(f"{source}: parallel.data_parallel = {config.parallel.data_parallel!r}; choose ddp or fsdp")
    if config.parallel.pipeline_schedule not in ("gpipe", "1f1b"):
        raise ConfigError(f"{source}: parallel.pipeline_schedule = {config.parallel.pipeline_schedule!r}; choose gpipe or 1f1b")
