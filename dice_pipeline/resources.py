"""Dagster resources: the seams between the asset graph and the machinery (warehouse, verifier, generator).

Swapping local for cluster execution is a change of resource configuration here, never of an asset.
"""

from __future__ import annotations

import dagster as dg
import polars as pl

from dice_pipeline.paths import warehouse_path
from warehouse import Provenance, Warehouse, install_lineage_views, table_for

# Output metadata an asset sets to say which source its table is built from (ingestion, synthesis, a task file).
# Outputs without it inherit the source of `concur_pairs`, the table every other stage is derived from.
SOURCE_METADATA_KEY = "dice/source"
SOURCE_SHA256_METADATA_KEY = "dice/source_sha256"
DERIVED_FROM_METADATA_KEY = "dice/derived_from"
DERIVED_FROM_DEFAULT = "concur_pairs"


def _metadata_text(metadata, key: str) -> str | None:
    value = metadata.get(key)
    value = getattr(value, "value", value)
    return None if value is None else str(value)


class WarehouseResource(dg.ConfigurableResource):
    """The DuckDB warehouse. `path` empty means DICE_WAREHOUSE_PATH, else `warehouse/dice.duckdb` in the project."""

    path: str = ""

    def open(self) -> Warehouse:
        return Warehouse(self.path or warehouse_path())


class WarehouseIOManager(dg.ConfigurableIOManager):
    """Stores each asset's polars frame as the DuckDB table declared for it in `warehouse/tables.py`.

    Unlike the stock DuckDB IO managers it writes empty frames (an empty result is still a table), creates tables
    from the declared schema (so a new column is an ALTER, not a failed write), and replaces only the rows of the
    partition being written. Each write records the source the table (or partition) was built from in the same
    transaction (`lineage.builds`, shown by `lineage.table_sources`). Lineage views are refreshed after every write.
    """

    path: str = ""

    def _warehouse(self) -> Warehouse:
        return Warehouse(self.path or warehouse_path())

    @staticmethod
    def _table_name(context: dg.OutputContext | dg.InputContext) -> str:
        return context.asset_key.path[-1]

    def handle_output(self, context: dg.OutputContext, obj: pl.DataFrame) -> None:
        if not isinstance(obj, pl.DataFrame):
            raise TypeError(f"{context.asset_key.to_user_string()} returned {type(obj).__name__}, not a polars frame")
        spec = table_for(self._table_name(context))
        # The run's partition key is not this table's when the asset is unpartitioned (ingestion in a threshold run).
        partition_key = context.asset_partition_key if context.has_asset_partitions else None
        warehouse = self._warehouse()
        provenance = self._provenance(context, warehouse)
        rows = warehouse.write(spec, obj, partition_key=partition_key, provenance=provenance)
        install_lineage_views(warehouse)
        context.add_output_metadata({
            "warehouse/table": spec.qualified_name,
            "warehouse/rows_written": rows,
            "warehouse/built_from": provenance.source_name or "unknown",
        })

    @staticmethod
    def _provenance(context: dg.OutputContext, warehouse: Warehouse) -> Provenance:
        metadata = context.output_metadata or {}
        if SOURCE_METADATA_KEY in metadata:
            return Provenance(
                _metadata_text(metadata, SOURCE_METADATA_KEY),
                _metadata_text(metadata, SOURCE_SHA256_METADATA_KEY),
                _metadata_text(metadata, DERIVED_FROM_METADATA_KEY),
                context.run_id,
            )
        upstream = warehouse.provenance(DERIVED_FROM_DEFAULT)
        return Provenance(
            upstream.source_name if upstream else None,
            upstream.source_sha256 if upstream else None,
            DERIVED_FROM_DEFAULT,
            context.run_id,
        )

    def load_input(self, context: dg.InputContext) -> pl.DataFrame:
        spec = table_for(self._table_name(context))
        keys = None
        if spec.partition_column is not None and context.has_asset_partitions:
            keys = list(context.asset_partition_keys)
        return self._warehouse().read(spec, partition_keys=keys)


