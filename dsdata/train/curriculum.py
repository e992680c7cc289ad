"""Curriculum: per-bucket (easy/medium/hard) sampling weights as a function of the training step.

Schedules give {bucket: weight >= 0}; `CurriculumSampler` draws buckets from them;
`schedule_from_spec` builds one from a config dict or difficulty.json.  docs/shards.md ("Curriculum").
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from dsdata.core.params import Choice, Number, Param
from dsdata.io.untrusted_files import load_json_file

BUCKETS = ("easy", "medium", "hard")
# The largest relative share a mixture takes (a curriculum bucket's weight here, a data.sources weight
# or epochs in config.py), so sums and interpolations stay finite (no inf/NaN probabilities).
MAX_SHARE = 1e6
WEIGHT = Param(1.0, "a bucket's weight", Number(0, MAX_SHARE, open_max=True))
WARMUP_FRACTION = Param(0.3, "share of the steps the linear schedule takes", Number(0, 1))
SCHEDULE = Param("fixed", "the curriculum's shape", Choice(("fixed", "linear", "table")))


def _clean(weights: Mapping[str, float], what: str) -> dict[str, float]:
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(f"{what}: weights must be a non-empty mapping like {{'easy': 0.5, 'medium': 0.3, 'hard': 0.2}}")
    out = {str(bucket): WEIGHT.coerce(f"{what}: weight of '{bucket}'", weight) for bucket, weight in weights.items()}
    if sum(out.values()) <= 0:
        raise ValueError(f"{what}: weights sum to 0")
    return out


def _lerp(a: Mapping[str, float], b: Mapping[str, float], t: float) -> dict[str, float]:
    return {k: (1 - t) * a.get(k, 0.0) + t * b.get(k, 0.0) for k in sorted(set(a) | set(b))}


class CurriculumSchedule:
    """Base class: `weights(step) -> {bucket: weight}`."""

    def weights(self, step: int) -> dict[str, float]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass
class FixedSchedule(CurriculumSchedule):
    fixed: dict[str, float]

    def __post_init__(self) -> None:
        self.fixed = _clean(self.fixed, "fixed curriculum")

    def weights(self, step: int) -> dict[str, float]:
        return dict(self.fixed)

    def describe(self) -> dict[str, Any]:
        return {"schedule": "fixed", "weights": self.fixed}


@dataclass
class LinearSchedule(CurriculumSchedule):
    start: dict[str, float]
    end: dict[str, float]
    warmup_steps: int

    def __post_init__(self) -> None:
        self.start = _clean(self.start, "linear curriculum start")
        self.end = _clean(self.end, "linear curriculum end")
        if int(self.warmup_steps) < 0:
            raise ValueError(f"linear curriculum: warmup_steps must be >= 0, got {self.warmup_steps}")
        self.warmup_steps = int(self.warmup_steps)

    def weights(self, step: int) -> dict[str, float]:
        t = 1.0 if self.warmup_steps == 0 else min(1.0, max(0.0, step / self.warmup_steps))
        return _lerp(self.start, self.end, t)

    def describe(self) -> dict[str, Any]:
        return {"schedule": "linear", "start": self.start, "end": self.end, "warmup_steps": self.warmup_steps}


@dataclass
class TableSchedule(CurriculumSchedule):
    rows: Sequence[tuple[int, dict[str, float]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("table curriculum: give at least one (step, weights) row")
        rows = [(int(step), _clean(w, f"table curriculum row at step {step}")) for step, w in self.rows]
        rows.sort(key=lambda r: r[0])
        self.rows = rows

    def weights(self, step: int) -> dict[str, float]:
        rows = self.rows
        if step <= rows[0][0]:
            return dict(rows[0][1])
        for (s0, w0), (s1, w1) in zip(rows, rows[1:]):
            if step < s1:
                return _lerp(w0, w1, (step - s0) / (s1 - s0))
        return dict(rows[-1][1])

    def describe(self) -> dict[str, Any]:
        return {"schedule": "table", "rows": [[s, w] for s, w in self.rows]}


def _bucket_counts(obj: Any) -> dict[str, float] | None:
    """{bucket: count} from the shapes pipelines write: {"easy": n}, {"easy": {"tokens": n}}, ..."""
    if not isinstance(obj, Mapping):
        return None
    found = {}
    for bucket in BUCKETS:
        value = obj.get(bucket)
        if isinstance(value, Mapping):
            value = value.get("tokens", value.get("docs", value.get("count")))
        if isinstance(value, (int, float)) and value >= 0:
            found[bucket] = float(value)
    return found if found and sum(found.values()) > 0 else None


def natural_weights(path: str) -> dict[str, float]:
    """The corpus' own bucket mix (shares summing to 1) from a shard manifest.json, a pipeline's
    stats.json or difficulty.json (a run directory is accepted: its files are tried in that order)."""
    candidates = [path]
    if os.path.isdir(path):
        candidates = [os.path.join(path, n) for n in ("shards/manifest.json", "manifest.json", "difficulty.json", "stats.json")]
    for candidate in candidates:
        if not os.path.isfile(candidate):
            continue
        data = load_json_file(candidate, "curriculum counts")
        # Look where manifests, the difficulty stage and the ledger keep their bucket counts.
        queue = [data]
        while queue:
            node = queue.pop(0)
            counts = _bucket_counts(node)
            if counts is not None:
                total = sum(counts.values())
                return {k: v / total for k, v in counts.items()}
            if isinstance(node, Mapping):
                queue.extend(v for k, v in node.items() if isinstance(v, Mapping))
    raise ValueError(f"no difficulty bucket counts (easy/medium/hard) found in {path}; "
                     "give curriculum weights explicitly")


def schedule_from_spec(spec: Mapping[str, Any] | CurriculumSchedule | None, total_steps: int | None = None,
                       natural: Mapping[str, float] | None = None) -> CurriculumSchedule | None:
    """Build a schedule from a config mapping (None stays None).  `natural` (the corpus mix, or the
    spec's `weights_from: PATH` read by natural_weights) defaults `fixed` weights and `linear`'s end."""
    if spec is None or isinstance(spec, CurriculumSchedule):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        # A pipeline's difficulty.json carries a ready "curriculum" spec and the corpus counts.
        data = load_json_file(str(spec), "curriculum spec")
        if not isinstance(data, Mapping) or not isinstance(data.get("curriculum"), Mapping):
            raise ValueError(f"{spec}: no 'curriculum' spec inside; pass a mapping like {{'schedule': 'linear', ...}}")
        natural = natural or natural_weights(str(spec))
        spec = data["curriculum"]
    if not isinstance(spec, Mapping):
        raise ValueError(f"curriculum must be a mapping with a 'schedule' key, got {spec!r}")
    if spec.get("weights_from"):
        natural = natural_weights(str(spec["weights_from"]))
    uniform = {b: 1.0 for b in BUCKETS}
    kind = SCHEDULE.coerce("schedule", spec.get("schedule", "fixed"))
    if kind == "fixed":
        return FixedSchedule(dict(spec.get("weights") or natural or uniform))
    if kind == "linear":
        if "warmup_steps" in spec:
            warmup = int(spec["warmup_steps"])
        else:
            if total_steps is None:
                raise ValueError("linear curriculum with warmup_fraction needs the run's total steps")
            fraction = WARMUP_FRACTION.coerce("linear curriculum: warmup_fraction", spec.get("warmup_fraction", 0.3))
            warmup = int(round(fraction * total_steps))
        start = spec.get("start") or {"easy": 0.7, "medium": 0.2, "hard": 0.1}
        return LinearSchedule(dict(start), dict(spec.get("end") or natural or uniform), warmup)
    rows = spec.get("rows", [])
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, (list, tuple)) and len(r) == 2 for r in rows):
        raise ValueError("table curriculum: rows must be [step, {bucket: weight}] pairs")
    return TableSchedule([(row[0], row[1]) for row in rows])


class CurriculumSampler:
    """Draws a bucket per sample from a schedule's weights at the current step, reproducibly."""

    def __init__(self, schedule: CurriculumSchedule, seed: int = 0):
        self.schedule = schedule
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self._cdf_key: tuple | None = None
        self._cdf: list[float] = []

    def probabilities(self, step: int, available: Sequence[str]) -> list[float]:
        """The schedule's weights at `step` over `available` buckets, summing to 1."""
        weights = self.schedule.weights(step)
        probs = [max(0.0, float(weights.get(b, 0.0))) for b in available]
        total = sum(probs)
        if total <= 0:
            # The schedule puts no weight on any bucket that has data: fall back to uniform.
            return [1.0 / len(available)] * len(available)
        return [p / total for p in probs]

    def choose(self, step: int, available: Sequence[str]) -> str:
        """One bucket among `available` (buckets with data), weights renormalised over them."""
        key = (step, tuple(available))
        if key != self._cdf_key:
            self._cdf = np.cumsum(self.probabilities(step, available)).tolist()
            self._cdf_key = key
        u = self.rng.random()
        for bucket, edge in zip(available, self._cdf):
            if u < edge:
                return bucket
        return available[-1]

    def state_dict(self) -> dict[str, Any]:
        # PCG64's 128-bit integers as strings: checkpoints stay loadable by JSON and by
        # torch.load(weights_only=True) alike.
        state = self.rng.bit_generator.state
        return {"rng": {"bit_generator": state["bit_generator"],
                        "state": {k: str(v) for k, v in state["state"].items()},
                        "has_uint32": int(state["has_uint32"]), "uinteger": int(state["uinteger"])}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        rng = state["rng"]
        self.rng.bit_generator.state = {"bit_generator": rng["bit_generator"],
                                        "state": {k: int(v) for k, v in rng["state"].items()},
                                        "has_uint32": int(rng["has_uint32"]), "uinteger": int(rng["uinteger"])}
