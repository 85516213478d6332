"""The kernel-infilling split (NOTES §1) and the stage-1 RL task set built from it.

A `load_inline` file is cut into prefix (everything before the CUDA source assignment: imports, maybe prototypes),
middle (the whole `source = (triple-quoted string)` assignment, on lines of its own) and suffix (the rest: prototypes,
`load_inline`, `ModelNew`), with `prefix + middle + suffix == code` checked for every row. The source assignment is
found through the `cuda_sources` argument of `load_inline` with `ast`, and its literal is checked with `tokenize`;
files that cannot be cut cleanly are rejected with a reason code.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from dataclasses import dataclass

import polars as pl

from dice_pipeline.prompts import infilling_messages, render_chat
from dice_pipeline.schemas import INFILLING_REJECTS, STAGE1_TASK_SCHEMA  # declared there, used from here too

# Reason codes, each with what it means. A rejected row carries one of these and a message.
REJECT_REASONS = {
    "unparseable": "the file is not valid Python",
    "loads_source_file": "kernels are built from .cu files with `load(...)`; there is no source string to cut out",
    "no_load_inline": "no `load_inline` call",
    "no_cuda_sources_argument": "`load_inline` gets no `cuda_sources`",
    "inline_source_literal": "`cuda_sources` is a literal inside the call, not an assignment that can be cut out",
    "computed_source_reference": "`cuda_sources` is an expression (call, subscript, **kwargs) not a variable name",
    "multiple_cuda_sources": "more than one CUDA source string is used: which is the middle is ambiguous",
    "source_not_found": "the `cuda_sources` variable has no module-level assignment",
    "source_not_module_level": "the CUDA source is assigned inside a function or class",
    "source_reassigned": "the CUDA source variable is assigned more than once",
    "source_defined_after_use": "the CUDA source assignment comes after the `load_inline` that uses it",
    "concatenated_source": "the CUDA source is built by `+`, `%` or implicit concatenation of literals",
    "f_string_source": "the CUDA source is an f-string",
    "computed_source": "the CUDA source is computed (a call such as .format/.join, or another expression)",
    "not_a_str": "the CUDA source is not a str literal (bytes, number, ...)",
    "single_quoted_triple_string": "the CUDA source uses ''' quotes; the split expects \"\"\" like the paper's files",
    "not_triple_quoted": "the CUDA source is a one-line string literal, not a triple-quoted block",
    "source_shares_line": "another statement shares a line with the CUDA source assignment",
    "no_cuda_kernel_in_source": "the CUDA source defines no __global__ kernel",
    "split_mismatch": "prefix + middle + suffix differs from the file (a bug: reported, never silently kept)",
}

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


@dataclass(frozen=True)
class InfillSplit:
    prefix: str
    middle: str
    suffix: str
    source_variable: str


@dataclass(frozen=True)
class InfillReject:
    reason_code: str
    message: str


class _Reject(Exception):
    def __init__(self, reason_code: str, detail: str = ""):
        super().__init__(reason_code)
        self.reason_code = reason_code
        self.message = REJECT_REASONS[reason_code] + (f": {detail}" if detail else "")


def _callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _cuda_sources_argument(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == "cuda_sources":
            return keyword.value
        if keyword.arg is None:  # **kwargs: the sources cannot be read statically
            raise _Reject("computed_source_reference", "load_inline(**...)")
    # load_inline(name, cpp_sources, cuda_sources=None, ...)
    return call.args[2] if len(call.args) >= 3 else None


def _source_names(argument: ast.expr) -> list[str]:
    """Variable names a `cuda_sources` argument refers to: `src` or `[src]` / `(src,)`."""
    items = argument.elts if isinstance(argument, (ast.List, ast.Tuple)) else [argument]
    names = []
    for item in items:
        if isinstance(item, ast.Name):
            names.append(item.id)
        elif isinstance(item, (ast.Constant, ast.JoinedStr)):
            raise _Reject("inline_source_literal", f"line {item.lineno}")
        else:
            raise _Reject("computed_source_reference", f"`{ast.unparse(item)}` on line {item.lineno}")
    return names


def _find_source_name(tree: ast.Module) -> tuple[str, list[ast.Call]]:
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    inline_calls = [call for call in calls if _callee(call) == "load_inline"]
    if not inline_calls:
        if any(_callee(call) == "load" and any(k.arg == "sources" for k in call.keywords) for call in calls):
            raise _Reject("loads_source_file")
        raise _Reject("no_load_inline")
    names: list[str] = []
    for call in inline_calls:
        argument = _cuda_sources_argument(call)
        if argument is None or (isinstance(argument, ast.Constant) and argument.value is None):
            raise _Reject("no_cuda_sources_argument", f"load_inline on line {call.lineno}")
        for name in _source_names(argument):
            if name not in names:
                names.append(name)
    if len(names) > 1:
        raise _Reject("multiple_cuda_sources", ", ".join(names))
    if not names:
        raise _Reject("no_cuda_sources_argument", "empty cuda_sources list")
    return names[0], inline_calls


def _assigned_names(statement: ast.stmt) -> set[str]:
    targets: list[ast.expr] = []
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        targets = [statement.target]
    names = set()
    for target in targets:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.add(node.id)
    return names


def _find_assignment(tree: ast.Module, name: str) -> ast.Assign | ast.AnnAssign:
    module_level = [stmt for stmt in tree.body if name in _assigned_names(stmt)]
    nested = [
        node
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        and node not in module_level
        and name in _assigned_names(node)
    ]
    if not module_level:
        raise _Reject("source_not_module_level" if nested else "source_not_found", name)
    if len(module_level) > 1 or isinstance(module_level[0], ast.AugAssign):
        lines = [stmt.lineno for stmt in module_level]
        raise _Reject(
            "concatenated_source" if isinstance(module_level[-1], ast.AugAssign) else "source_reassigned",
            f"{name} assigned on lines {lines}",
        )
    statement = module_level[0]
    if isinstance(statement, ast.Assign) and (
        len(statement.targets) != 1 or not isinstance(statement.targets[0], ast.Name)
    ):
        raise _Reject("computed_source", f"{name} is one of several assignment targets on line {statement.lineno}")
    return statement


def _check_value(code: str, value: ast.expr | None, name: str) -> None:
    if isinstance(value, ast.JoinedStr):
        raise _Reject("f_string_source", name)
    if isinstance(value, ast.BinOp):
        raise _Reject("concatenated_source", name)
    if not isinstance(value, ast.Constant):
        raise _Reject("computed_source", f"{name} = {ast.unparse(value)[:60] if value else '?'}")
    if not isinstance(value.value, str):
        raise _Reject("not_a_str", f"{name} is a {type(value.value).__name__}")
    literal = ast.get_source_segment(code, value)
    tokens = [
        token
        for token in tokenize.generate_tokens(io.StringIO(literal).readline)
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.COMMENT)
    ]
    if len(tokens) != 1:
        raise _Reject("concatenated_source", f"{name} joins {len(tokens)} literals")
    body = tokens[0].string.lstrip("rRuU")
    if body.startswith("'''"):
        raise _Reject("single_quoted_triple_string", name)
    if not body.startswith('"""'):
        raise _Reject("not_triple_quoted", name)
    if "__global__" not in value.value:
        raise _Reject("no_cuda_kernel_in_source", name)


