"""dsdata's Beam side: the pipeline, its transforms and the engines that run it."""
from dsdata.beam.engines import harness_noise, mlimport

mlimport.install()  # before any dsdata module imports Beam (dsdata/beam/engines/mlimport.py)
harness_noise.install()  # no tracebacks for the harness streams a runner closes at a job's end
