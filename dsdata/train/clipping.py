"""Dynamic gradient clipping: threshold = factor × median of the last `window` global grad norms."""
from __future__ import annotations

import collections
import statistics

import torch


class DynamicGradClipper:
    """Fixed `max_norm` until `min_history` norms are known, then factor × median(history) of the
    finite norms of applied steps."""

    def __init__(self, max_norm: float = 1.0, factor: float = 0.8, window: int = 100, min_history: int = 50,
                 dynamic: bool = True):
        self.max_norm, self.factor, self.min_history, self.dynamic = max_norm, factor, min_history, dynamic
        self.history: collections.deque[float] = collections.deque(maxlen=window)

    def threshold(self) -> float:
        if self.dynamic and len(self.history) >= self.min_history:
            return self.factor * statistics.median(self.history)
        return self.max_norm

    def record(self, norm: float) -> None:
        if norm == norm and norm != float("inf"):
            self.history.append(float(norm))

    @torch.no_grad()
    def clip(self, grads: list[torch.Tensor], total_norm: float) -> float:
        """Scale grads so their global norm is at most the threshold; returns the threshold used."""
        limit = self.threshold()
        if total_norm > limit:
            scale_gradients(grads, limit / (total_norm + 1e-6))
        return limit

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history.clear()
        self.history.extend(float(x) for x in state["history"])


@torch.no_grad()
def scale_gradients(grads: list[torch.Tensor], factor: float) -> None:
    """grads *= factor in place: one fused foreach launch for plain tensors, per tensor for DTensors
    (whose foreach support varies across torch versions)."""
    from torch.distributed.tensor import DTensor

    plain = [g for g in grads if not isinstance(g, DTensor)]
    if plain:
        torch._foreach_mul_(plain, factor)
    for g in grads:
        if isinstance(g, DTensor):
            g.mul_(factor)