def _split(code: str) -> InfillSplit:
    try:
        tree = ast.parse(code)
    except SyntaxError as error:
        raise _Reject("unparseable", f"{error.msg} (line {error.lineno})") from None
    name, inline_calls = _find_source_name(tree)
    statement = _find_assignment(tree, name)
    # Only calls run at import time must come after the assignment; one inside a function may run later.
    deferred = {
        id(node)
        for top in tree.body
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        for node in ast.walk(top)
    }
    eager_uses = [call.lineno for call in inline_calls if id(call) not in deferred]
    first_use = min(eager_uses, default=statement.lineno + 1)
    if statement.lineno >= first_use:
        raise _Reject("source_defined_after_use", f"{name} on line {statement.lineno}, load_inline on {first_use}")
    _check_value(code, statement.value, name)
    start, end = statement.lineno, statement.end_lineno
    for other in tree.body:
        if other is not statement and other.lineno <= end and other.end_lineno >= start:
            raise _Reject("source_shares_line", f"line {other.lineno}")

    # Whole lines: the middle runs from the start of the assignment's first line through the end of its last line
    # (a trailing comment on that line goes with it).
    lines = _LINE.findall(code)
    prefix = "".join(lines[: start - 1])
    middle = "".join(lines[start - 1 : end])
    suffix = "".join(lines[end:])
    if prefix + middle + suffix != code:
        raise _Reject("split_mismatch", f"{len(prefix)}+{len(middle)}+{len(suffix)} chars vs {len(code)}")
    return InfillSplit(prefix=prefix, middle=middle, suffix=suffix, source_variable=name)


