"""Candidates built together: several candidates' `load_inline` extensions compiled as ONE extension, so the torch
headers (most of a cold build's compiler time) are compiled once per group instead of once per candidate.

How a group stays equivalent to building each candidate alone:
- each extension's code goes into its own namespace (`dice_member_<n>_`), its `#include`s hoisted above all of
  them, a `#line` directive naming the member so every diagnostic says whose code it is, and every macro it
  defines `#undef`'d after it;
- only extensions with the same flags and the same set of `#include`s are grouped, so no member compiles against
  a header it did not include itself;
- a member whose code could reach outside its namespace (unbalanced braces, its own `#line`, a
  `PYBIND11_MODULE`/`TORCH_LIBRARY`, `extern "C"`, conditional includes) is never grouped;
- a group that fails drops the members its compiler output names and is tried again; members in no successful
  group build alone, where their own error is found.
Each member's cache entry is keyed by the same content hash as a build alone (build_cache.build_key), so a
candidate whose code at run time differs from what was read here simply builds alone. What grouping does not
change: a member's code is linked into a library its neighbours' workers also load, so a neighbour's static
initialisers run in its worker too (the same as they run in the neighbour's own worker; the runtime guards see
both). VerifyConfig.build_batch_size = 1 builds every candidate alone.

Standard library only: the parent plans groups from source text, the build worker merges and compiles them.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

MEMBER_PREFIX = "dice_member_"
# The trailing "_" ends the number, also inside mangled symbols ("14dice_member_7_1f" is member 7's `f`).
_MEMBER_NAME = re.compile(rf"{MEMBER_PREFIX}(\d+)_")
_INCLUDE_LINE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.MULTILINE)
_DEFINE_NAME = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)
_CONDITIONAL = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef)\b", re.MULTILINE)
_NOT_GROUPABLE = ("PYBIND11_MODULE", "TORCH_LIBRARY", "TORCH_EXTENSION_NAME", 'extern "C"', MEMBER_PREFIX)
_LINE_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*line\b", re.MULTILINE)
# load_inline's leading positional parameters (stable across torch versions); later ones must be keywords here.
_POSITIONAL = ("name", "cpp_sources", "cuda_sources")
_KEYWORDS = {"name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
             "extra_ldflags", "extra_include_paths", "with_pytorch_error_handling", "no_implicit_headers",
             "is_python_module", "verbose", "build_directory", "with_cuda", "keep_intermediates", "use_pch"}
_BUILD_IRRELEVANT = {"verbose", "build_directory", "with_cuda", "keep_intermediates", "use_pch"}


class _Unresolved(Exception):
    pass


def _resolve(node: ast.AST, names: dict[str, Any]) -> Any:
    """The value of a constant expression: literals, names bound to them, `+` of strings/lists."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in names:
            return names[node.id]
        raise _Unresolved(node.id)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_resolve(element, names) for element in node.elts]
    if isinstance(node, ast.Dict) and all(key is not None for key in node.keys):
        return {_resolve(key, names): _resolve(value, names) for key, value in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _resolve(node.left, names), _resolve(node.right, names)
        if type(left) is type(right) and isinstance(left, (str, list)):
            return left + right
    raise _Unresolved(ast.dump(node)[:80])


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level names bound once to a constant expression (a name bound twice is left out: which value a
    call sees would depend on order)."""
    names: dict[str, Any] = {}
    bound_twice: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            if not isinstance(target, ast.Name):
                continue
            if target.id in names or target.id in bound_twice or isinstance(node, ast.AugAssign):
                bound_twice.add(target.id)
                names.pop(target.id, None)
                continue
            value = getattr(node, "value", None)
            if value is None or len(targets) != 1:
                continue
            try:
                names[target.id] = _resolve(value, names)
            except _Unresolved:
                bound_twice.add(target.id)  # not a constant: never resolve it to anything
    return names


def read_inline_extensions(candidate_src: str) -> list[dict[str, Any]] | None:
    """The keyword arguments of every `load_inline(...)` call in a candidate module, read statically, or None when
    any call cannot be read (computed arguments, `**kwargs`, extra positionals) or there is none: such a candidate
    builds alone."""
    try:
        tree = ast.parse(candidate_src)
    except SyntaxError:
        return None
    names = _module_constants(tree)
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if called != "load_inline":
            continue
        if len(node.args) > len(_POSITIONAL) or any(isinstance(a, ast.Starred) for a in node.args) \
                or any(kw.arg is None or kw.arg not in _KEYWORDS for kw in node.keywords):
            return None
        try:
            kwargs = {param: _resolve(arg, names) for param, arg in zip(_POSITIONAL, node.args)}
            kwargs.update({kw.arg: _resolve(kw.value, names) for kw in node.keywords if kw.arg not in _BUILD_IRRELEVANT})
        except _Unresolved:
            return None
        calls.append(kwargs)
    return calls or None


def _strip_comments_and_literals(text: str) -> str:
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', " ", text, flags=re.DOTALL)


def _stays_in_its_namespace(text: str) -> bool:
    depth = 0
    for char in _strip_comments_and_literals(text):
        depth += (char == "{") - (char == "}")
        if depth < 0:
            return False
    return depth == 0


def _joined(value: Any) -> str:
    return value if isinstance(value, str) else "\n".join(str(v) for v in (value or []))


def groupable(kwargs: dict[str, Any]) -> bool:
    """Whether one `load_inline` call's extension may be built in a group (see the module docstring)."""
    functions = kwargs.get("functions")
    if not functions or not kwargs.get("is_python_module", True) or kwargs.get("no_implicit_headers", False):
        return False
    if not isinstance(kwargs.get("name"), str):
        return False
    for text in (_joined(kwargs.get("cpp_sources")), _joined(kwargs.get("cuda_sources"))):
        if any(marker in text for marker in _NOT_GROUPABLE) or _LINE_DIRECTIVE.search(text):
            return False
        if not _stays_in_its_namespace(text):
            return False
        conditional = _CONDITIONAL.search(text)
        includes = list(_INCLUDE_LINE.finditer(text))
        if conditional and includes and includes[-1].start() > conditional.start():
            return False  # an #include under #if cannot be hoisted out of it
    return True


def _includes(text: str) -> tuple[str, ...]:
    return tuple(sorted({" ".join(line.split()) for line in _INCLUDE_LINE.findall(text)}))


def group_signature(kwargs: dict[str, Any]) -> str:
    """Extensions with equal signatures may share a build: the same flags, include paths and #include sets."""
    def as_list(value: Any) -> list[str]:
        return [value] if isinstance(value, str) else [str(v) for v in (value or [])]

    return json.dumps({
        "flags": [as_list(kwargs.get(k)) for k in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags",
                                                   "extra_include_paths")],
        "cpp_includes": _includes(_joined(kwargs.get("cpp_sources"))),
        "cuda_includes": _includes(_joined(kwargs.get("cuda_sources"))),
        "has_cuda": bool(_joined(kwargs.get("cuda_sources")).strip()),
    }, sort_keys=True)


