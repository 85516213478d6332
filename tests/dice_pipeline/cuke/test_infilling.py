"""The kernel-infilling split on varied real-looking load_inline files, its reject reasons, and the stage-1 tasks."""

from __future__ import annotations

import polars as pl
import pytest

from dice_pipeline.cuke.infilling import (
    REJECT_REASONS,
    InfillReject,
    InfillSplit,
    build_infilling_split,
    build_stage1_tasks,
    split_kernel_file,
)
from dice_pipeline.prompts import INFILL_MARKER

KERNEL = """
#include <torch/extension.h>

__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
IMPORTS = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
MODEL_NEW = """

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = ext

    def forward(self, x):
        return self.ext.relu_cuda(x)
"""
CPP = 'cpp_src = "torch::Tensor relu_cuda(torch::Tensor x);"\n'


def inline_call(var: str, ext: str = "ext", name: str = "relu") -> str:
    return (
        f'{ext} = load_inline(name="{name}", cpp_sources=cpp_src, cuda_sources={var}, '
        'functions=["relu_cuda"], verbose=False)\n'
    )


def paper_style(var="source", literal_prefix="") -> tuple[str, str]:
    middle = f'{var} = {literal_prefix}"""{KERNEL}"""\n'
    return IMPORTS + middle + "\n" + CPP + "\n" + inline_call(var) + MODEL_NEW, middle


@pytest.mark.parametrize("var", ["source", "cuda_source", "kernel_code", "relu_src"])
@pytest.mark.parametrize("literal_prefix", ["", "r", "R", "u"])
def test_split_paper_style_files_with_any_variable_name_and_str_prefix(var, literal_prefix):
    code, middle = paper_style(var, literal_prefix)
    split = split_kernel_file(code)
    assert isinstance(split, InfillSplit), split
    assert split.middle == middle and split.prefix == IMPORTS and split.source_variable == var
    assert split.prefix + split.middle + split.suffix == code
    assert "load_inline(" in split.suffix and "class ModelNew" in split.suffix


def test_cpp_prototypes_before_the_source_stay_in_the_prefix():
    middle = f'cuda_src = """{KERNEL}"""\n'
    code = IMPORTS + CPP + middle + inline_call("cuda_src") + MODEL_NEW
    split = split_kernel_file(code)
    assert isinstance(split, InfillSplit)
    assert split.prefix == IMPORTS + CPP and split.middle == middle


def test_keyword_list_and_positional_forms_of_cuda_sources():
    middle = f'source = """{KERNEL}"""\n'
    as_list = IMPORTS + middle + CPP + inline_call("[source]") + MODEL_NEW
    positional = (
        IMPORTS + middle + CPP + 'ext = load_inline("relu", cpp_src, source, functions=["relu_cuda"])\n' + MODEL_NEW
    )
    for code in (as_list, positional):
        split = split_kernel_file(code)
        assert isinstance(split, InfillSplit) and split.middle == middle


def test_two_load_inline_calls_sharing_one_source_split_at_that_source():
    middle = f'source = """{KERNEL}"""\n'
    code = IMPORTS + middle + CPP + inline_call("source", "ext") + inline_call("source", "ext2", "relu2") + MODEL_NEW
    split = split_kernel_file(code)
    assert isinstance(split, InfillSplit) and split.middle == middle


def test_trailing_comment_crlf_docstring_and_torch_utils_attribute_call():
    middle = f'source = """{KERNEL}"""  # the kernels\r\n'.replace("\n", "\r\n").replace("\r\r\n", "\r\n")
    header = '"""Fused relu."""\r\nimport torch\r\nimport torch.utils.cpp_extension\r\n'
    suffix = (
        CPP.replace("\n", "\r\n")
        + 'ext = torch.utils.cpp_extension.load_inline(name="r", cpp_sources=cpp_src, cuda_sources=source)\r\n'
        + MODEL_NEW.replace("\n", "\r\n")
    )
    code = header + middle + suffix
    split = split_kernel_file(code)
    assert isinstance(split, InfillSplit), split
    assert (split.prefix, split.middle, split.suffix) == (header, middle, suffix)


def test_parenthesised_multiline_assignment_is_one_middle():
    middle = f'source = (\n    """{KERNEL}"""\n)\n'
    code = IMPORTS + middle + CPP + inline_call("source") + MODEL_NEW
    split = split_kernel_file(code)
    assert isinstance(split, InfillSplit) and split.middle == middle


def test_load_inline_inside_modelnew_init_may_follow_nothing_special():
    middle = f'source = """{KERNEL}"""\n'
    lazy = (
        "\n\nclass ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.ext = " + inline_call("source").split(" = ", 1)[1].replace("\n", "") + "\n"
        "\n    def forward(self, x):\n        return self.ext.relu_cuda(x)\n"
    )
    code = IMPORTS + CPP + middle + lazy
    split = split_kernel_file(code)
    assert isinstance(split, InfillSplit) and split.middle == middle


REJECTS = {
    "unparseable": IMPORTS + "def broken(:\n",
    "no_load_inline": IMPORTS + "class ModelNew(nn.Module):\n    pass\n",
    "loads_source_file": IMPORTS
    + "from torch.utils.cpp_extension import load\next = load(name='k', sources=['k.cu'])\n",
    "no_cuda_sources_argument": IMPORTS + 'ext = load_inline(name="r", cpp_sources="int f();")\n',
    "inline_source_literal": IMPORTS + f'ext = load_inline(name="r", cpp_sources="", cuda_sources="""{KERNEL}""")\n',
    "computed_source_reference": IMPORTS + 'ext = load_inline(name="r", cpp_sources="", cuda_sources=srcs["relu"])\n',
    "multiple_cuda_sources": IMPORTS
    + f'a = """{KERNEL}"""\nb = """{KERNEL}"""\n'
    + inline_call("a", "e1")
    + inline_call("b", "e2", "other"),
    "source_not_found": IMPORTS + "from kernels import source\n" + CPP + inline_call("source"),
    "source_not_module_level": IMPORTS
    + f'def make():\n    source = """{KERNEL}"""\n'
    + '    return load_inline(name="r", cpp_sources="", cuda_sources=source)\n',
    "source_reassigned": IMPORTS + f'source = """{KERNEL}"""\nsource = """{KERNEL}"""\n' + CPP + inline_call("source"),
    "source_defined_after_use": IMPORTS + CPP + inline_call("source") + f'source = """{KERNEL}"""\n',
    "concatenated_source": IMPORTS
    + f'header = "#include <torch/extension.h>"\nsource = header + """{KERNEL}"""\n'
    + CPP
    + inline_call("source"),
    "f_string_source": IMPORTS
    + f'N = 256\nsource = f"""{KERNEL.replace("{", "{{").replace("}", "}}")}"""\n'
    + CPP
    + inline_call("source"),
    "computed_source": IMPORTS + f'source = """{KERNEL}""".replace("float", "double")\n' + CPP + inline_call("source"),
    "not_a_str": IMPORTS + f'source = b"""{KERNEL}"""\n' + CPP + inline_call("source"),
    "single_quoted_triple_string": IMPORTS + f"source = '''{KERNEL}'''\n" + CPP + inline_call("source"),
    "not_triple_quoted": IMPORTS + 'source = "__global__ void k() {}"\n' + CPP + inline_call("source"),
    "source_shares_line": IMPORTS + f'x = 1; source = """{KERNEL}"""\n' + CPP + inline_call("source"),
    "no_cuda_kernel_in_source": IMPORTS
    + 'source = """\n#include <torch/extension.h>\nint f() { return 1; }\n"""\n'
    + CPP
    + inline_call("source"),
}


