"""dice-pipeline: curate CUDA-kernel training data, train block-diffusion LMs on it, evaluate on KernelBench.

This package must stay importable without Dagster, polars or DuckDB (GPU hosts have only torch): import those
inside the modules that need them, never here.
"""

__version__ = "0.1.0"