@dataclass
class BuildGroup:
    """Candidates (by index) whose extensions are built as one: `extensions` holds each extension's
    `load_inline` keyword arguments, in member order."""

    signature: str
    indices: list[int] = field(default_factory=list)
    extensions: list[dict[str, Any]] = field(default_factory=list)
    members: dict[int, list[int]] = field(default_factory=dict)  # candidate index -> its member numbers


def plan_build_groups(candidates: list[tuple[int, str]], size: int) -> list[BuildGroup]:
    """Groups of at most `size` extensions from candidates `(index, source)` (2 or more candidates a group): a
    candidate joins a group only with all of its extensions, and only when they all have one signature; one whose
    extensions are all already in a group joins it as a member sharing them. Candidates left out build alone."""
    if size < 2:
        return []
    by_signature: dict[str, list[BuildGroup]] = {}
    # Candidates whose extensions are byte-for-byte ones already planned join that group without adding to it:
    # their extensions are built once and found in the cache (same content, same build key).
    planned: dict[str, tuple[BuildGroup, int]] = {}
    for index, source in candidates:
        calls = read_inline_extensions(source)
        if not calls or not all(groupable(call) for call in calls):
            continue
        signatures = {group_signature(call) for call in calls}
        if len(signatures) != 1 or len(calls) > size:
            continue
        contents = [json.dumps(call, sort_keys=True, default=str) for call in calls]
        found = [planned.get(content) for content in contents]
        if all(found) and len({id(group) for group, _ in found}) == 1:
            group = found[0][0]
            group.indices.append(index)
            group.members[index] = [member for _, member in found]
            continue
        signature = signatures.pop()
        groups = by_signature.setdefault(signature, [])
        if not groups or len(groups[-1].extensions) + len(calls) > size:
            groups.append(BuildGroup(signature))
        group = groups[-1]
        group.indices.append(index)
        group.members[index] = list(range(len(group.extensions), len(group.extensions) + len(calls)))
        for offset, content in enumerate(contents):
            planned.setdefault(content, (group, len(group.extensions) + offset))
        group.extensions.extend(calls)
    return [g for groups in by_signature.values() for g in groups if len(g.indices) >= 2]


