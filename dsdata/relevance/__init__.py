"""Relevance classifiers: a BERT-family sequence classifier (run through Beam RunInference) and a
supervised fastText model, with the code to train, load, score and evaluate them.

A trained model directory always holds `dsdata-relevance.json` (backend, training settings, measured
figures) next to the model files; `load_scorer(DIR)` returns an object with `score(texts) -> list[float]`
(probability that each text is relevant, label 1) for either backend.
"""
