"""Binary classification figures for relevance models: accuracy, precision, recall, F1, ROC-AUC."""
from __future__ import annotations

import math
from typing import Sequence


def roc_auc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    """ROC AUC as the Mann–Whitney U statistic (ties get average ranks); None if a class is absent."""
    pos = sum(labels)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return None
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    rank_sum = sum(r for r, y in zip(ranks, labels) if y == 1)
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def classification_report(scores: Sequence[float], labels: Sequence[int], threshold: float = 0.5) -> dict:
    """Figures for label 1 (relevant) with predictions `score >= threshold`."""
    predicted = [1 if (not math.isnan(s) and s >= threshold) else 0 for s in scores]
    tp = sum(1 for p, y in zip(predicted, labels) if p == 1 and y == 1)
    fp = sum(1 for p, y in zip(predicted, labels) if p == 1 and y == 0)
    fn = sum(1 for p, y in zip(predicted, labels) if p == 0 and y == 1)
    correct = sum(1 for p, y in zip(predicted, labels) if p == y)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    auc = roc_auc([0.0 if math.isnan(s) else s for s in scores], labels)
    return {"n": len(labels), "accuracy": round(correct / len(labels), 4) if labels else 0.0,
            "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
            "auc": round(auc, 4) if auc is not None else None, "threshold": threshold}
