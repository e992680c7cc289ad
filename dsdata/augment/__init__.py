"""Data augmentation for the `augment` stage: back-translation (zh↔en round trips through seq2seq
models) and dictionary-based synonym / entity replacement.  No Beam here: the Beam graph lives in
`dsdata/beam/augment.py`.
"""