class KernelVerifier(dg.ConfigurableResource):
    """Judges candidate kernels against their references (see dice_pipeline/verify). The seam every stage uses:
    filtering, structure synthesis, the RL reward and KernelBench evaluation.

    `execute`: `auto` runs on a GPU where one is visible, else static checks + compile only (verdicts say
    not_executed); `never` forces the latter; `always` fails without a GPU instead of degrading.
    """

    execute: str = "auto"
    devices: list[int] = []  # GPU indices to shard over; empty = every visible GPU
    correctness_trials: int = 5
    timing_samples: int = 100
    compile_timeout_s: float = 900.0
    run_timeout_s: float = 180.0
    build_cache_dir: str = ""  # empty = <project cache>/kernel_builds
    max_parallel_builds: int = 0  # 0 = one per CPU core
    # On a GPU-less host, still build every candidate with nvcc (the compile-only stage). Off by default: it costs
    # 1-3 min a candidate on a 2-core machine (measured), so `dice run` there would take most of an hour.
    compile_without_gpu: bool = False
    # Executed verdicts are kept here and reused for identical (reference, candidate, config): a pair is judged on a
    # GPU once. A store filled on a GPU host can be pointed at from a GPU-less one. Empty = <project cache>/verdicts.
    verdict_store_dir: str = ""
    # Also time each correct candidate's reference as a CUDA graph ("cuda_graph") and/or torch.compile'd
    # ("compile"); recorded per verdict (baseline_speedups), never used by the filter. Empty = eager only.
    extra_baselines: list[str] = []
    # Which timing convention `speedup` (and so the filter) uses: "gpu" (flush and call enqueued back to back: the
    # KernelBench / do_bench convention ConCuR's speedups were measured in) or "host" (host launch latency included).
    speedup_convention: str = "gpu"
    # "reject": a candidate whose own kernels do a minor share of the GPU time while PyTorch compute does the rest
    # is deceptive (`baseline_kernel`; CuKe and the RL reward); "report": flagged only (KernelBench-compatible).
    baseline_kernel_policy: str = "reject"
    # Older verifier versions whose stored verdicts may fill in (e.g. ["0.2.0"]), flagged `older_verifier_version`.
    accept_verdicts_from: list[str] = []

    def verify_config(self):
        from dice_pipeline.paths import cache_dir
        from dice_pipeline.verify import VerifyConfig

        if self.execute not in ("auto", "always", "never"):
            raise ValueError(f"execute must be auto, always or never, not {self.execute!r}")
        optional = {"max_parallel_builds": self.max_parallel_builds} if self.max_parallel_builds else {}
        return VerifyConfig(
            execute={"auto": None, "always": True, "never": False}[self.execute],
            devices=list(self.devices) or None,
            correctness_trials=self.correctness_trials,
            timing_samples=self.timing_samples,
            compile_timeout_s=self.compile_timeout_s,
            run_timeout_s=self.run_timeout_s,
            build_cache_dir=self.build_cache_dir or str(cache_dir() / "kernel_builds"),
            build_without_gpu=self.compile_without_gpu,
            verdict_store_dir=self.verdict_store_dir or str(cache_dir() / "verdicts"),
            extra_baselines=tuple(self.extra_baselines),
            speedup_convention=self.speedup_convention,
            baseline_kernel_policy=self.baseline_kernel_policy,
            accept_verdicts_from=tuple(self.accept_verdicts_from),
            **optional,
        )

    def describe(self) -> str:
        return f"execute={self.execute}, devices={list(self.devices) or 'all'}, trials={self.correctness_trials}"

    def verify(self, jobs: list[tuple[str, str, str]], log=None) -> list:
        """Judge (job_id, reference_src, candidate_src) triples; returns one Verdict per job, in order."""
        from dice_pipeline.verify import VerifyJob, verify_batch

        batch = [VerifyJob(job_id, reference, candidate) for job_id, reference, candidate in jobs]
        on_result = None
        if log is not None:
            def on_result(job, verdict):
                log(f"{job.job_id}: {verdict.summary()}")
        return verify_batch(batch, self.verify_config(), on_result=on_result)


class KernelGeneratorResource(dg.ConfigurableResource):
    """Where candidate kernels come from (see dice_pipeline/synthesis).

    `templates` (default, offline): the team's CUDA templates. `openai`: any OpenAI-compatible chat endpoint (vLLM,
    hosted APIs); URL, model and key from the fields or DICE_GENERATOR_BASE_URL / _MODEL / _API_KEY. `checkpoint`:
    a local transformers or block-diffusion (SDAR/DICE) checkpoint directory.
    """

    backend: str = "templates"
    base_url: str = ""
    model: str = ""
    api_key_env: str = "DICE_GENERATOR_API_KEY"  # the key is read from this variable, never stored in config
    temperature: float = 1.0
    top_p: float = 0.95
    max_tokens: int = 4096
    requests_per_minute: float = 60.0
    checkpoint_path: str = ""
    response_cache_dir: str = ""  # empty = <project cache>/generator_responses

    def build(self):
        import os

        from dice_pipeline.synthesis.backends import make_generator

        return make_generator(
            self.backend,
            base_url=self.base_url,
            model=self.model,
            api_key=os.environ.get(self.api_key_env, ""),
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            requests_per_minute=self.requests_per_minute,
            response_cache_dir=self.response_cache_dir,
            checkpoint_path=self.checkpoint_path,
        )
