-- Views that answer the lineage questions users ask. Recreated after every write of a stage table.
-- lineage.builds (a table, see warehouse/connection.py) records each table's and partition's source.
CREATE SCHEMA IF NOT EXISTS lineage;

-- Every table and partition with the source (and content hash) it was built from. `stale`: built from another
-- source or content than the table it derives from holds now (e.g. a threshold partition built before the ingested
-- source changed), so mixed-source partitions are visible instead of silently side by side.
-- e.g. SELECT table_name, partition_key, source_name FROM lineage.table_sources WHERE stale;
CREATE OR REPLACE VIEW lineage.table_sources AS
SELECT
    b.table_name,
    b.partition_key,
    b.source_name,
    b.source_sha256,
    b.derived_from,
    u.source_name AS upstream_source_name,
    u.source_sha256 AS upstream_source_sha256,
    coalesce(b.derived_from IS NOT NULL AND (
        u.table_name IS NULL
        OR b.source_name IS DISTINCT FROM u.source_name
        OR b.source_sha256 IS DISTINCT FROM u.source_sha256), false) AS stale,
    b.run_id,
    b.written_at
FROM lineage.builds b
LEFT JOIN lineage.builds u ON u.table_name = b.derived_from AND u.partition_key = ''
ORDER BY b.table_name, b.partition_key;

-- Every ingested pair, its verification verdict, and the speedup the filter would use for it.
CREATE OR REPLACE VIEW lineage.pair_verification AS
SELECT
    p.uuid,
    p.problem_name,
    p.source_name,
    p.source_row,
    p.speedup_over_eager AS recorded_speedup,
    v.status AS verification_status,
    v.executed,
    v.measured_speedup,
    v.reason_codes,
    v.flags,
    v.verifier_version,
    v.gpu_name,
    v.verdict_id
FROM ingest.concur_pairs p
LEFT JOIN verify.verified_pairs v USING (uuid);

-- Per threshold: each pair's filter decision with its source row and both speedups.
-- e.g. SELECT * FROM lineage.filter_lineage WHERE threshold_key = '2.0' AND kept;
CREATE OR REPLACE VIEW lineage.filter_lineage AS
SELECT
    d.threshold_key,
    d.threshold,
    d.uuid,
    p.problem_name,
    p.source_name,
    p.source_row,
    d.kept,
    d.reason_code,
    d.speedup_used,
    d.speedup_source,
    p.speedup_over_eager AS recorded_speedup,
    v.measured_speedup,
    d.verification_status,
    d.verdict_id,
    b.source_name AS partition_source_name,
    b.source_sha256 AS partition_source_sha256,
    coalesce(b.stale, true) AS partition_stale
FROM filter.speedup_filter_decisions d
LEFT JOIN ingest.concur_pairs p USING (uuid)
LEFT JOIN verify.verified_pairs v USING (uuid)
LEFT JOIN lineage.table_sources b ON b.table_name = 'speedup_filter_decisions' AND b.partition_key = d.threshold_key;

-- Counts per threshold: kept, and dropped by reason. Thresholds materialised side by side appear as rows, each with
-- the source it was built from and whether that is still the ingested one.
CREATE OR REPLACE VIEW lineage.threshold_summary AS
SELECT d.threshold_key, d.threshold, d.reason_code, count(*) AS pairs,
       any_value(b.source_name) AS partition_source_name, coalesce(any_value(b.stale), true) AS partition_stale
FROM filter.speedup_filter_decisions d
LEFT JOIN lineage.table_sources b ON b.table_name = 'speedup_filter_decisions' AND b.partition_key = d.threshold_key
GROUP BY d.threshold_key, d.threshold, d.reason_code
ORDER BY d.threshold, d.reason_code;

-- Every rejection anywhere in the pipeline, one row each: its stage, its reason (reason_code; the threshold decision's
-- codes are one vocabulary: dice_pipeline/thresholds.py), the verifier's status apart (verification_status), and
-- whether the table or threshold partition it belongs to was built from another source than the one ingested now
-- (partition_stale; such a partition is kept beside the current ones until rebuilt). `uuid` is the ConCuR uuid, or
-- a synthesized candidate's own id. Curate: CuKe's rejects (kernelbench_overlap ones are the decontamination drops,
-- their rule and scores in the message) and the samples the kernel-infilling split could not take.
-- e.g. SELECT stage, reason_code, count(*) FROM lineage.rejections WHERE NOT partition_stale GROUP BY ALL;
CREATE OR REPLACE VIEW lineage.rejections AS
SELECT 'ingest' AS stage, NULL::VARCHAR AS threshold_key, r.uuid, r.source_name, r.source_row, r.reason_code,
       NULL::VARCHAR AS verification_status, r.message, coalesce(b.stale, false) AS partition_stale
