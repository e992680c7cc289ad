"""Sub-commands of `dsdata` beyond `run` and `stages`, one module each, imported on demand."""
