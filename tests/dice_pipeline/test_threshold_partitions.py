"""Threshold partitions added in the UI follow the command line's canonical rule: `2` and `2.00` become `2.0`,
a key that names no threshold is deleted; the sensor does it while the UI runs."""

import dagster as dg

from assets import keys
from assets.sensors import threshold_partition_keys
from dice_pipeline.threshold_partitions import canonicalise_threshold_partitions

NAME = keys.THRESHOLD_PARTITIONS.name


def test_non_canonical_keys_are_replaced_and_invalid_ones_deleted():
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(NAME, ["1.5", "2", "2.00", "abc", "-1", "0", "3.50"])
        changes = canonicalise_threshold_partitions(instance, NAME)
        assert sorted(instance.get_dynamic_partitions(NAME)) == ["1.5", "2.0", "3.5"]
        assert len(changes) == 6 and "threshold partition 'abc' deleted" in " ".join(changes)
        assert canonicalise_threshold_partitions(instance, NAME) == []


def test_the_sensor_tidies_the_partitions_without_launching_anything():
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(NAME, ["2.0", "2"])
        with dg.build_sensor_context(instance=instance) as context:
            result = threshold_partition_keys(context)
        assert isinstance(result, dg.SkipReason) and "'2' replaced by '2.0'" in result.skip_message
        assert instance.get_dynamic_partitions(NAME) == ["2.0"]
