"""dsdata's Beam side: the pipeline, its transforms and the engines that run it."""
from dsdata.beam.engines import mlimport

mlimport.install()  # before any dsdata module imports RunInference (dsdata/beam/engines/mlimport.py)