FROM ingest.concur_rejects r
LEFT JOIN lineage.table_sources b ON b.table_name = 'concur_rejects' AND b.partition_key = ''
UNION ALL
SELECT 'verify', NULL, v.uuid, p.source_name, p.source_row,
       -- the threshold decision's rule: the verifier's rejections, or no usable verdict (judge again)
       CASE WHEN v.status = 'infrastructure_error' THEN 'not_executed' ELSE 'failed_verification' END, v.status,
       array_to_string(v.reason_codes, ','), coalesce(b.stale, false)
FROM verify.verified_pairs v
LEFT JOIN ingest.concur_pairs p USING (uuid)
LEFT JOIN lineage.table_sources b ON b.table_name = 'verified_pairs' AND b.partition_key = ''
WHERE v.status NOT IN ('correct', 'not_executed')
UNION ALL
SELECT 'filter', d.threshold_key, d.uuid, p.source_name, p.source_row, d.reason_code, d.verification_status,
       CASE WHEN d.speedup_used IS NULL THEN 'no speedup to compare with the threshold'
            ELSE format('speedup {} ({}) against threshold {}', round(d.speedup_used, 3), d.speedup_source,
                        d.threshold_key) END,
       coalesce(b.stale, true)
FROM filter.speedup_filter_decisions d
LEFT JOIN ingest.concur_pairs p USING (uuid)
LEFT JOIN lineage.table_sources b ON b.table_name = 'speedup_filter_decisions' AND b.partition_key = d.threshold_key
WHERE NOT d.kept
UNION ALL
SELECT 'synthesis', NULL, s.job_id, s.generator_backend, s.candidate_index, s.reject_reason, s.status,
       s.reject_message, coalesce(b.stale, false)
FROM synthesis.structure_instances s
LEFT JOIN lineage.table_sources b ON b.table_name = 'structure_instances' AND b.partition_key = ''
WHERE NOT s.kept
UNION ALL
SELECT 'curate', c.cuke_threshold_key, c.source_id, coalesce(p.source_name, c.source), p.source_row, c.reason_code,
       coalesce(v.status, so.status, si.status), c.message, coalesce(b.stale, true)
FROM cuke.cuke_sft_rejects c
LEFT JOIN ingest.concur_pairs p ON c.source = 'concur' AND p.uuid = c.source_id
LEFT JOIN verify.verified_pairs v ON c.source = 'concur' AND v.uuid = c.source_id
LEFT JOIN synthesis.synthetic_operator_pairs so ON c.source = 'synthetic' AND so.task_id = c.source_id
LEFT JOIN synthesis.structure_instances si ON c.source = 'structure' AND si.job_id = c.source_id
LEFT JOIN lineage.table_sources b ON b.table_name = 'cuke_sft_rejects' AND b.partition_key = c.cuke_threshold_key
UNION ALL
SELECT 'curate', i.cuke_threshold_key, sa.source_id, sa.source_name, sa.source_row, i.reason_code,
       sa.verification_status, i.message, coalesce(b.stale, true)
FROM cuke.cuke_infilling_rejects i
LEFT JOIN cuke.cuke_sft_samples sa ON sa.cuke_threshold_key = i.cuke_threshold_key AND sa.sample_id = i.row_id
LEFT JOIN lineage.table_sources b ON b.table_name = 'cuke_infilling_rejects' AND b.partition_key = i.cuke_threshold_key;

-- KernelBench evaluation, per task: what the model answered, the verdict, the task's known issues and the baseline
-- measured here. e.g. SELECT * FROM lineage.kernelbench_task_drilldown WHERE checkpoint = 'sft' AND level = 1;
CREATE OR REPLACE VIEW lineage.kernelbench_task_drilldown AS
SELECT
    r.checkpoint,
    r.level,
    r.task_key,
    r.sample_index,
    r.status,
    r.executed,
    r.correct_at_1e2,
    r.correct_at_1e4,
    r.speedup_gpu,
    r.speedup_host,
    r.speedup_vs_eager_baseline,
    r.speedup_vs_compile,
    r.reason_codes,
    r.flags,
    t.known_issues,
    r.has_code,
    r.finish_reason,
    r.completion_tokens,
    b.status AS baseline_status,
    b.eager_ms_gpu AS baseline_eager_ms_gpu,
    b.compile_ms_gpu AS baseline_compile_ms_gpu,
    b.gpu_name AS baseline_gpu,
    r.gpu_name AS verdict_gpu,
    r.generator_model,
    r.eval_partition_key,
    r.candidate_code,
    t.code AS reference_code
FROM eval.kernelbench_eval_results r
LEFT JOIN eval.kernelbench_tasks t ON t.level = r.level AND t.task_key = r.task_key
LEFT JOIN eval.kernelbench_baselines b ON b.task_key = r.task_key;
