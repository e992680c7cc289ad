"""dsdata: LLM pre-training data pipelines on Apache Beam, and a trainer for them."""
__version__ = "0.1.0"
