"""Training configuration: one TOML file (models/*.toml) plus `--set section.key=value` overrides.
Every table is a `Settings` dataclass of `Param`s (dsdata/core/params.py): a bad value is one line
naming TABLE.KEY.  `model.attention_config` / `optimizer.config` hold the selected row's options.
"""
from __future__ import annotations

import copy
import os
import tomllib
from dataclasses import dataclass
from typing import Any

from dsdata.core.display import MODES
from dsdata.core.params import (Boolean, Choice, ConfigError, Integer, ListOf, MappingOf, Number, Options, Param,
                                ParamType, Settings, Text, near_miss, parse)
from dsdata.io.untrusted_files import UntrustedFileError, read_regular_file
from dsdata.train.curriculum import MAX_SHARE
from dsdata.train.model import ModelArgs
from dsdata.train.optim import DEFAULT_OPTIMIZER, OPTIMIZERS

SIZE, COUNT, POSITIVE = Integer(min=1), Integer(min=0), Number(0, open_min=True)
FRACTION = Number(0, 1, open_max=True)
SHARE = Number(0, MAX_SHARE, open_min=True, open_max=True)  # a data.sources weight or epochs
SHARD_DIR = "a shard directory (a `dsdata run` OUT or its shards/)"


@dataclass
class TrainingConfig(Settings):
    steps: int = Param(1000, "optimizer steps", SIZE)
    seq_len: int = Param(256, "tokens per sequence", SIZE)
    global_batch_size: int = Param(32, "sequences per optimizer step, whatever the parallel layout", SIZE)
    seed: int = Param(0, "seed of the initial weights", Integer())
    device: str = Param("auto", "where to train", Choice(("auto", "cpu", "cuda")))
    precision: str = Param("fp32", "bf16: autocast; fp16: autocast + dynamic loss scaling",
                           Choice(("fp32", "bf16", "fp16")))
    fp32_retry: bool = Param(True, "redo a step in fp32 when its loss is not finite", Boolean())
    unfreeze_fraction: float = Param(0.0, "progressive unfreezing: the lower layers are frozen for this share of "
                                     "steps", FRACTION)
    unfreeze_layers: int = Param(0, "how many lower layers are frozen (0: half of them)", COUNT)
    threads: int = Param(0, "torch.set_num_threads per process on CPU (0: torch's default)", COUNT)
    compile: bool | None = Param(None, "each block through torch.compile (unset: on for CUDA, off on CPU)", Boolean())


@dataclass
class OptimizerConfig(Settings):
    """The optimizer (a row of optim.OPTIMIZERS), the hyperparameters they all take, and its own options."""

    name: str = Param(DEFAULT_OPTIMIZER, "a row of optim.OPTIMIZERS", Choice(OPTIMIZERS))
    config: Settings | None = Param(None, "[optimizer.config]: the named optimizer's options",
                                    Options(OPTIMIZERS, "name"))
    lr: float = Param(3e-4, "peak learning rate", POSITIVE)
    beta1: float = Param(0.9, "first-moment decay", FRACTION)
    beta2: float = Param(0.999, "second-moment decay", FRACTION)
    eps: float = Param(1e-8, "added to the second moment's root", POSITIVE)
    weight_decay: float = Param(0.1, "decoupled weight decay of the matrices", Number(0))


@dataclass
class ScheduleConfig(Settings):
    warmup_steps: int = Param(500, "linear warm-up", COUNT)
    min_lr_ratio: float = Param(0.1, "cosine floor as a fraction of optimizer.lr", Number(0, 1))
    decay_steps: int = Param(0, "cosine length after warm-up (0: until training.steps)", COUNT)


@dataclass
class PrecisionConfig(Settings):
    init_scale: float = Param(65536.0, "fp16: the first loss scale", POSITIVE)
    growth_factor: float = Param(2.0, "fp16: the scale grows by this", Number(1))
    backoff_factor: float = Param(0.5, "fp16: and shrinks by this", Number(0, 1, open_min=True, open_max=True))
    growth_interval: int = Param(2000, "fp16: steps without overflow before the scale grows", SIZE)


@dataclass
class ClippingConfig(Settings):
    max_norm: float = Param(1.0, "fixed threshold until `min_history` norms are known", POSITIVE)
    dynamic: bool = Param(True, "threshold from the recent global norms", Boolean())
    factor: float = Param(0.8, "threshold = factor × median of the last `window` global norms", POSITIVE)
    window: int = Param(100, "global norms remembered", SIZE)
    min_history: int = Param(50, "norms known before the dynamic threshold applies", COUNT)


