"""Relevance classifiers (BERT-family or supervised fastText): train, load, score, evaluate.

A model directory holds `dsdata-relevance.json` next to its model files; `load_scorer(DIR)` returns
an object with `score(texts) -> list[float]` (the probability of label 1) for either backend.
"""