def split_kernel_file(code: str) -> InfillSplit | InfillReject:
    """Cut a `load_inline` file into prefix / middle (the CUDA source assignment) / suffix, or say why not."""
    try:
        return _split(code)
    except _Reject as reject:
        return InfillReject(reject.reason_code, reject.message)


def build_infilling_split(rows, id_column: str = "sample_id", code_column: str = "generated_code"):
    """Split every row's kernel file. Returns (splits, rejects) DataFrames; every input row lands in exactly one.
    `splits` keeps the input columns and adds prefix, middle, suffix, source_variable."""
    if id_column not in rows.columns or code_column not in rows.columns:
        raise ValueError(f"rows need columns {id_column!r} and {code_column!r}; have {rows.columns}")
    kept, rejected = [], []
    for row in rows.iter_rows(named=True):
        code = row[code_column]
        result = split_kernel_file(code) if isinstance(code, str) else InfillReject("unparseable", "code is null")
        if isinstance(result, InfillSplit):
            kept.append({**row, **result.__dict__})
        else:
            rejected.append(
                {"row_id": str(row[id_column]), "reason_code": result.reason_code, "message": result.message}
            )
    split_schema = {
        **rows.schema,
        "prefix": pl.String,
        "middle": pl.String,
        "suffix": pl.String,
        "source_variable": pl.String,
    }
    return pl.DataFrame(kept, schema=split_schema), pl.DataFrame(rejected, schema=INFILLING_REJECTS)


def build_stage1_tasks(splits, id_column: str = "sample_id", reference_column: str = "pytorch_code"):
    """The stage-1 (kernel infilling) RL task set: per split row, the infilling prompt messages (JSON) and their
    rendering, the PyTorch reference the reward verifies against, the full kernel file, and the ground-truth
    middle. The reward assembles prefix + answer + suffix and verifies that file against the reference."""
    rows = []
    for row in splits.iter_rows(named=True):
        messages = infilling_messages(row["prefix"], row["suffix"], row[reference_column])
        rows.append(
            {
                "task_id": str(row[id_column]),
                "prompt_messages": json.dumps(messages),
                "prompt": render_chat(messages),
                "pytorch_code": row[reference_column],
                "reference_kernel_code": row["prefix"] + row["middle"] + row["suffix"],
                "prefix": row["prefix"],
                "ground_truth_middle": row["middle"],
                "suffix": row["suffix"],
                "difficulty": row.get("difficulty"),
                "source": row.get("source"),
                "family": row.get("family"),
            }
        )
    return pl.DataFrame(rows, schema=STAGE1_TASK_SCHEMA)


__all__ = [
    "INFILLING_REJECTS",
    "REJECT_REASONS",
    "STAGE1_TASK_SCHEMA",
    "InfillReject",
    "InfillSplit",
    "build_infilling_split",
    "build_stage1_tasks",
    "split_kernel_file",
]
