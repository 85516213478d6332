"""Reads the fixed layout of a seed candidate file and merges many candidates' CUDA sources into one unit.

A candidate is `imports / source = \"\"\"CUDA\"\"\" / cpp_src = \"\"\"prototypes\"\"\" / load_inline(...) / class ModelNew`.
Standard library only: the GPU smoke check (torch + stdlib host) and the CPU nvcc tests both use it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from dice_pipeline.verify.batched_build import merged_unit

# Compiling torch/extension.h costs ~100 s of host-compiler time per translation unit on our 2-core CPU machines,
# so checks compile many candidates in one unit: each candidate's code goes into its own namespace, its #includes
# are hoisted above all namespaces, and a #line directive makes every diagnostic name the candidate it came from.
_PROTOTYPE = re.compile(r"([A-Za-z_][A-Za-z0-9_:<>]*)\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(([^;{]*)\)\s*;")


class CandidateLayoutError(ValueError):
    """The candidate file does not follow the `source` / `cpp_src` / `load_inline` / `ModelNew` layout."""


@dataclass(frozen=True)
class CandidateParts:
    """The pieces of a candidate file, as written; `functions` are the names passed to `load_inline`."""

    source: str
    cpp_src: str
    functions: tuple[str, ...]
    extension_name: str
    extension_variable: str  # the module-level name the loaded extension is bound to


def _string_assignment(tree: ast.Module, name: str) -> str:
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == name
        ):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
            raise CandidateLayoutError(f"`{name}` must be assigned a plain string literal")
    raise CandidateLayoutError(f"no module-level `{name} = \"\"\"...\"\"\"` assignment")


def _load_inline_assignment(tree: ast.Module) -> tuple[str, ast.Call]:
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
        ):
            func = node.value.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called == "load_inline":
                return node.targets[0].id, node.value
    raise CandidateLayoutError("no module-level `ext = load_inline(...)` assignment")


def split_candidate(code: str) -> CandidateParts:
    """Parse a candidate file and return its CUDA source, prototypes and `load_inline` arguments."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise CandidateLayoutError(f"not valid Python: {exc}") from exc
    source = _string_assignment(tree, "source")
    cpp_src = _string_assignment(tree, "cpp_src")
    variable, call = _load_inline_assignment(tree)
    keywords = {kw.arg: kw.value for kw in call.keywords if kw.arg}
    for required in ("name", "cpp_sources", "cuda_sources", "functions"):
        if required not in keywords:
            raise CandidateLayoutError(f"load_inline(...) lacks the `{required}=` argument")
    for arg, expected in (("cpp_sources", "cpp_src"), ("cuda_sources", "source")):
        value = keywords[arg]
        if not (isinstance(value, ast.Name) and value.id == expected):
            raise CandidateLayoutError(f"load_inline({arg}=...) must pass the `{expected}` string")
    try:
        functions = ast.literal_eval(keywords["functions"])
        extension_name = ast.literal_eval(keywords["name"])
    except ValueError as exc:
        raise CandidateLayoutError("load_inline's `name` and `functions` must be literals") from exc
    if isinstance(functions, str):
        functions = [functions]
    return CandidateParts(source, cpp_src, tuple(functions), extension_name, variable)


def declared_functions(cpp_src: str) -> dict[str, str]:
    """Function name -> its prototype, for each prototype in a `cpp_src` string."""
    return {m.group(2): m.group(0) for m in _PROTOTYPE.finditer(cpp_src)}


def namespace_for(tag: str) -> str:
    """The C++ namespace a candidate's code is placed in inside a merged unit."""
    return "seed_" + re.sub(r"[^A-Za-z0-9_]", "_", tag)


def merged_cuda_unit(sources: dict[str, str]) -> str:
    """One CUDA translation unit holding every source of `sources` (tag -> CUDA text), each in its own namespace.

    Diagnostics name the tag as their file (`#line 1 "<tag>"`), so a failure is attributed to one candidate.
    Macros a source defines are #undef'd after it so the next source starts clean (the verifier's build groups
    merge their members the same way: dice_pipeline.verify.batched_build.merged_unit).
    """
    return merged_unit([(namespace_for(tag), tag, text) for tag, text in sources.items()])


def merged_bindings(parts: dict[str, CandidateParts]) -> str:
    """C++ for the host side of a merged extension: each candidate's prototypes in its namespace, plus a
    PYBIND11_MODULE exporting `<namespace>__<function>` for every function each candidate binds."""
    lines = ["#include <torch/extension.h>", ""]
    defs = []
    for tag, candidate in parts.items():
        namespace = namespace_for(tag)
        lines.append(f"namespace {namespace} {{\n{candidate.cpp_src}\n}}")
        for function in candidate.functions:
            defs.append(f'  m.def("{namespace}__{function}", &{namespace}::{function});')
    lines.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
    lines.extend(defs)
    lines.append("}")
    return "\n".join(lines) + "\n"
