"""The code location loads, every asset is documented and grouped, and asset keys do not change by accident."""

import subprocess
import sys
from pathlib import Path

from dice_pipeline import definitions

ROOT = Path(__file__).resolve().parents[2]

# Asset keys are public API: renaming one breaks users' runs, lineage and queries. Update on purpose only.
EXPECTED_ASSET_KEYS = sorted([
    "concur_pairs",
    "concur_rejects",
    "verified_pairs",
    "speedup_filtered_pairs",
    "speedup_filter_decisions",
    "structure_instances",
    "synthetic_operator_candidates",
    "synthetic_operator_pairs",
    "distilled_pairs",
    "cuke_sft_samples",
    "cuke_sft_rejects",
    "cuke_decontamination_drops",
    "cuke_infilling_tasks",
    "cuke_infilling_rejects",
    "cuke_hf_dataset",
    "rl_end_to_end_tasks",
    "kernelbench_tasks",
    "kernelbench_baselines",
    "kernelbench_eval_results",
    "kernelbench_eval_sanity",
    "kernelbench_eval_metrics",
    "kernelbench_comparison_report",
    "converted_base_checkpoint",
    "sft_checkpoint",
    "rl_infilling_checkpoint",
    "rl_end_to_end_checkpoint",
])


def test_asset_keys_snapshot():
    keys = sorted(key.to_user_string() for key in definitions.defs.resolve_all_asset_keys())
    assert keys == EXPECTED_ASSET_KEYS


def test_every_asset_has_docs_group_kinds_and_code_version():
    graph = definitions.defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        assert node.description, f"{key} has no description"
        assert node.group_name and node.group_name != "default", f"{key} has no group"
        assert node.kinds, f"{key} declares no kinds"
        assert node.code_version, f"{key} has no code_version"


def test_dagster_definitions_validate_passes(tmp_path):
    env = {"DAGSTER_HOME": str(tmp_path), "PATH": str(Path(sys.executable).parent)}
    (tmp_path / "dagster.yaml").write_text((ROOT / "dice_pipeline" / "dagster.yaml").read_text())
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", str(ROOT / "workspace.yaml")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_training_has_its_own_job_and_is_not_part_of_the_data_build():
    main_keys = definitions.defs.resolve_job_def("dice_main").asset_layer.selected_asset_keys
    training_keys = definitions.defs.resolve_job_def("dice_training").asset_layer.selected_asset_keys
    names = {key.to_user_string() for key in training_keys}
    assert names == {"converted_base_checkpoint", "sft_checkpoint", "rl_infilling_checkpoint",
                     "rl_end_to_end_checkpoint"}
    assert not main_keys & training_keys and {k.to_user_string() for k in main_keys} >= {"cuke_sft_samples"}
