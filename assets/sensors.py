"""Housekeeping sensors that keep the UI truthful while `dagster dev` runs (the daemon evaluates them): threshold
partitions added with a non-canonical or invalid key are replaced or deleted, and runs whose process is gone are
ended (canceled: dice_pipeline/run_health.py says why). `dice run` and `dice dev` apply the same functions when they start."""

import dagster as dg

from assets import keys
from dice_pipeline.run_health import end_orphaned_runs
from dice_pipeline.threshold_partitions import canonicalise_threshold_partitions


@dg.sensor(minimum_interval_seconds=5, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Replaces a threshold partition added as `2` or `2.00` by `2.0`, and deletes one that names "
                       "no positive threshold, so it does not stay listed (failed) in the UI.")
def threshold_partition_keys(context: dg.SensorEvaluationContext):
    changes = canonicalise_threshold_partitions(context.instance, keys.THRESHOLD_PARTITIONS.name)
    for change in changes:
        context.log.info(change)
    return dg.SkipReason("; ".join(changes) or "every threshold partition key is canonical")


@dg.sensor(minimum_interval_seconds=15, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Ends a run whose process is gone (killed, or its machine restarted) as canceled, so it "
                       "does not stay 'Started' forever.")
def orphaned_runs(context: dg.SensorEvaluationContext):
    marked = end_orphaned_runs(context.instance)
    for line in marked:
        context.log.info(line)
    return dg.SkipReason("; ".join(marked) or "no run in progress has lost its process")


SENSORS = [threshold_partition_keys, orphaned_runs]
