"""Faster baselines the reference is also timed as, after the eager comparison of a correct candidate
(VerifyConfig.extra_baselines): the reference captured in a CUDA graph, and torch.compile'd (BaselineStage, mixed
into CandidateJudge). They never change the status."""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch


class BaselineStage:
    """CandidateJudge's extra baselines (uses its reference model, inputs, config, judgement and timers)."""

    def _baseline_callable(self, name: str, inputs: list[Any]) -> Callable[[], Any]:
        """The reference's forward on `inputs` as the named faster baseline, warmed up and ready to time."""
        if name == "compile":
            from torch._inductor import config as inductor_config

            inductor_config.compile_threads = 1  # no compile-worker pool inside the sandboxed worker
            compiled = torch.compile(self.ref_model)

            def call() -> Any:
                with torch.no_grad():
                    return compiled(*inputs)
        elif name == "cuda_graph":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(3):  # warm-up on a side stream, as capture requires
                    self.ref_model(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                self.ref_model(*inputs)
            call = graph.replay
        else:
            raise ValueError(f"unknown baseline {name!r}")
        for _ in range(3):
            call()
        self._synchronize()
        return call

    def run_extra_baselines(self) -> None:
        """Build and warm each of config.extra_baselines (untimed: torch.compile's compile runs here, beside other
        lanes), then time them with the GPU alone."""
        with self.phase("extra_baselines_prepare"):
            prepared = self.prepare_extra_baselines()
        with self.alone("extra_baselines_timing"):
            self.time_extra_baselines(prepared)

    def prepare_extra_baselines(self) -> dict[str, Any]:
        inputs = self._inputs(self.config.seed + 3000)
        prepared: dict[str, Any] = {"inputs": inputs, "calls": {}}
        for name in self.config.extra_baselines:
            try:
                prepared["calls"][name] = self._baseline_callable(name, inputs)
            except Exception as exc:  # noqa: BLE001 - e.g. a reference torch.compile or graph capture cannot handle
                prepared["calls"][name] = exc
        return prepared

    def time_extra_baselines(self, prepared: dict[str, Any]) -> None:
        """Time the reference as each of config.extra_baselines (CUDA graph, torch.compile) on one fresh input set,
        L2 flushed, in the configured convention, the eager timing's sample count (bounded by the timing budget);
        speedup = that median / the candidate's eager-run median (a ratio of medians, not paired). Runs after
        every check on the candidate, which is not called here; a baseline that cannot be built for this reference
        is recorded with its error and changes nothing else."""
        cfg, j = self.config, self.judgement
        candidate_ms = j.fields["candidate_timing"].median_ms
        flush = torch.empty(cfg.l2_flush_mb * 2**20 // 4, dtype=torch.int32, device=self.device)
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        timed_pairs = j.fields.get("provenance", {}).get("timing_pairs", cfg.timing_samples)
        samples = max(cfg.timing_min_samples, min(cfg.timing_samples, timed_pairs))
        results: dict[str, Any] = {}
        for name, call in prepared["calls"].items():
            try:
                if isinstance(call, Exception):
                    raise call
                if cfg.speedup_convention == "gpu":
                    times = [self._timed_gpu(call, flush, start, end)[1] for _ in range(samples)]
                else:
                    times = [self._timed_host(call, flush, start, end)[1] for _ in range(samples)]
            except Exception as exc:  # noqa: BLE001 - e.g. a reference torch.compile or graph capture cannot handle
                results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                continue
            median_ms = statistics.median(times)
            results[name] = {"median_ms": median_ms, "n": len(times), "convention": cfg.speedup_convention,
                             "speedup": median_ms / candidate_ms if candidate_ms > 0 else None}
        j.fields["baseline_speedups"] = results
