"""lineage.rejections: every rejection of every stage (the curate stage included), its reason apart from the
verifier's status, and a flag on the rows of tables or partitions built from another source than the current one."""

import polars as pl

from warehouse import Provenance, Warehouse, install_lineage_views, table_for

A, OLD = "jsonl:/data/a.jsonl", "jsonl:/data/old.jsonl"


def _write(wh, table, rows, partition=None, source=A):
    spec = table_for(table)
    frame = pl.DataFrame([{name: row.get(name) for name in spec.schema.names()} for row in rows], schema=spec.schema)
    derived = None if table == "concur_pairs" else "concur_pairs"
    wh.write(spec, frame, partition_key=partition, provenance=Provenance(source, "sha-" + source, derived))


def test_every_stage_reason_and_staleness(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    _write(wh, "concur_pairs", [{"uuid": u, "source_name": A, "source_row": i} for i, u in enumerate("abcd")])
    _write(wh, "concur_rejects", [{"uuid": "z", "source_name": A, "source_row": 3, "reason_code": "no_model_new",
                                   "message": "generated_code defines no top-level class ModelNew"}])
    _write(wh, "verified_pairs", [
        {"uuid": "a", "status": "incorrect", "reason_codes": ["output_mismatch"], "flags": []},
        {"uuid": "b", "status": "correct", "reason_codes": [], "flags": []},
        {"uuid": "c", "status": "not_executed", "reason_codes": [], "flags": []},
        {"uuid": "d", "status": "infrastructure_error", "reason_codes": ["worker_lost"], "flags": []},
    ])
    decision = {"kept": False, "speedup_source": "recorded"}
    for key, source in (("2.0", A), ("1.5", OLD)):  # 1.5 was built before the source changed
        _write(wh, "speedup_filter_decisions", [
            {**decision, "threshold_key": key, "uuid": "a", "reason_code": "failed_verification",
             "verification_status": "incorrect"},
            {**decision, "threshold_key": key, "uuid": "c", "reason_code": "below_threshold", "speedup_used": 1.2,
             "verification_status": "not_executed"},
            {"threshold_key": key, "uuid": "b", "kept": True, "reason_code": "kept", "verification_status": "correct"},
        ], partition=key, source=source)
    _write(wh, "structure_instances", [{"job_id": "norm#0", "generator_backend": "template", "candidate_index": 0,
                                        "kept": False, "reject_reason": "not_executed", "status": "not_executed"}])
    _write(wh, "cuke_sft_samples", [{"cuke_threshold_key": "2.0", "sample_id": "s1", "source": "concur",
                                     "source_id": "b", "source_name": A, "source_row": 1,
                                     "verification_status": "correct"}], partition="2.0")
    _write(wh, "cuke_sft_rejects", [
        {"cuke_threshold_key": "2.0", "source": "concur", "source_id": "c", "reason_code": "kernelbench_overlap",
         "message": "matches L1/19_ReLU by exact_normalized", "kernelbench_task": "L1/19_ReLU"},
        {"cuke_threshold_key": "2.0", "source": "synthetic", "source_id": "softmax/x/1", "reason_code": "not_executed",
         "message": "not executed"},
    ], partition="2.0")
    _write(wh, "cuke_infilling_rejects", [{"cuke_threshold_key": "2.0", "row_id": "s1", "reason_code": "no_cuda_source",
                                           "message": "no CUDA source string"}], partition="2.0")
    install_lineage_views(wh)

    rows = wh.query("SELECT stage, threshold_key, uuid, source_row, reason_code, verification_status, "
                    "partition_stale FROM lineage.rejections ORDER BY ALL").rows()
    assert rows == [
        ("curate", "2.0", "b", 1, "no_cuda_source", "correct", False),  # the infilling split's reject
        ("curate", "2.0", "c", 2, "kernelbench_overlap", "not_executed", False),  # a decontamination drop
        ("curate", "2.0", "softmax/x/1", None, "not_executed", None, False),
        ("filter", "1.5", "a", 0, "failed_verification", "incorrect", True),  # built from the old source
        ("filter", "1.5", "c", 2, "below_threshold", "not_executed", True),
        ("filter", "2.0", "a", 0, "failed_verification", "incorrect", False),
        ("filter", "2.0", "c", 2, "below_threshold", "not_executed", False),
        ("ingest", None, "z", 3, "no_model_new", None, False),
        ("synthesis", None, "norm#0", 0, "not_executed", "not_executed", False),
        # the verifier's status is its own column; the reason is the shared vocabulary's
        ("verify", None, "a", 0, "failed_verification", "incorrect", False),
        ("verify", None, "d", 3, "not_executed", "infrastructure_error", False),  # no judgement made: judge again
    ]
    messages = dict(wh.query("SELECT stage || ':' || coalesce(threshold_key, '') || ':' || uuid, message "
                             "FROM lineage.rejections").rows())
    assert messages["verify::a"] == "output_mismatch"
    assert messages["filter:2.0:c"] == "speedup 1.2 (recorded) against threshold 2.0"
    assert messages["curate:2.0:c"].startswith("matches L1/19_ReLU")
    # Only the current rejections, as the README's query reads them:
    current = dict(wh.query("SELECT stage, count(*) FROM lineage.rejections WHERE NOT partition_stale "
                            "GROUP BY ALL").rows())
    assert current == {"ingest": 1, "verify": 2, "filter": 2, "synthesis": 1, "curate": 3}
