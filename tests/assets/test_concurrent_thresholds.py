"""Two runs launched at once for different threshold partitions both land, and nothing already there is lost.

DuckDB has a single writer per file; every connection is taken under the warehouse's lock file, so concurrent runs
queue on it instead of failing. The test holds that lock while both runs start, so they really do contend."""

import json
import subprocess
import sys
import textwrap
import time

import dagster as dg

from assets import keys
from dice_pipeline import definitions
from dice_pipeline.resources import (GpuPool, KernelGeneratorResource, KernelVerifier, WarehouseIOManager,
                                     WarehouseResource)
from warehouse import Warehouse, table_for

FILTER = [keys.SPEEDUP_FILTERED_PAIRS, keys.SPEEDUP_FILTER_DECISIONS]

RUN_ONE_THRESHOLD = textwrap.dedent("""
    import sys
    import dagster as dg
    from assets import keys
    from dice_pipeline import definitions
    from dice_pipeline.resources import (GpuPool, KernelGeneratorResource, KernelVerifier, WarehouseIOManager,
                                         WarehouseResource)

    warehouse_file, threshold = sys.argv[1], sys.argv[2]
    result = dg.materialize(
        definitions.ALL_ASSETS,
        selection=[keys.SPEEDUP_FILTERED_PAIRS, keys.SPEEDUP_FILTER_DECISIONS],
        instance=dg.DagsterInstance.get(),
        resources={"io_manager": WarehouseIOManager(path=warehouse_file),
                   "warehouse": WarehouseResource(path=warehouse_file),
                   "verifier": KernelVerifier(execute="never"), "generator": KernelGeneratorResource(),
                   "gpu_pool": GpuPool()},
        partition_key=threshold,
        raise_on_error=False,
    )
    print(f"threshold {threshold}: {'succeeded' if result.success else 'FAILED'}")
    sys.exit(0 if result.success else 1)
""")


def test_two_threshold_runs_at_once_both_land(tmp_path, monkeypatch, pair_factory):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    warehouse_file = str(tmp_path / "w.duckdb")
    wh = Warehouse(warehouse_file)
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(pair_factory(i, speedup=s)) + "\n"
                              for i, s in enumerate([0.8, 1.2, 1.6, 2.4, 3.5])))

    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name, ["2.0", "1.5", "3.0"])
    resources = {"io_manager": WarehouseIOManager(path=warehouse_file), "warehouse": WarehouseResource(path=warehouse_file),
                 "verifier": KernelVerifier(execute="never"), "generator": KernelGeneratorResource(),
                 "gpu_pool": GpuPool()}  # the training assets need it; none of them runs here
    upstream = [keys.CONCUR_PAIRS, keys.CONCUR_REJECTS, keys.VERIFIED_PAIRS]
    run_config = {"ops": {"concur_ingestion": {"config": {"source": str(source)}}}}
    assert dg.materialize(definitions.ALL_ASSETS, selection=upstream, instance=instance, resources=resources,
                          run_config=run_config).success
    assert dg.materialize(definitions.ALL_ASSETS, selection=FILTER, instance=instance, resources=resources,
                          partition_key="2.0").success
    kept_before = sorted(wh.read(table_for("speedup_filtered_pairs"), ["2.0"])["uuid"].to_list())
    assert kept_before == ["pair-3", "pair-4"]

    script = tmp_path / "run_one_threshold.py"
    script.write_text(RUN_ONE_THRESHOLD)
    # Both runs start while the warehouse is locked, so both must wait for it and then write one after the other.
    with wh.connect():
        runs = [subprocess.Popen([sys.executable, str(script), warehouse_file, threshold], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for threshold in ("1.5", "3.0")]
        time.sleep(3)
        assert all(run.poll() is None for run in runs), "a run finished while the warehouse was locked"
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], "\n".join(o[-3000:] for o in outputs)

    kept = wh.read(table_for("speedup_filtered_pairs"))
    by_threshold = {key: sorted(kept.filter(kept["threshold_key"] == key)["uuid"].to_list())
                    for key in ("1.5", "2.0", "3.0")}
    assert by_threshold == {"1.5": ["pair-2", "pair-3", "pair-4"], "2.0": kept_before, "3.0": ["pair-4"]}
    decisions = wh.read(table_for("speedup_filter_decisions"))
    assert sorted(decisions.group_by("threshold_key").len().rows()) == [("1.5", 5), ("2.0", 5), ("3.0", 5)]
    # Both runs are in the instance's history as materializations of their own partition.
    assert instance.get_materialized_partitions(keys.SPEEDUP_FILTERED_PAIRS) == {"1.5", "2.0", "3.0"}
