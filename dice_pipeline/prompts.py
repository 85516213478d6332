"""Prompts the models see and the parsing of what they answer: the KernelBench one-shot kernel-generation prompt,
the stage-1 kernel-infilling prompt, a Qwen3-style chat template (rendered here without any hub download) and the
extraction of the answer's code block. Standard library only: generation on a GPU host imports this module.
"""

from __future__ import annotations

import ast
import re
from typing import Any

# --- the one-shot example: our own code, in the shape KernelBench's prompt uses (Model adds two tensors; ModelNew
# does it with a load_inline kernel). Kept small so the prompt leaves room for the task and a 4096-token answer.
EXAMPLE_ARCHITECTURE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Adds two tensors of the same shape."""

    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def get_inputs():
    a = torch.rand(4096, 1024).cuda()
    b = torch.rand(4096, 1024).cuda()
    return [a, b]


def get_init_inputs():
    return []
'''

EXAMPLE_OPTIMIZED_ARCHITECTURE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

add_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                           float* __restrict__ out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a[i] + b[i];
    }
}

torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
    auto a_c = a.contiguous();
    auto b_c = b.contiguous();
    auto out = torch::empty_like(a_c);
    int64_t n = a_c.numel();
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    add_kernel<<<blocks, threads>>>(a_c.data_ptr<float>(), b_c.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

add_cpp_source = "torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);"

add_extension = load_inline(
    name="elementwise_add",
    cpp_sources=add_cpp_source,
    cuda_sources=add_source,
    functions=["add_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_extension = add_extension

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.add_extension.add_cuda(a, b)
'''

SYSTEM_PROMPT = (
    "You are an expert CUDA engineer. You rewrite PyTorch programs with custom CUDA kernels that are correct "
    "and faster than the original."
)

_GENERATION_INTRO = (
    "You write custom CUDA kernels to replace the PyTorch operators in the given architecture to get speedups.\n\n"
    "You are free to choose which operators to replace: you may replace some with custom CUDA kernels and leave "
    "others unchanged, replace several at once, fuse operators into a single kernel (for example matmul followed "
    "by relu), or change the algorithm (for example an online softmax).\n\n"
    "Here is an example of the syntax for embedding a custom CUDA operator inline in PyTorch. "
    "The example architecture is:\n\n"
)

_GENERATION_INSTRUCTION = (
    "Optimize the architecture named Model with custom CUDA operators! Name your optimized output architecture "
    "ModelNew. Output the new code in codeblocks. Please generate real code, NOT pseudocode, make sure the code "
    "compiles and is fully functional. Just output the new model code, no other text, and NO testing code!"
)

# Where the model's answer goes in the infilling prompt; a line of its own so it cannot collide with code.
INFILL_MARKER = "# <<< FILL IN: the CUDA source string assignment >>>"


def _fenced(code: str, language: str = "python") -> str:
    return f"```{language}\n{code.rstrip()}\n```"


def kernel_generation_user_prompt(pytorch_code: str) -> str:
    """The user turn of the KernelBench one-shot prompt for one reference architecture."""
    if not pytorch_code.strip():
        raise ValueError("pytorch_code is empty")
    return (
        _GENERATION_INTRO
        + _fenced(EXAMPLE_ARCHITECTURE)
        + "\n\nThe example new architecture with custom CUDA kernels looks like this:\n\n"
        + _fenced(EXAMPLE_OPTIMIZED_ARCHITECTURE)
        + "\n\nYou are given the following architecture:\n\n"
        + _fenced(pytorch_code)
        + "\n\n"
        + _GENERATION_INSTRUCTION
    )


def kernel_generation_messages(pytorch_code: str) -> list[dict[str, str]]:
    """Chat messages (system + user) asking for a `ModelNew` with custom CUDA kernels for `pytorch_code`."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": kernel_generation_user_prompt(pytorch_code)},
    ]


def infilling_messages(prefix: str, suffix: str, pytorch_code: str) -> list[dict[str, str]]:
    """Chat messages for stage-1 kernel infilling: the model sees the reference, the file's prefix (imports) and
    suffix (prototypes, `load_inline`, `ModelNew`) and writes the missing middle, the CUDA source assignment."""
    if not pytorch_code.strip():
        raise ValueError("pytorch_code is empty")
    if not suffix.strip():
        raise ValueError("suffix is empty: there is nothing for the missing source to connect to")
    # The prefix may be empty for a file with no imports before the source; keep the marker on its own line.
    partial = prefix + ("" if not prefix or prefix.endswith("\n") else "\n") + INFILL_MARKER + "\n" + suffix
    user = (
        "You are given a PyTorch architecture and an incomplete optimized version of it that uses custom CUDA "
        "operators through torch.utils.cpp_extension.load_inline. The CUDA source string (includes, __global__ "
        "kernels and the host functions that launch them) is missing.\n\n"
        "The PyTorch architecture is:\n\n"
        + _fenced(pytorch_code)
        + "\n\nThe incomplete optimized architecture is below; the line\n"
        + INFILL_MARKER
        + "\nmarks where the missing code goes:\n\n"
        + _fenced(partial)
        + "\n\nWrite only the missing code: the Python assignment of the CUDA source string that the rest of the "
        "file uses, with the kernels and host functions it declares, so that the completed ModelNew compiles and "
        "computes the same result as Model, faster. Output it in one codeblock, no other text."
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


# --- a Qwen3-style chat template. The Jinja string is what a tokenizer's `chat_template` can carry; the Python
# renderer below produces the same text without Jinja or a tokenizer (tests check that they agree).
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.get('reasoning_content') %}"
    "{{- '<think>\\n' + message['reasoning_content'].strip('\\n') + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
