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
    max_parallel_builds: int = 0  # 0 = as many as the cores left by the GPU workers and the memory hold
    # Where judging happens. "local": this host's GPUs, one worker per GPU. "ray": a Ray cluster (builds on CPU
    # workers, judgements on one-GPU workers; `pip install -e .[ray]`), at `ray_address` (empty = RAY_ADDRESS or a
    # local Ray instance started for the batch).
    backend: str = "local"
    ray_address: str = ""
    # How the batch is launched. "in_process": in the asset's step process. "pipes": as an external process through
    # a Dagster Pipes subprocess client (dice_pipeline/pipes.py), logs and metadata reported back; the same command
    # runs in a Kubernetes pod or a Slurm job with another Pipes client.
    launch: str = "in_process"
    # Per-host GPU lock directory shared with the GpuPool resource: two runs never time on one GPU at once. Empty =
    # DICE_GPU_LOCK_DIR or /tmp/dice_gpu_locks; "off" = no locks.
    device_lock_dir: str = ""
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
    # Candidates judged on a GPU at once: untimed work overlaps, every timed section still has the GPU to itself.
    # Each lane gets a core of its own for its worker (at least VerifyConfig.gpu_worker_cpus a GPU), kept free of
    # builds where the host has 4x as many cores (api.split_cpus; else workers and builds share every core).
    # 4 by default: 67 candidates took 245 s with 4 lanes against 304 s with 2 on one H100, the same statuses and
    # speedups within run-to-run noise (later builds: 152 s with 4, 138 s with 8 on an H200; an eighth of the GPU's
    # memory a lane sends more full-size KernelBench tasks to the whole GPU). 1 = one judgement on a GPU at a time.
    gpu_lanes: int = 4
    # Up to this many candidates' extensions built as one library (torch headers compiled once a group); 1 = alone.
    build_batch_size: int = 8

    def verify_config(self):
        from dice_pipeline.gpu_pool import default_lock_dir
        from dice_pipeline.paths import cache_dir
        from dice_pipeline.verify import VerifyConfig

        if self.execute not in ("auto", "always", "never"):
            raise ValueError(f"execute must be auto, always or never, not {self.execute!r}")
        if self.backend not in ("local", "ray"):
            raise ValueError(f"backend must be local or ray, not {self.backend!r}")
        if self.launch not in ("in_process", "pipes"):
            raise ValueError(f"launch must be in_process or pipes, not {self.launch!r}")
        optional = {"max_parallel_builds": self.max_parallel_builds or self._compile_pool_size()}
        return VerifyConfig(
            execute={"auto": None, "always": True, "never": False}[self.execute],
            devices=list(self.devices) or None,
            correctness_trials=self.correctness_trials,
            timing_samples=self.timing_samples,
            compile_timeout_s=self.compile_timeout_s,
            run_timeout_s=self.run_timeout_s,
            build_cache_dir=self.build_cache_dir or str(cache_dir() / "kernel_builds"),
            device_lock_dir=None if self.device_lock_dir == "off" else (self.device_lock_dir or default_lock_dir()),
            build_without_gpu=self.compile_without_gpu,
            verdict_store_dir=self.verdict_store_dir or str(cache_dir() / "verdicts"),
            extra_baselines=tuple(self.extra_baselines),
            speedup_convention=self.speedup_convention,
            baseline_kernel_policy=self.baseline_kernel_policy,
            accept_verdicts_from=tuple(self.accept_verdicts_from),
            gpu_lanes=self.gpu_lanes,
            gpu_worker_cpus=self._gpu_worker_cpus(),
            build_batch_size=self.build_batch_size,
            **optional,
        )

    def _gpu_worker_cpus(self) -> int:
        """Cores a GPU's run-stage workers keep to themselves: one a lane, no fewer than the verifier's default."""
        from dice_pipeline.verify import VerifyConfig

        return max(VerifyConfig.gpu_worker_cpus, self.gpu_lanes)

    def _compile_pool_size(self) -> int:
        """Builds side by side: one per core the builds get (verify_batch keeps cores for the GPU workers where the
        host has enough of them), no more than the available memory holds (dice_pipeline/gpu_pool.py)."""
        from dice_pipeline.gpu_pool import compile_workers
        from dice_pipeline.verify import gpu_inventory
        from dice_pipeline.verify.api import split_cpus

        gpus = [] if self.execute == "never" else [g for g in gpu_inventory()
                                                   if not self.devices or g.index in self.devices]
        _, build_cpus = split_cpus(self._gpu_worker_cpus() * len(gpus))
        return compile_workers(cpu_cores=len(build_cpus) if build_cpus else None)

    def describe(self) -> str:
        return (f"execute={self.execute}, devices={list(self.devices) or 'all'}, trials={self.correctness_trials}, "
                f"backend={self.backend}, launch={self.launch}")

    def verify(self, jobs: list[tuple[str, str, str]], log=None) -> list:
        """Judge (job_id, reference_src, candidate_src) triples in this process (on the configured backend);
        returns one Verdict per job, in order."""
        from dice_pipeline.verify import VerifyJob, verify_batch

        batch = [VerifyJob(job_id, reference, candidate) for job_id, reference, candidate in jobs]
        on_result = None
        if log is not None:
            def on_result(job, verdict):
                log(f"{job.job_id}: {verdict.summary()}")
        if self.backend == "ray":
            from dice_pipeline.verify.ray_backend import verify_batch_ray

            return verify_batch_ray(batch, self.verify_config(), on_result=on_result,
                                    address=self.ray_address or None)
        return verify_batch(batch, self.verify_config(), on_result=on_result)

    def verify_for_asset(self, context: dg.AssetExecutionContext,
                         jobs: list[tuple[str, str, str]]) -> tuple[list, dict]:
        """`verify` as an asset runs it: in this process, or through Dagster Pipes (`launch`). Returns the verdicts
        and the metadata the external process reported (empty in process)."""
        if self.launch == "in_process":
            return self.verify(jobs, log=context.log.info), {}
        from dice_pipeline.pipes import verify_through_pipes
        from dice_pipeline.verify import VerifyJob

        batch = [VerifyJob(job_id, reference, candidate) for job_id, reference, candidate in jobs]
        return verify_through_pipes(context, batch, self.verify_config(), backend=self.backend,
                                    ray_address=self.ray_address)