@dataclass
class DataConfig(Settings):
    path: str = Param("", "shard directory of a `dsdata run` (its shards/ folder or the run dir); empty: synthetic",
                      Text())
    seed: int = Param(0, "data order", COUNT)  # a seed < 0 is refused by numpy's generators
    verify: bool = Param(True, "check the shards' checksums before training", Boolean())
    prefetch: bool = Param(True, "read the next batch while a step runs", Boolean())
    curriculum: dict = Param({}, "spec for dsdata.train.curriculum (empty: none)", MappingOf(Text(), expect="a table"))
    # [{path, weight | epochs, name?}] instead of one path (mixture.py; checked by check_sources)
    sources: list = Param([], "several shard sets mixed by weight", ListOf(ParamType()))
    synthetic_vocab: int = Param(256, "vocabulary of the synthetic source when no path is given", Integer(min=2))


@dataclass
class CheckpointConfig(Settings):
    interval: int = Param(500, "save every N steps (0: only at the end and on SIGTERM)", COUNT)
    keep: int = Param(3, "checkpoints kept", SIZE)
    dir: str = Param("", "default RUN_DIR/checkpoints", Text())


@dataclass
class LoggingConfig(Settings):
    console_interval: int = Param(10, "steps between progress lines (0: no progress lines or bar)", COUNT)
    progress: str = Param("auto", "as `dsdata run --progress`; --progress overrides it", Choice(MODES))
    tensorboard: bool = Param(True, "write TensorBoard events", Boolean())
    histogram_interval: int = Param(100, "steps between weight histograms (0: none)", COUNT)
    anomaly_window: int = Param(100, "losses the anomaly detector remembers", SIZE)
    anomaly_sigma: float = Param(3.0, "a loss this many σ above their mean is an anomaly", POSITIVE)


@dataclass
class ParallelConfig(Settings):
    """The layout; the global batch is split as data_parallel_size × micro_batch_size × accumulation."""

    data_parallel: str = Param("ddp", "how the data-parallel replicas hold the weights", Choice(("ddp", "fsdp")))
    data_parallel_size: int = Param(0, "0: world size / (tensor × pipeline)", COUNT)
    tensor_parallel_size: int = Param(1, "tensor-parallel ranks", SIZE)
    pipeline_parallel_size: int = Param(1, "pipeline stages", SIZE)
    pipeline_schedule: str = Param("1f1b", "pipeline schedule", Choice(("gpipe", "1f1b")))
    micro_batch_size: int = Param(0, "0: derived from gradient_accumulation_steps", COUNT)
    gradient_accumulation_steps: int = Param(0, "0: derived from micro_batch_size (both 0: one micro-batch)", COUNT)
    powersgd_rank: int = Param(0, ">0: DDP gradients compressed with PowerSGD of this rank", COUNT)
    powersgd_start_step: int = Param(10, "uncompressed steps before PowerSGD", COUNT)


@dataclass
class ExportConfig(Settings):
    hf_dir: str = Param("", "default RUN_DIR/hf; written at the end of training", Text())
    enabled: bool = Param(True, "export at the end of training", Boolean())


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


@dataclass
class SourceConfig(Settings):
    """One of data.sources: a shard set and its share of the mix, a weight or epochs of its tokens
    (bounded by MAX_SHARE, see curriculum.py)."""

    path: str = Param("", "shard directory", Text(nonempty=True, expect=SHARD_DIR))
    weight: float | None = Param(None, "relative share", SHARE)
    epochs: float | None = Param(None, "passes over its tokens", SHARE)
    name: str | None = Param(None, "its name in the metrics", Text(nonempty=True))

    def check(self, where: str) -> None:
        if not self.path:
            raise ValueError(f"{where}.path must be {SHARD_DIR}")
        shares = [key for key in ("weight", "epochs") if getattr(self, key) is not None]
        if len(shares) != 1:
            raise ValueError(f"{where} needs exactly one of weight or epochs, got {shares or 'neither'}")


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
            raise ConfigError(f"--set {item!r}: unknown section '{parts[0]}' (known: {', '.join(SECTIONS)})"
                              f"{near_miss(parts[0], SECTIONS)}")
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
        raise ConfigError(f"{source}: unknown section(s) {unknown}; known: {list(SECTIONS)}"
                          f"{near_miss(unknown[0], SECTIONS)}")
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
    try:
        tables = [parse(SourceConfig, item, f"data.sources[{i}]") for i, item in enumerate(sources)]
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if len({table.weight is None for table in tables}) > 1:
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
