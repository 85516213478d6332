"""What a person reads on the asset pages: every column described, the threshold named by its canonical key, no
counts of conventions where nothing was measured, check plots that never join two partitions, and training curves
whose titles do not overlap."""

import json

import dagster as dg
import polars as pl
import pytest

from assets.column_descriptions import TABLE_COLUMN_DESCRIPTIONS
from assets.filtering import measured_conventions_metadata
from assets.metadata import column_description, column_schema, curves_figure
from assets.training import RL_PANELS
from warehouse.tables import TABLES


def test_every_column_of_every_table_is_described():
    undescribed = [f"{name}.{column}" for name, spec in TABLES.items() for column in spec.schema.names()
                   if not column_description(column, name)]
    assert undescribed == []
    assert set(TABLE_COLUMN_DESCRIPTIONS) <= set(TABLES)  # a table's own meanings name a real table
    baselines = {c.name: c.description for c in column_schema(TABLES["kernelbench_baselines"].schema,
                                                              "kernelbench_baselines").columns}
    assert baselines["status"].startswith("the measurement: measured")  # not the verifier's statuses


def _decisions(sources):
    return pl.DataFrame({"speedup_source": sources,
                         "speedup_convention": ["gpu" if s else None for s in sources]},
                        schema={"speedup_source": pl.String, "speedup_convention": pl.String})


def test_conventions_are_counted_only_for_what_was_measured():
    nothing = measured_conventions_metadata(_decisions(["recorded"] * 33 + [None] * 7))
    assert nothing == ("none measured (no GPU verdict): 33 decisions use the source's recorded speedup, 7 had none")
    some = measured_conventions_metadata(_decisions(["measured", "measured", "recorded", None]))
    assert isinstance(some, dg.JsonMetadataValue) and some.data == {"gpu": 2}


@pytest.mark.parametrize("key", ["1.5", "2.0"])
def test_the_filters_check_numbers_and_threshold_are_per_partition(key, tmp_path, pair_factory, cpu_resources):
    from assets import keys
    from dice_pipeline import definitions

    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(keys.THRESHOLD_PARTITIONS.name, [key])
    source = tmp_path / "pairs.jsonl"
    source.write_text(json.dumps(pair_factory(0, speedup=3.0)) + "\n")
    resources = cpu_resources(str(tmp_path / "w.duckdb"))
    run_config = {"ops": {"concur_ingestion": {"config": {"source": str(source)}}}}
    upstream = [keys.CONCUR_PAIRS, keys.CONCUR_REJECTS, keys.VERIFIED_PAIRS]
    assert dg.materialize(definitions.ALL_ASSETS, selection=upstream, instance=instance, resources=resources,
                          run_config=run_config).success
    result = dg.materialize(definitions.ALL_ASSETS, selection=[keys.SPEEDUP_FILTERED_PAIRS,
                                                               keys.SPEEDUP_FILTER_DECISIONS],
                            instance=instance, resources=resources, partition_key=key)
    (filtered,) = [e.materialization for e in result.get_asset_materialization_events()
                   if e.asset_key == keys.SPEEDUP_FILTERED_PAIRS]
    assert filtered.metadata["threshold"].value == key  # "2.0", not the number 2
    assert filtered.metadata["speedup_conventions"].value.startswith("none measured")
    for check in result.get_asset_check_evaluations():
        numbers = {k for k, v in check.metadata.items() if isinstance(v, (dg.IntMetadataValue, dg.FloatMetadataValue))}
        # a plot of a check's numbers is one series per metadata key: each key names its partition
        assert all(name.endswith(f"_at_{key}") for name in numbers), (check.check_name, numbers)
    non_empty = next(c for c in result.get_asset_check_evaluations() if c.check_name == "non_empty")
    assert non_empty.metadata[f"kept_at_{key}"].value == 1


def _text_boxes(fig, which):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in which if t.get_visible() and t.get_text()]


def test_training_curve_titles_do_not_overlap():
    history = [{"step": i, "reward_mean": 0.1 * i, "kl": 1e-6 * i, "loss": -0.002 + 1e-5 * i, "deceptive_share": 0.05,
                "deceptive_share_by_reason": {"baseline_kernel": 0.03, "host_compute": 0.02},
                "seconds_rollout": 1000.0 + i, "seconds_reward": 200.0, "seconds_reward_prepare": 50.0,
                "seconds_update": 300.0} for i in range(1, 21)]
    fig = curves_figure(history, RL_PANELS, "rl_end_to_end (20 steps)")
    titles = [fig._suptitle] + [ax.title for ax in fig.axes] + [ax.yaxis.get_offset_text() for ax in fig.axes]
    boxes = _text_boxes(fig, titles)
    assert len(boxes) >= 1 + len(RL_PANELS)
    clashes = [(a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1:] if box.overlaps(other)]
    assert clashes == []


@pytest.mark.parametrize("config_class", ["ConvertedBaseConfig", "SFTCheckpointConfig", "RLCheckpointConfig",
                                          "EvaluationConfig"])
def test_every_launchpad_field_of_training_and_evaluation_is_described(config_class):
    from dagster._config.pythonic_config import infer_schema_from_config_class

    import assets.evaluation
    import assets.training

    cls = getattr(assets.training, config_class, None) or getattr(assets.evaluation, config_class)
    fields = infer_schema_from_config_class(cls).config_type.fields
    assert fields and [name for name, field in fields.items() if not field.description] == []


def test_an_rl_checkpoint_that_learned_nothing_says_so_at_the_top():
    from assets.training import weights_update_metadata

    unchanged = weights_update_metadata({"optimizer_steps": 0, "rewarded_groups": 0}, "sft_checkpoint")
    assert unchanged["weights_updated"] is False
    assert "holds sft_checkpoint's weights unchanged" in unchanged["update"].value
    updated = weights_update_metadata({"optimizer_steps": 8, "rewarded_groups": 3}, "sft_checkpoint")
    assert updated == {"weights_updated": True, "update": "8 optimizer steps from 3 rewarded groups"}
