"""Training shards: the format (format.py), the tokenizer bundled with a set (tokenizer.py), sets
published to shared memory (shm.py) and exports to other trainers' formats (export/)."""
