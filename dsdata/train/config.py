"""Training configuration: one TOML file (models/*.toml) plus `--set section.key=value` overrides.

Every table is a settings dataclass (dsdata/train/settings.py): each field declares its range or
choices, and `settings.parse` reads and checks them all the same way.  `model.attention_config` and
`optimizer.config` hold the options of the attention kernel and the optimizer that `model.attention`
and `optimizer.name` pick (a row of `attention.ATTENTION_KERNELS` / `optim.OPTIMIZERS`).
"""
from __future__ import annotations

import copy
import math
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from dsdata.core.display import MODES
from dsdata.io.untrusted_files import UntrustedFileError, read_regular_file
from dsdata.train.curriculum import MAX_SHARE
from dsdata.train.model import ModelArgs
from dsdata.train.optim import DEFAULT_OPTIMIZER, OPTIMIZERS
from dsdata.train.settings import (ANY_INTEGER, COUNT, FRACTION, POSITIVE, SIZE, Bound, ConfigError, Settings,
                                   options_for, parse, setting)


@dataclass
class TrainingConfig(Settings):
    steps: int = setting(1000, SIZE)
    seq_len: int = setting(256, SIZE)
    global_batch_size: int = setting(32, SIZE)  # sequences per optimizer step, whatever the parallel layout
    seed: int = setting(0, ANY_INTEGER)
    device: str = setting("auto", choices=("auto", "cpu", "cuda"))
    # fp32 | bf16 (autocast) | fp16 (autocast + dynamic loss scaling)
    precision: str = setting("fp32", choices=("fp32", "bf16", "fp16"))
    fp32_retry: bool = True  # redo a step in fp32 when its loss is not finite
    # progressive unfreezing: lower half frozen for this share of steps (e.g. 0.3)
    unfreeze_fraction: float = setting(0.0, FRACTION)
    unfreeze_layers: int = setting(0, COUNT)  # how many lower layers are frozen (0: half of them)
    threads: int = setting(0, COUNT)  # torch.set_num_threads per process on CPU (0: leave torch's default)
    compile: bool | None = None  # each block through torch.compile (unset: on for CUDA, off on CPU)


@dataclass
class OptimizerConfig(Settings):
    """The optimizer (a row of optim.OPTIMIZERS), the hyperparameters they all take, and its own options."""

    name: str = setting(DEFAULT_OPTIMIZER, choices=OPTIMIZERS)
    config: Settings | None = options_for(OPTIMIZERS, "name")  # [optimizer.config]: the named optimizer's options
    lr: float = setting(3e-4, POSITIVE)
    beta1: float = setting(0.9, FRACTION)
    beta2: float = setting(0.999, FRACTION)
    eps: float = setting(1e-8, POSITIVE)
    weight_decay: float = setting(0.1, COUNT)

    def __post_init__(self):
        if self.config is None and self.name in OPTIMIZERS:
            self.config = OPTIMIZERS[self.name].Config()


@dataclass
class ScheduleConfig(Settings):
    warmup_steps: int = setting(500, COUNT)
    min_lr_ratio: float = setting(0.1, Bound(0, high=1.000001))  # cosine floor as a fraction of optimizer.lr
    decay_steps: int = setting(0, COUNT)  # cosine length after warm-up (0: until training.steps)


@dataclass
class PrecisionConfig(Settings):
    init_scale: float = setting(65536.0, POSITIVE)
    growth_factor: float = setting(2.0, Bound(1))
    backoff_factor: float = setting(0.5, Bound(0, True, 1))
    growth_interval: int = setting(2000, SIZE)


@dataclass
class ClippingConfig(Settings):
    max_norm: float = setting(1.0, POSITIVE)  # fixed threshold until `min_history` norms are known
    dynamic: bool = True
    factor: float = setting(0.8, POSITIVE)  # threshold = factor × median of the last `window` global norms
    window: int = setting(100, SIZE)
    min_history: int = setting(50, COUNT)


