"""KernelBench evaluation of a checkpoint (or any comparison model): generation with the paper's protocol, judging
with the verifier, locally measured baselines, metrics at both tolerances, sanity rows and comparison reports.
Standard library only at import, so the GPU script (`benchmarks/kernelbench_eval_gpu.py`) runs on a torch-only host.
"""