@pytest.mark.parametrize("reason", sorted(REJECTS))
def test_unsplittable_files_are_rejected_with_their_reason(reason):
    result = split_kernel_file(REJECTS[reason])
    assert isinstance(result, InfillReject)
    assert result.reason_code == reason, result.message
    assert result.reason_code in REJECT_REASONS


def test_implicit_concatenation_of_literals_is_rejected():
    code = IMPORTS + f'source = ("#include <cuda.h>\\n"\n    """{KERNEL}""")\n' + CPP + inline_call("source")
    result = split_kernel_file(code)
    assert isinstance(result, InfillReject) and result.reason_code == "concatenated_source"


def test_build_split_conserves_rows_and_stage1_tasks_hold_prompt_and_ground_truth():
    good, middle = paper_style()
    rows = pl.DataFrame(
        {
            "sample_id": ["a", "b", "c"],
            "generated_code": [good, REJECTS["f_string_source"], None],
            "pytorch_code": ["import torch\nclass Model: ...\n"] * 3,
            "difficulty": [1, 2, 3],
        }
    )
    splits, rejects = build_infilling_split(rows)
    assert splits.height + rejects.height == rows.height
    assert rejects["reason_code"].to_list() == ["f_string_source", "unparseable"]
    tasks = build_stage1_tasks(splits)
    task = tasks.row(0, named=True)
    assert task["ground_truth_middle"] == middle
    assert task["reference_kernel_code"] == good
    assert INFILL_MARKER in task["prompt"] and middle.strip() not in task["prompt"]
    assert task["prompt"].startswith("<|im_start|>system\n") and task["difficulty"] == 1