@dataclass
class DataConfig(Settings):
    path: str = ""  # shard directory of a `dsdata run` (its shards/ folder or the run dir); empty: synthetic
    seed: int = setting(0, COUNT)  # a seed < 0 is refused by numpy's generators
    verify: bool = True
    prefetch: bool = True
    curriculum: dict = field(default_factory=dict)  # spec for dsdata.train.curriculum (empty: none)
    # several shard sets mixed by weight instead of one path: [{path, weight | epochs, name?}]
    # (dsdata/train/mixture.py); the curriculum applies inside each source
    sources: list = field(default_factory=list)
    synthetic_vocab: int = setting(256, Bound(2))  # vocabulary of the synthetic source when no path is given


@dataclass
class CheckpointConfig(Settings):
    interval: int = setting(500, COUNT)  # save every N steps (0: only at the end and on SIGTERM)
    keep: int = setting(3, SIZE)
    dir: str = ""  # default RUN_DIR/checkpoints


@dataclass
class LoggingConfig(Settings):
    console_interval: int = setting(10, COUNT)  # steps between progress lines (0: no progress lines or bar)
    # auto | bar | lines | off, as `dsdata run --progress`; --progress overrides it
    progress: str = setting("auto", choices=MODES)
    tensorboard: bool = True
    histogram_interval: int = setting(100, COUNT)  # 0: no histograms
    anomaly_window: int = setting(100, SIZE)
    anomaly_sigma: float = setting(3.0, POSITIVE)


@dataclass
class ParallelConfig(Settings):
    """The layout; the global batch is split as data_parallel_size × micro_batch_size × accumulation."""

    data_parallel: str = setting("ddp", choices=("ddp", "fsdp"))
    data_parallel_size: int = setting(0, COUNT)  # 0: world size / (tensor × pipeline)
    tensor_parallel_size: int = setting(1, SIZE)
    pipeline_parallel_size: int = setting(1, SIZE)
    pipeline_schedule: str = setting("1f1b", choices=("gpipe", "1f1b"))
    micro_batch_size: int = setting(0, COUNT)  # 0: derived from gradient_accumulation_steps
    # 0: derived from micro_batch_size (both 0: one micro-batch)
    gradient_accumulation_steps: int = setting(0, COUNT)
    powersgd_rank: int = setting(0, COUNT)  # >0: DDP gradients compressed with PowerSGD of this rank
    powersgd_start_step: int = setting(10, COUNT)


@dataclass
class ExportConfig(Settings):
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


# data.sources tables: each share's range (checked by check_sources: a source is a plain table).  Relative
# shares, bounded so that their sum (and epochs × a source's tokens) stays a finite float; 1e308
# overflowed into a silently wrong mix.
_SHARE = Bound(0, low_open=True, high=MAX_SHARE)
SOURCE_SHARES = {"weight": _SHARE, "epochs": _SHARE}


# A trainer config is a page of TOML; a bigger file is not one (and bounds what a bad one costs).
MAX_CONFIG_BYTES = 1 << 20


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
        node = raw
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(parts[:depth + 1])} is a value, not a table")
        node[parts[-1]] = _parse_value(value.strip())
    return raw


def config_from_dict(raw: dict[str, Any], source: str = "<config>") -> Config:
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {unknown}; known: {list(SECTIONS)}")
    try:
        parts = {name: parse(cls, raw.get(name, {}), name) for name, cls in SECTIONS.items()}
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
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
        value, bound = item[key], SOURCE_SHARES[key]
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
    if config.data.curriculum and isinstance(config.data.curriculum, dict) \
            and not config.data.curriculum.get("weights_from"):
        from dsdata.train.curriculum import schedule_from_spec

        try:  # its numbers now, not at the first batch (the corpus mix it may default to is read then)
            schedule_from_spec(config.data.curriculum, t.steps, natural={"easy": 1.0})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: data.curriculum: {exc}") from None
    if t.seq_len > config.model.max_seq_len:
        raise ConfigError(f"{source}: training.seq_len ({t.seq_len}) exceeds model.max_seq_len ({config.model.max_seq_len})")