def member_namespace(member: int) -> str:
    return f"{MEMBER_PREFIX}{member}_"


def merged_unit(parts: list[tuple[str, str, str]], include_rewrite: tuple[re.Pattern[str], str] | None = None) -> str:
    """One translation unit from `parts` = (namespace, file name for diagnostics, code): every part's #includes
    hoisted to the top (optionally rewritten), its code in its namespace after `#line 1 "<file name>"` (include
    lines become empty lines, so line numbers stay the part's own), and its macros #undef'd after it."""
    includes: list[str] = []
    bodies: list[str] = []
    for namespace, file_name, text in parts:
        for line in _INCLUDE_LINE.findall(text):
            line = line.strip() if include_rewrite is None else include_rewrite[0].sub(include_rewrite[1], line.strip())
            if line not in includes:
                includes.append(line)
        body = _INCLUDE_LINE.sub("", text)
        undefs = "".join(f"#undef {name}\n" for name in dict.fromkeys(_DEFINE_NAME.findall(text)))
        bodies.append(f'namespace {namespace} {{\n#line 1 "{file_name}"\n{body}\n}}\n{undefs}')
    return "\n".join(includes) + "\n\n" + "\n".join(bodies)


def group_binding_source(members: list[tuple[int, dict[str, str], str, bool]]) -> str:
    """The C++ half of a group (the part load_inline puts after `#include <torch/extension.h>` in main.cpp):
    each member's C++ sources in its namespace, then one PYBIND11_MODULE exporting `<namespace>__<function>`.
    `members` = (member number, functions {name: doc}, C++ source, with_pytorch_error_handling)."""
    unit = merged_unit([(member_namespace(m), member_namespace(m), cpp) for m, _, cpp, _ in members])
    lines = [unit, "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {"]
    for member, functions, _, error_handling in members:
        namespace = member_namespace(member)
        for function, doc in functions.items():
            target = f"{namespace}::{function}"
            target = f"torch::wrap_pybind_function({target})" if error_handling else target
            lines.append(f"m.def({json.dumps(f'{namespace}__{function}')}, {target}, {json.dumps(str(doc))});")
    lines.append("}")
    return "\n".join(lines)


def members_named(log: str) -> set[int]:
    """Member numbers a compiler or loader message names (through the #line file names or the namespaces)."""
    return {int(number) for number in _MEMBER_NAME.findall(log)}
