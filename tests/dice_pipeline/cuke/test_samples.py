"""CuKe SFT samples: prompt/response shape, lineage, rejects with reasons, deduplication, decontamination, export."""

from __future__ import annotations

import json

import datasets
import polars as pl
import pytest

from dice_pipeline.paths import kernelbench_tasks_path
from dice_pipeline.cuke.decontaminate import KernelBenchIndex
from dice_pipeline.cuke.export import build_lineage, composition_table, export_cuke, length_distributions
from dice_pipeline.cuke.samples import CUKE_SFT_SAMPLES, build_sft_samples
from dice_pipeline.prompts import extract_code_block
from dice_pipeline.schemas import SPEEDUP_FILTERED_PAIRS
from dice_pipeline.verify import VERIFIER_VERSION

KERNELBENCH_TASKS = kernelbench_tasks_path()

REFERENCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) * 2.0 + 1.0


def get_inputs():
    return [torch.rand(4096, 4096)]


def get_init_inputs():
    return []
"""

KERNEL = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
__global__ void fused_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f) * 2.f + 1.f;
}
torch::Tensor fused(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    fused_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

cpp_src = "torch::Tensor fused(torch::Tensor x);"
ext = load_inline(name="fused", cpp_sources=cpp_src, cuda_sources=source, functions=["fused"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.fused(x)
'''

KERNELBENCH_SOFTMAX_COPY = '''import torch
import torch.nn as nn

class Model(nn.Module):
    """A softmax."""
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)

batch_size = 4000
dim = 390000

def get_inputs():
    x = torch.rand(batch_size, dim)
    return [x]

def get_init_inputs():
    return []
'''


def pair(
    uuid: str, reference: str = REFERENCE, kernel: str = KERNEL, speedup: float = 2.5, think=None, status="not_executed"
):
    return {
        "threshold_key": "2.0",
        "threshold": 2.0,
        "uuid": uuid,
        "problem_name": f"problem_{uuid}",
        "pytorch_code": reference,
        "generated_code": kernel,
        "generated_think": think,
        "speedup_used": speedup,
        "speedup_source": "recorded",
        "verification_status": status,
        "verdict_id": f"verdict-{uuid}",
        "source_name": "embedded",
        "source_row": int(uuid.strip("u")) if uuid.strip("u").isdigit() else 0,
    }


def pairs_frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=SPEEDUP_FILTERED_PAIRS)


def test_samples_have_chat_prompt_fenced_response_and_lineage():
    build = build_sft_samples(pairs_frame([pair("u1", think="Fuse relu, scale and shift.")]), None, threshold=2.0)
    assert build.samples.schema == CUKE_SFT_SAMPLES
    sample = build.samples.row(0, named=True)
    messages = json.loads(sample["prompt_messages"])
    assert [m["role"] for m in messages] == ["system", "user"]
    assert sample["prompt"].startswith("<|im_start|>system\n") and sample["prompt"].endswith("<|im_start|>assistant\n")
    assert REFERENCE.strip() in sample["prompt"]
    assert sample["response"].startswith("<think>\nFuse relu, scale and shift.\n</think>\n\n```python\n")
    assert extract_code_block(sample["response"]) == KERNEL
    assert (sample["source"], sample["source_id"], sample["verdict_id"]) == ("concur", "u1", "verdict-u1")
    assert (sample["threshold"], sample["speedup_used"], sample["verification_status"]) == (2.0, 2.5, "not_executed")
    assert sample["op_family"] == "elementwise" and sample["difficulty"] in (0, 1)
    assert build.counts["not_executed"] == 1


def test_reasoning_can_be_left_out():
    build = build_sft_samples(pairs_frame([pair("u1", think="plan")]), None, threshold=2.0, include_reasoning=False)
    sample = build.samples.row(0, named=True)
    assert sample["response"].startswith("```python\n") and not sample["has_reasoning"]


def test_duplicates_after_normalisation_keep_the_fastest_and_are_counted():
    reformatted = KERNEL.replace("class ModelNew(nn.Module):", "# tuned\nclass ModelNew(nn.Module):  # fast")
    rows = [
        pair("u1", speedup=2.1),
        pair("u2", kernel=reformatted, speedup=3.0),
        pair("u3", kernel=KERNEL.replace("2.f", "3.f")),
    ]
    build = build_sft_samples(pairs_frame(rows), None, threshold=2.0)
    assert sorted(build.samples["source_id"].to_list()) == ["u2", "u3"]
    duplicate = build.rejects.row(0, named=True)
    assert (duplicate["source_id"], duplicate["reason_code"]) == ("u1", "duplicate")
    assert build.counts["duplicates_dropped"] == 1


def test_bad_candidates_are_rejected_with_reasons_and_rows_are_conserved():
    rows = [
        pair("u1"),
        pair("u2", speedup=1.5),
        pair("u3", status="incorrect"),
        pair("u4", kernel="   "),
        pair("u5", kernel="print('no kernel class here')\n"),
    ]
    build = build_sft_samples(pairs_frame(rows), None, threshold=2.0)
    reasons = dict(build.rejects.select("source_id", "reason_code").iter_rows())
    assert reasons == {"u2": "below_threshold", "u3": "failed_verification", "u4": "empty_code", "u5": "no_modelnew"}
    assert build.samples.height + build.rejects.height == len(rows)


def test_structure_instances_join_with_their_family_and_unkept_ones_are_rejected():
    instances = pl.DataFrame(
        {
            "candidate_id": ["s1", "s2"],
            "task_id": ["swiglu__b2", "swiglu__b4"],
            "family": ["swiglu_mlp", "swiglu_mlp"],
            "pytorch_code": [REFERENCE.replace("* 2.0", "* 3.0"), REFERENCE.replace("* 2.0", "* 4.0")],
            "generated_code": [KERNEL.replace("2.f", "3.f"), KERNEL.replace("2.f", "4.f")],
            "speedup": [2.4, 2.6],
            "status": ["correct", "correct"],
            "verdict_id": ["v1", "v2"],
            "kept": [True, False],
            "generator": ["templates", "templates"],
        }
    )
    build = build_sft_samples(pairs_frame([pair("u1")]), instances, threshold=2.0)
    structure = build.samples.filter(pl.col("source") == "structure").row(0, named=True)
    assert (structure["source_id"], structure["op_family"], structure["source_name"]) == (
        "s1",
        "swiglu_mlp",
        "templates",
    )
    assert (structure["speedup_source"], structure["threshold"]) == ("measured", 2.0)
    assert build.rejects.row(0, named=True)["reason_code"] == "not_kept_by_synthesis"
    assert build.counts["candidates_by_source"] == {"concur": 1, "structure": 2}


@pytest.mark.skipif(KERNELBENCH_TASKS is None, reason="KernelBench tasks.jsonl absent")
def test_kernelbench_copy_is_decontaminated_and_named():
    rows = [pair("u1"), pair("u2", reference=KERNELBENCH_SOFTMAX_COPY, kernel=KERNEL.replace("2.f", "5.f"))]
    build = build_sft_samples(pairs_frame(rows), None, threshold=2.0, kernelbench_index=KernelBenchIndex.from_path())
    assert build.samples["source_id"].to_list() == ["u1"]
    dropped = build.rejects.row(0, named=True)
    assert (dropped["source_id"], dropped["reason_code"], dropped["kernelbench_task"]) == (
        "u2",
        "kernelbench_overlap",
        "L1/23_Softmax",
    )
    assert build.counts["decontaminated"] == 1 and build.decontamination_drops.height == 1


def test_export_round_trips_through_load_from_disk_and_parquet(tmp_path):
    rows = [pair("u1", think="t"), pair("u2", kernel=KERNEL.replace("2.f", "3.f"), speedup=4.0)]
    build = build_sft_samples(pairs_frame(rows), None, threshold=2.0)
    decontamination = {"checked": 2, "dropped": 0, "by_rule": {}, "by_kernelbench_level": {}, "config": {}}
    lineage = build_lineage(build.samples, build.counts, decontamination)
    export = export_cuke(build.samples, tmp_path / "cuke", lineage, count_tokens=lambda text: len(text.split()))
    loaded = datasets.load_from_disk(str(export.hf_dataset_dir))
    assert loaded.num_rows == 2 and set(loaded.column_names) == set(CUKE_SFT_SAMPLES.names())
    assert sorted(loaded["source_id"]) == ["u1", "u2"]
    assert pl.read_parquet(export.parquet_path).height == 2
    card = export.card_path.read_text()
    assert card.startswith("---\n") and "num_examples: 2" in card and f"Verifier version: {VERIFIER_VERSION}" in card
    assert "Decontamination against KernelBench" in card and "not_executed" in card
    assert json.loads((tmp_path / "cuke" / "lineage.json").read_text())["counts"]["samples"] == 2


def test_composition_and_lengths_are_data():
    rows = [pair("u1"), pair("u2", kernel=KERNEL.replace("2.f", "3.f"))]
    samples = build_sft_samples(pairs_frame(rows), None, threshold=2.0).samples
    table = composition_table(samples)
    assert table.columns == ["source", "op_family", "difficulty", "samples"] and table["samples"].sum() == 2
    lengths = length_distributions(samples, bins=4)
    assert lengths["prompt_chars"]["count"] == 2 and sum(lengths["response_chars"]["counts"]) == 2
    assert lengths["response_chars"]["min"] <= lengths["response_chars"]["p50"] <= lengths["response_chars"]["max"]
