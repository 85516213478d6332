"""Dagster resources: the seams between the asset graph and the machinery (warehouse, verifier, generator).

Swapping local for cluster execution is a change of resource configuration here, never of an asset.
"""

from __future__ import annotations

from typing import Any

import dagster as dg
import polars as pl

from dice_pipeline import settings
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


def pipeline_verify_settings() -> dict[str, Any]:
    """Where the pipeline's verifier differs from VerifyConfig's defaults (the library's and `dice verify`'s), and
    why; `KernelVerifier.overrides` win over them. Executed verdicts are kept in the project cache, so a pair is
    judged on a GPU once across runs (a store filled on a GPU host can be pointed at from a GPU-less one); and a
    GPU-less host does not build every candidate with nvcc (1-3 min a candidate on a 2-core machine, measured: `dice
    run` there would take most of an hour)."""
    from dice_pipeline.paths import cache_dir

    return {"verdict_store_dir": str(cache_dir() / "verdicts"), "build_without_gpu": False}


class KernelVerifier(dg.ConfigurableResource):
    """Judges candidate kernels against their references (see dice_pipeline/verify). The seam every stage uses:
    filtering, structure synthesis, the RL reward and KernelBench evaluation.

    VerifyConfig is the one source of the verifier's defaults; this resource keeps where and how a batch runs
    (`execute`, `backend`, `ray_address`, `launch`) and passes `overrides` through: VerifyConfig fields by their own
    names (`{"gpu_lanes": 4, "extra_baselines": ["compile"]}`), checked when a run starts (an unknown name or a value
    VerifyConfig refuses fails it). Lanes, cores and builds it leaves unset are chosen for the host (verify/inventory.py).

    `execute`: `auto` runs on a GPU where one is visible, else static checks + compile only (verdicts say
    not_executed); `never` forces the latter; `always` fails without a GPU instead of degrading.
    """

    execute: str = "auto"
    # Where judging happens. "local": this host's GPUs. "ray": a Ray cluster (builds on CPU workers, judgements on
    # one-GPU workers; `pip install -e .[ray]`), at `ray_address` (empty = RAY_ADDRESS or a local Ray instance started
    # for the batch).
    backend: str = "local"
    ray_address: str = ""
    # How the batch is launched. "in_process": in the asset's step process. "pipes": as an external process through
    # a Dagster Pipes subprocess client (dice_pipeline/pipes.py), logs and metadata reported back; the same command
    # runs in a Kubernetes pod or a Slurm job with another Pipes client.
    launch: str = "in_process"
    # VerifyConfig fields by name, over the pipeline's own settings (pipeline_verify_settings); "" for None.
    overrides: dict[str, Any] = {}

    def verify_config(self):
        from dice_pipeline.verify import VerifyConfig

        if self.execute not in ("auto", "always", "never"):
            raise ValueError(f"execute must be auto, always or never, not {self.execute!r}")
        if self.backend not in ("local", "ray"):
            raise ValueError(f"backend must be local or ray, not {self.backend!r}")
        if self.launch not in ("in_process", "pipes"):
            raise ValueError(f"launch must be in_process or pipes, not {self.launch!r}")
        known = set(VerifyConfig.__dataclass_fields__) - {"execute"}
        unknown = sorted(set(self.overrides) - known)
        if unknown:
            raise ValueError(f"KernelVerifier.overrides: {unknown} are not VerifyConfig fields (set execute as the "
                             f"resource's own field); known: {sorted(known)}")
        # Dagster's config has no null inside a map: "" stands for None where a field takes None (no store, no locks).
        fields = VerifyConfig.__dataclass_fields__
        overrides = {name: None if value == "" and "None" in str(fields[name].type) else value
                     for name, value in self.overrides.items()}
        return VerifyConfig(execute={"auto": None, "always": True, "never": False}[self.execute],
                            **{**pipeline_verify_settings(), **overrides})

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.verify_config()  # a bad override fails the run at its start, not the asset that first judges

    def describe(self) -> str:
        config = self.verify_config()
        return (f"execute={self.execute}, devices={config.devices or 'all'}, trials={config.correctness_trials}, "
                f"backend={self.backend}, launch={self.launch}")

    def verify(self, jobs: list[tuple[str, str, str]], log=None, adjust=None) -> list:
        """Judge (job_id, reference_src, candidate_src) triples in this process (on the configured backend);
        returns one Verdict per job, in order. `adjust`: a function from this resource's VerifyConfig to the one
        a stage judges with (the synthetic pairs' timing settings, say)."""
        from dice_pipeline.verify import VerifyJob, verify_batch

        config = self.verify_config() if adjust is None else adjust(self.verify_config())
        batch = [VerifyJob(job_id, reference, candidate) for job_id, reference, candidate in jobs]
        on_result = None
        if log is not None:
            def on_result(job, verdict):
                log(f"{job.job_id}: {verdict.summary()}")
        if self.backend == "ray":
            from dice_pipeline.verify.ray_backend import verify_batch_ray

            return verify_batch_ray(batch, config, on_result=on_result, address=self.ray_address or None)
        return verify_batch(batch, config, on_result=on_result)

    def verify_for_asset(self, context: dg.AssetExecutionContext,
                         jobs: list[tuple[str, str, str]], adjust=None) -> tuple[list, dict]:
        """`verify` as an asset runs it: in this process, or through Dagster Pipes (`launch`). Returns the verdicts
        and the metadata the external process reported (empty in process)."""
        if self.launch == "in_process":
            return self.verify(jobs, log=context.log.info, adjust=adjust), {}
        from dice_pipeline.pipes import verify_through_pipes
        from dice_pipeline.verify import VerifyJob

        config = self.verify_config() if adjust is None else adjust(self.verify_config())
        batch = [VerifyJob(job_id, reference, candidate) for job_id, reference, candidate in jobs]
        return verify_through_pipes(context, batch, config, backend=self.backend, ray_address=self.ray_address)


class GpuPool(dg.ConfigurableResource):
    """This host's GPUs, handed out whole: a lease's devices are held by no other lease in any process or run on the
    host (lock files under `lock_dir`, shared with KernelVerifier.device_lock_dir), and `lease.env()` gives its
    process CUDA_VISIBLE_DEVICES. Also sizes the compile pool that feeds the GPUs from the cores and memory. The
    training assets hold one for each stage they launch (assets/training.py):

        with gpu_pool.lease_or_cpu(n) as lease:
            run_module_through_pipes(context, "training.stages", args, nproc_per_node=n, env=lease.env())
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

    def lease_or_cpu(self, count: int = 1, timeout_s: float | None = None):
        """`lease(count)` where this host has GPUs; where it has none, a lease of no devices (its env hides CUDA),
        so the same launch runs its `count` processes on the CPU (the training stages' tiny recipes in CI). A host
        with GPUs but fewer than `count` fails, never falls back."""
        import contextlib

        from dice_pipeline.gpu_pool import GpuLease

        pool = self.device_pool()
        if not pool.devices:
            return contextlib.nullcontext(GpuLease(()))
        return pool.lease(count, timeout_s=timeout_s)

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
    api_key_env: str = settings.GENERATOR_API_KEY.name  # the key is read from this variable, never stored in config
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
