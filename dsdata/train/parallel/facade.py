"""`MixedParallel({...})`: the hybrid layout from a plain dict of `[parallel]` keys (plus
`global_batch_size`) instead of a TOML config; docs/parallel.md."""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from dsdata.core.params import unknown_keys
from dsdata.train.config import Config, ConfigError, ParallelConfig, config_from_dict
from dsdata.train.distributed import DistEnv, init_distributed
from dsdata.train.parallel.dims import ParallelDims, resolve_dims
from dsdata.train.parallel.layout import HybridLayout

_PARALLEL_KEYS = {f.name for f in fields(ParallelConfig)}


def _parallel_config(spec: dict[str, Any]) -> tuple[ParallelConfig, int | None]:
    unknown = set(spec) - _PARALLEL_KEYS - {"global_batch_size"}
    if unknown:
        raise ConfigError(unknown_keys("MixedParallel", unknown, _PARALLEL_KEYS | {"global_batch_size"}))
    given = {k: v for k, v in spec.items() if k == "global_batch_size"}
    config = config_from_dict({"parallel": {k: v for k, v in spec.items() if k in _PARALLEL_KEYS},
                               "training": given}, "MixedParallel")  # the same checks as a TOML config's
    return config.parallel, config.training.global_batch_size if given else None


def _global_batch(parallel: ParallelConfig, given: int | None, world_size: int) -> int:
    if given:
        return given
    if parallel.micro_batch_size and parallel.gradient_accumulation_steps:
        tp_pp = parallel.tensor_parallel_size * parallel.pipeline_parallel_size
        dp = parallel.data_parallel_size or max(1, world_size // tp_pp)
        return dp * parallel.micro_batch_size * parallel.gradient_accumulation_steps
    raise ConfigError("MixedParallel: give global_batch_size, or both micro_batch_size and gradient_accumulation_steps")


class MixedParallel(HybridLayout):
    """The (dp, pp, tp) layout from a dict; `env` defaults to torchrun's environment (process group started)."""

    def __init__(self, spec: dict[str, Any], config: Config | None = None, env: DistEnv | None = None):
        parallel, given_batch = _parallel_config(spec)
        env = env or init_distributed("auto")
        base = config or config_from_dict({}, "MixedParallel")
        batch = _global_batch(parallel, given_batch, env.world_size)
        config = replace(base, parallel=parallel, training=replace(base.training, global_batch_size=batch))
        super().__init__(config, env)

    @staticmethod
    def plan(spec: dict[str, Any], world_size: int) -> ParallelDims:
        """The sizes this spec gives on `world_size` processes, without starting anything (or a ConfigError)."""
        parallel, given_batch = _parallel_config(spec)
        return resolve_dims(parallel, world_size, _global_batch(parallel, given_batch, world_size))
