"""The KernelBench one-shot prompt, the infilling prompt, the Qwen3-style template and code-block extraction."""

from __future__ import annotations

import ast

import jinja2
import pytest

from dice_pipeline.prompts import (
    EXAMPLE_ARCHITECTURE,
    EXAMPLE_OPTIMIZED_ARCHITECTURE,
    INFILL_MARKER,
    QWEN3_CHAT_TEMPLATE,
    extract_code_block,
    format_kernel_response,
    infilling_messages,
    kernel_generation_messages,
    render_chat,
    unwrap_code_answer,
)

TASK = (
    "import torch\nimport torch.nn as nn\n\n"
    "class Model(nn.Module):\n    def forward(self, x):\n        return x.relu()\n"
)


def test_example_code_is_valid_python_with_model_and_modelnew():
    assert "class Model(" in EXAMPLE_ARCHITECTURE
    assert "class ModelNew(" in EXAMPLE_OPTIMIZED_ARCHITECTURE and "load_inline(" in EXAMPLE_OPTIMIZED_ARCHITECTURE
    ast.parse(EXAMPLE_ARCHITECTURE)
    ast.parse(EXAMPLE_OPTIMIZED_ARCHITECTURE)


def test_generation_messages_follow_kernelbench_structure():
    messages = kernel_generation_messages(TASK)
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    example_at = user.index(EXAMPLE_ARCHITECTURE.rstrip())
    new_at = user.index(EXAMPLE_OPTIMIZED_ARCHITECTURE.rstrip())
    given_at = user.index("You are given the following architecture:")
    task_at = user.index(TASK.rstrip())
    instruction_at = user.index("Optimize the architecture named Model with custom CUDA operators!")
    assert example_at < new_at < given_at < task_at < instruction_at
    assert "Name your optimized output architecture ModelNew" in user


def test_generation_messages_reject_empty_code():
    with pytest.raises(ValueError):
        kernel_generation_messages("  \n")


def test_infilling_messages_hold_prefix_marker_suffix_in_order():
    prefix = "import torch\nfrom torch.utils.cpp_extension import load_inline\n\n"
    suffix = "cpp_src = 'torch::Tensor f(torch::Tensor x);'\nmod = load_inline(name='m', cpp_sources=cpp_src)\n"
    user = infilling_messages(prefix, suffix, TASK)[1]["content"]
    assert user.index(TASK.rstrip()) < user.index(prefix + INFILL_MARKER + "\n" + suffix.rstrip())


def test_infilling_messages_put_marker_on_its_own_line_when_prefix_lacks_newline():
    user = infilling_messages("import torch", "x = 1\n", TASK)[1]["content"]
    assert "import torch\n" + INFILL_MARKER + "\nx = 1" in user


@pytest.mark.parametrize("thinking", [None, False])
def test_python_renderer_matches_jinja_template(thinking):
    messages = kernel_generation_messages(TASK) + [
        {"role": "assistant", "content": "```python\nx\n```", "reasoning_content": "\nplan\n"},
        {"role": "user", "content": "again"},
    ]
    template = jinja2.Environment().from_string(QWEN3_CHAT_TEMPLATE)
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    expected = template.render(messages=messages, add_generation_prompt=True, **kwargs)
    assert render_chat(messages, add_generation_prompt=True, enable_thinking=thinking) == expected


def test_render_chat_layout():
    text = render_chat([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError):
        render_chat([{"role": "tool", "content": "x"}])


def test_response_round_trips_through_extraction_with_reasoning():
    response = format_kernel_response(EXAMPLE_OPTIMIZED_ARCHITECTURE, reasoning="Use ```python\nbad\n``` here")
    assert response.startswith("<think>\n")
    assert extract_code_block(response) == EXAMPLE_OPTIMIZED_ARCHITECTURE


def test_extract_prefers_last_block_defining_modelnew():
    text = (
        "draft:\n```python\nclass ModelNew: v1\n```\nfinal:\n```python\nclass ModelNew: v2\n```\n"
        "test:\n```python\nprint(1)\n```\n```cpp\n__global__ void k() {}\n```"
    )
    assert extract_code_block(text) == "class ModelNew: v2\n"


def test_extract_tolerates_unclosed_fence():
    assert extract_code_block("Here:\n```python\nclass ModelNew:\n    pass") == "class ModelNew:\n    pass\n"


def test_extract_prefers_closed_block_over_truncated_one():
    text = "```python\nclass ModelNew: ok\n```\n```python\nclass ModelNew: trunc"
    assert extract_code_block(text) == "class ModelNew: ok\n"


def test_extract_returns_none_without_code():
    assert extract_code_block("no code here") is None
    assert extract_code_block("```cpp\nint x;\n```") is None


def test_unwrap_code_answer_keeps_code_and_unwraps_only_a_parseable_block():
    code = "class ModelNew:\n    pass\n"
    assert unwrap_code_answer(code) == (code, None)  # already code: untouched
    answer = f"Sure.\n```python\n{code}```\nDone."
    unwrapped, dropped = unwrap_code_answer(answer)
    assert unwrapped == code and dropped == len(answer) - len(code.strip())
    broken = "Sure.\n```python\nclass ModelNew(:\n```"
    assert unwrap_code_answer(broken) == (broken, None)  # nothing better found: the text as it was
    assert unwrap_code_answer("no code here at all") == ("no code here at all", None)
