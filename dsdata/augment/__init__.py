"""Data augmentation for the `augment` stage: back-translation (zh↔en round trips through seq2seq
models, run in Beam with RunInference) and dictionary-based synonym / entity replacement.

These pure-Python parts (sentence splitting, chrF, language guess, dictionaries, derived records,
translation) import no Beam; the Beam graph lives in `dsdata/beam/augment.py`.
"""
