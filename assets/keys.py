"""Asset keys and partition definitions: part of the public API (tests snapshot them; renames break users)."""

import dagster as dg

CONCUR_PAIRS = dg.AssetKey("concur_pairs")
CONCUR_REJECTS = dg.AssetKey("concur_rejects")
VERIFIED_PAIRS = dg.AssetKey("verified_pairs")
SPEEDUP_FILTERED_PAIRS = dg.AssetKey("speedup_filtered_pairs")
SPEEDUP_FILTER_DECISIONS = dg.AssetKey("speedup_filter_decisions")

# One partition per speedup threshold, keyed canonically ("2.0"): every threshold's table lives side by side.
THRESHOLD_PARTITIONS = dg.DynamicPartitionsDefinition(name="speedup_threshold")

GROUP_INGEST = "ingest"
GROUP_VERIFY = "verify"
GROUP_FILTER = "filter"
GROUP_SYNTHESIS = "synthesis"
GROUP_CUKE = "cuke"
