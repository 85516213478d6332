"""The threshold partitions in the Dagster instance follow the one canonical rule (dice_pipeline.thresholds): a key
added in the UI as `2` or `2.00` is replaced by `2.0`, and one that names no threshold (`abc`, `-1`) is deleted, so
neither stays listed as a failed partition. `dice run`, `dice dev` and a sensor in the code location apply it.
"""

from __future__ import annotations

from dice_pipeline.thresholds import SpeedupThreshold, ThresholdError


def canonicalise_threshold_partitions(instance, partitions_name: str) -> list[str]:
    """Delete every non-canonical or invalid key of the dynamic partitions `partitions_name` and add the canonical
    spelling where there is one. Returns one line per change (empty when every key was canonical)."""
    keys = list(instance.get_dynamic_partitions(partitions_name))
    present = set(keys)
    changes = []
    for key in keys:
        try:
            SpeedupThreshold.from_partition_key(key)
            continue
        except ThresholdError as exc:
            canonical = exc.canonical
        if canonical is not None and canonical not in present:
            instance.add_dynamic_partitions(partitions_name, [canonical])
            present.add(canonical)
        instance.delete_dynamic_partition(partitions_name, key)
        present.discard(key)
        changes.append(f"threshold partition {key!r} replaced by {canonical!r}" if canonical is not None
                       else f"threshold partition {key!r} deleted: it names no positive speedup threshold")
    return changes


def replace_bad_partition(instance, partitions_name: str, key: str, error: ThresholdError) -> str:
    """What a run for a bad threshold partition does before it fails: the key is deleted (its canonical spelling
    added) so the partition does not stay listed. Returns the one line the run fails with."""
    if key in set(instance.get_dynamic_partitions(partitions_name)):
        if error.canonical is not None:
            instance.add_dynamic_partitions(partitions_name, [error.canonical])
        instance.delete_dynamic_partition(partitions_name, key)
    if error.canonical is not None:
        return f"{error}: partition {key!r} was replaced by {error.canonical!r}; launch that one"
    return f"{error}: partition {key!r} was deleted; add a positive number such as 1.5"
