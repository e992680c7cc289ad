"""Relevance classifiers (BERT-family or fastText): train, load, score, evaluate.  `load_scorer(DIR)`
reads `dsdata-relevance.json` and returns `score(texts) -> list[float]` (P(label 1)) for either.
"""
