"""dsdata: LLM pre-training data pipelines on Apache Beam, and a trainer for them.

The Python API (README.md): `dsdata.run`, `dsdata.RunError`, `dsdata.register_stage` and what a
custom stage is written with, imported on first use (`import dsdata` loads neither Beam nor pyarrow).
"""
__version__ = "0.1.0"

_LAZY = {"run": "dsdata.api", "RunError": "dsdata.api", "register_stage": "dsdata.stages",
         "DocumentStage": "dsdata.stages", "BatchStage": "dsdata.stages", "Param": "dsdata.stages",
         "Document": "dsdata.document", "Rejected": "dsdata.document",
         **dict.fromkeys(("Integer", "Number", "Text", "Boolean", "Choice", "ListOf", "Path"), "dsdata.core.params")}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'dsdata' has no attribute {name!r}")