_ROLES = ("system", "user", "assistant")


def render_chat(
    messages: list[dict[str, Any]], add_generation_prompt: bool = True, enable_thinking: bool | None = None
) -> str:
    """Render chat messages as Qwen3's template does: `<|im_start|>role\\ncontent<|im_end|>\\n` per turn, an
    assistant turn's `reasoning_content` as `<think>...</think>`, then the open assistant turn to generate into.
    `enable_thinking=False` pre-fills an empty think block (Qwen3's no-thinking mode)."""
    parts: list[str] = []
    for index, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content")
        if role not in _ROLES:
            raise ValueError(f"message {index}: role must be one of {_ROLES}, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"message {index}: content must be a string, got {type(content).__name__}")
        parts.append(f"{IM_START}{role}\n")
        reasoning = message.get("reasoning_content")
        if role == "assistant" and reasoning:
            parts.append(wrap_reasoning(reasoning))
        parts.append(f"{content}{IM_END}\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
        if enable_thinking is False:
            parts.append("<think>\n\n</think>\n\n")
    return "".join(parts)


def wrap_reasoning(reasoning: str) -> str:
    """A reasoning trace as Qwen3 writes it before its answer."""
    return "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"


def format_kernel_response(code: str, reasoning: str | None = None) -> str:
    """The assistant text an SFT sample trains on: optional `<think>` trace, then the file in a python fence
    (the shape `extract_code_block` reads back)."""
    if not code.strip():
        raise ValueError("code is empty")
    return (wrap_reasoning(reasoning) if reasoning and reasoning.strip() else "") + _fenced(code)


# --- reading the answer back
_FENCE_OPEN = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*$", re.MULTILINE)
_FENCE_CLOSE = re.compile(r"^[ \t]*```[ \t]*$", re.MULTILINE)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
_CODE_LANGUAGES = {"", "python", "py", "python3"}


def _code_blocks(text: str) -> list[tuple[str, str, bool]]:
    """Fenced blocks as (language, body, closed), in order. A fence still open at the end of the text (a truncated
    answer) yields its body so far with closed=False."""
    blocks: list[tuple[str, str, bool]] = []
    position = 0
    while True:
        opening = _FENCE_OPEN.search(text, position)
        if opening is None:
            return blocks
        body_start = opening.end() + 1
        closing = _FENCE_CLOSE.search(text, body_start)
        if closing is None:
            blocks.append((opening.group(1).lower(), text[body_start:], False))
            return blocks
        blocks.append((opening.group(1).lower(), text[body_start : closing.start()], True))
        position = closing.end()


def extract_code_block(text: str) -> str | None:
    """The Python code the model answered with, or None if it wrote no code block.

    Reasoning inside `<think>...</think>` is ignored. Among the python (or unlabelled) fenced blocks, the choice is
    the one defining `ModelNew` if any, preferring closed fences over a truncated one and, among equals, the last
    (models often draft, then give the final version). An unclosed final fence is accepted."""
    answer = _THINK_BLOCK.sub("", text)
    candidates = [(body, closed) for language, body, closed in _code_blocks(answer) if language in _CODE_LANGUAGES]
    candidates = [(body, closed) for body, closed in candidates if body.strip()]
    if not candidates:
        return None

    def completeness(item: tuple[int, tuple[str, bool]]) -> tuple[bool, bool, int]:
        index, (body, closed) = item
        return ("ModelNew" in body, closed, index)

    _, (body, _) = max(enumerate(candidates), key=completeness)
    return body.rstrip() + "\n"


def unwrap_code_answer(text: str) -> tuple[str, int | None]:
    """Code saved as a model's answer: `text` itself when it parses as Python, else the block `extract_code_block`
    picks when that parses. Returns (code, characters dropped around the block, or None when `text` is used as is
    or nothing better was found)."""
    if _parses(text):
        return text, None
    block = extract_code_block(text)
    if block is None or not _parses(block):
        return text, None
    return block, len(text) - len(block.strip())


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


__all__ = [
    "EXAMPLE_ARCHITECTURE",
    "EXAMPLE_OPTIMIZED_ARCHITECTURE",
    "INFILL_MARKER",
    "QWEN3_CHAT_TEMPLATE",
    "SYSTEM_PROMPT",
    "extract_code_block",
    "format_kernel_response",
    "infilling_messages",
    "kernel_generation_messages",
    "kernel_generation_user_prompt",
    "render_chat",
    "unwrap_code_answer",
    "wrap_reasoning",
]