class GpuPool(dg.ConfigurableResource):
    """This host's GPUs, handed out whole: a lease's devices are held by no other lease in any process or run on the
    host (lock files under `lock_dir`, shared with KernelVerifier.device_lock_dir), and `lease.env()` gives its
    process CUDA_VISIBLE_DEVICES. Also sizes the compile pool that feeds the GPUs from the cores and memory.

        with gpu_pool.lease(1) as lease:
            run_module_through_pipes(context, "training.sft", args, env=lease.env())
    """

    devices: list[int] = []  # empty = every GPU nvidia-smi lists (within CUDA_VISIBLE_DEVICES)
    lock_dir: str = ""  # empty = DICE_GPU_LOCK_DIR or /tmp/dice_gpu_locks
    build_memory_mb: int = 3072  # resident memory one candidate build needs (see gpu_pool.BUILD_MEMORY_MB)

    def device_pool(self):
        from dice_pipeline.gpu_pool import DevicePool
        from dice_pipeline.verify import gpu_inventory

        return DevicePool(list(self.devices) or [g.index for g in gpu_inventory()], self.lock_dir)

    def lease(self, count: int = 1, timeout_s: float | None = None):
        """Context manager holding `count` free GPUs (waits while too few are free); yields a GpuLease."""
        return self.device_pool().lease(count, timeout_s=timeout_s)

    def compile_workers(self, reserved_cores: int = 0) -> int:
        """Builds to run side by side here: one per core beyond `reserved_cores`, as many as the memory holds."""
        from dice_pipeline.gpu_pool import compile_workers

        return compile_workers(reserved_cores=reserved_cores, build_memory_mb=self.build_memory_mb)


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
