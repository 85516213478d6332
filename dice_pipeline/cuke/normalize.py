"""Source normalisation for deduplication and decontamination: the same program written with other names, comments,
docstrings, spacing or (for decontamination) sizes should normalise to the same text and the same token shingles.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import io
import re
import tokenize

_BUILTIN_NAMES = frozenset(dir(builtins)) | {"self", "cls", "__name__", "__file__"}
# Names every KernelBench-format file defines; renaming them would hide nothing and blur the structure.
_FORMAT_NAMES = frozenset({"get_inputs", "get_init_inputs", "forward", "__init__"})
_WHITESPACE_RUN = re.compile(r"\s+")
_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
NUMBER_PLACEHOLDER = 0  # what every numeric literal becomes when sizes are abstracted


def _strip_docstrings(tree: ast.AST) -> None:
    """Remove bare string statements (docstrings and string 'comments') from every body; `pass` keeps a body."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        kept = [
            stmt
            for stmt in body
            if not (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            )
        ]
        node.body = kept or [ast.Pass()]


class _CanonicalNames(ast.NodeTransformer):
    """Rename user-chosen identifiers in order of first appearance, per scope: module-level names (classes,
    functions, constants) become v0, v1, ...; attributes the file defines (`self.<x>`, methods) a0, a1, ...;
    each function's parameters and locals l0, l1, ... afresh, so a module constant and a parameter that happen to
    share a name (KernelBench's `in_features`) do not tie the two together. Imported names are replaced by what
    they import (`F` -> `torch.nn.functional`), so `import torch.nn.functional as F` and
    `from torch.nn import functional as fn` agree; builtins and library attributes (`torch.relu`, `x.view`) are
    kept, since they are what the program computes."""

    def __init__(self, import_targets: dict[str, str], self_attributes: set[str], abstract_numbers: bool):
        self.import_targets = import_targets
        self.self_attributes = self_attributes
        self.abstract_numbers = abstract_numbers
        self.module_names: dict[str, str] = {}
        self.attribute_names: dict[str, str] = {}
        self.function_scopes: list[tuple[set[str], dict[str, str]]] = []  # (local names, renames), innermost last
        self.in_class_body = [False]

    @staticmethod
    def _fresh(table: dict[str, str], prefix: str, name: str) -> str:
        if name not in table:
            table[name] = f"{prefix}{len(table)}"
        return table[name]

    def _variable(self, name: str) -> str:
        if name in _BUILTIN_NAMES or name in _FORMAT_NAMES:
            return name
        for local_names, renames in reversed(self.function_scopes):
            if name in local_names:
                return self._fresh(renames, "l", name)
        return self._fresh(self.module_names, "v", name)

    def visit_Import(self, node: ast.Import) -> None:
        return None  # imports are folded into the names that use them

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        return None

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.import_targets and not any(node.id in names for names, _ in self.function_scopes):
            return ast.copy_location(ast.Name(id=self.import_targets[node.id], ctx=node.ctx), node)
        node.id = self._variable(node.id)
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in self.self_attributes:
            node.attr = self._fresh(self.attribute_names, "a", node.attr)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.name = self._variable(node.name)
        node.bases = [self.visit(base) for base in node.bases]
        node.keywords = [self.visit(keyword) for keyword in node.keywords]
        node.decorator_list = [self.visit(decorator) for decorator in node.decorator_list]
        self.in_class_body.append(True)
        node.body = [self.visit(stmt) for stmt in node.body]
        self.in_class_body.pop()
        return node

    def _visit_function(self, node):
        if node.name in _FORMAT_NAMES:
            pass
        elif self.in_class_body[-1]:
            node.name = self._fresh(self.attribute_names, "a", node.name)
        else:
            node.name = self._variable(node.name)
        node.decorator_list = [self.visit(decorator) for decorator in node.decorator_list]
        node.returns = None  # type hints are style, not computation
        self.function_scopes.append((_function_locals(node), {}))
        self.in_class_body.append(False)
        node.args = self.visit(node.args)
        node.body = [self.visit(stmt) for stmt in node.body]
        self.in_class_body.pop()
        self.function_scopes.pop()
        return node

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._variable(node.arg)
        node.annotation = None
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        # `super(Model, self)` and `super()` mean the same here.
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            node.args = []
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        value = node.value
        if self.abstract_numbers and isinstance(value, (int, float, complex)) and not isinstance(value, bool):
            return ast.copy_location(ast.Constant(value=NUMBER_PLACEHOLDER), node)
        return node


def _function_locals(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Parameters and names bound in the function's own body (not in nested functions or classes), minus those it
    declares global or nonlocal."""
    arguments = function.args
    names = {
        arg.arg
        for arg in arguments.posonlyargs + arguments.args + arguments.kwonlyargs + [arguments.vararg, arguments.kwarg]
        if arg is not None
    }
    declared_outer: set[str] = set()
    pending = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue  # a nested scope binds its own names
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared_outer.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        pending.extend(ast.iter_child_nodes(node))
    return names - declared_outer


def _import_targets(tree: ast.Module) -> dict[str, str]:
    targets: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                # `import torch.nn` binds `torch`; `import torch.nn as nn` binds `nn` to the full path.
                bound = alias.asname or alias.name.split(".")[0]
                targets[bound] = alias.name if alias.asname else bound
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                targets[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return targets


def _self_attributes(tree: ast.Module) -> set[str]:
    """Attributes the file itself gives objects: `self.x = ...` targets and methods defined in its classes."""
    methods = {
        item.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name not in _FORMAT_NAMES
    }
    return methods | {
        target.attr
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    }


def normalize_python(code: str, rename: bool = True, abstract_numbers: bool = False) -> str:
    """Canonical text of a Python file: comments, docstrings, annotations and layout removed (ast round trip),
    identifiers renamed canonically if `rename`, numeric literals replaced by 0 if `abstract_numbers`, and
    whitespace and C/CUDA comments inside string literals (embedded kernels) collapsed.
    Raises SyntaxError for code that does not parse."""
    tree = ast.parse(code)
    _strip_docstrings(tree)
    if rename:
        tree = _CanonicalNames(_import_targets(tree), _self_attributes(tree), abstract_numbers).visit(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = _WHITESPACE_RUN.sub(" ", _C_COMMENT.sub(" ", node.value)).strip()
    ast.fix_missing_locations(tree)
    return ast.unparse(tree)


def normalized_or_collapsed(code: str, **options) -> tuple[str, bool]:
    """`normalize_python` where the code parses, else the text with whitespace runs collapsed (so unparseable code
    can still be compared); the flag says whether the ast path was taken."""
    try:
        return normalize_python(code, **options), True
    except (SyntaxError, ValueError, RecursionError):
        return _WHITESPACE_RUN.sub(" ", code).strip(), False


def content_hash(*texts: str) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def code_tokens(normalized_code: str) -> list[str]:
    """Python tokens of normalised code (no layout tokens); falls back to a whitespace split if it does not
    tokenize."""
    skipped = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENDMARKER}
    try:
        return [
            token.string
            for token in tokenize.generate_tokens(io.StringIO(normalized_code).readline)
            if token.type not in skipped
        ]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return normalized_code.split()


def shingles(tokens: list[str], size: int) -> set[tuple[str, ...]]:
    """Distinct runs of `size` consecutive tokens (the whole sequence if it is shorter)."""
    if len(tokens) <= size:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i : i + size]) for i in range(len(tokens) - size + 1)}


__all__ = [
    "code_tokens",
    "content_hash",
    "normalize_python",
    "normalized_or_collapsed",
    "shingles",
]
