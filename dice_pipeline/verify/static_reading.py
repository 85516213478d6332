"""How the static checks read a candidate module: its names, imports and aliases (ModuleFacts), ModelNew's forward
path (the methods forward reaches), and what each call on it does: a custom kernel through a loaded extension, PyTorch
compute, or an allocation (classify_forward_calls); moves of tensors to the host (host_transfers). The rules that
judge what was read are static_checks.py. Standard library only."""

from __future__ import annotations

import ast


# torch calls that allocate, reshape or describe tensors without computing on their values.
# torch calls that allocate, reshape or describe tensors without computing on their values.
NON_COMPUTE_TORCH_CALLS = frozenset(
    {
        "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
        "tensor", "as_tensor", "from_numpy", "arange", "device", "dtype", "Size", "is_tensor", "numel",
        "manual_seed", "no_grad", "inference_mode", "current_device", "current_stream", "get_device",
        "is_available", "synchronize", "Parameter", "Module", "ModuleList", "ModuleDict", "ParameterList",
        "ParameterDict", "Identity", "view_as_real", "view_as_complex", "broadcast_shapes", "result_type",
        "promote_types", "finfo", "iinfo", "Generator", "device_count", "get_device_properties",
        "get_default_dtype", "is_floating_point", "is_complex", "randn", "rand", "randint", "normal",
    }
)

# Tensor methods that compute on values (a receiver not known to be an extension calling one of these is compute).
TENSOR_COMPUTE_METHODS = frozenset(
    {
        "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "sum", "mean", "var", "std", "prod", "cumsum",
        "softmax", "log_softmax", "relu", "relu_", "sigmoid", "tanh", "exp", "log", "max", "min", "amax", "amin",
        "norm", "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "pow", "sqrt", "rsqrt", "clamp",
        "clamp_", "clip", "abs", "neg", "argmax", "argmin", "topk", "sort", "gelu", "silu", "erf", "masked_fill",
        "masked_fill_", "where", "logsumexp", "square", "reciprocal", "tril", "triu", "conv2d", "linear",
        "addcmul", "lerp", "cumprod", "sign", "floor", "ceil", "round", "fmod", "remainder", "dot", "outer",
    }
)

# torch.ops namespaces that are PyTorch's own kernels, not a candidate's registered custom op.
BUILTIN_OP_NAMESPACES = ("torch.ops.aten.", "torch.ops.prims.", "torch.ops.quantized.", "torch.ops.higher_order.")

EXTENSION_LOADERS = frozenset({"load_inline", "load"})

CPP_EXTENSION_MODULE = "torch.utils.cpp_extension"

# Forward-path calls that move a tensor's values to the host.
HOST_TRANSFER_METHODS = frozenset({"cpu", "numpy"})


def dotted_name(node: ast.AST) -> str | None:
    """`a.b.c` for an attribute chain rooted at a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def call_base_name(func: ast.AST) -> str | None:
    """The name a call chain starts from: `get_ext().fn` -> get_ext, `Fn.apply` -> Fn, `a.b[0].c` -> a."""
    node = func
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def unwrap_module_moves(node: ast.AST) -> ast.AST:
    """`nn.Linear(...).cuda()` / `.to(device)` / `.float()` is still the module it moves."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("cuda", "to", "float", "double", "eval", "train", "requires_grad_"):
        node = node.func.value
    return node


class ModuleFacts(ast.NodeVisitor):
    """Imports, aliases and extension handles of the candidate module."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}  # local name -> dotted module or object path
        self.imported_roots: set[str] = set()
        self.extension_names: set[str] = set()  # names bound to a load_inline/load result (or attributes of one)
        self.loader_calls = 0
        self.functions: dict[str, ast.FunctionDef] = {}
        self.classes: dict[str, ast.ClassDef] = {}

    def resolve(self, node: ast.AST) -> str | None:
        dotted = dotted_name(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head in self.aliases:
            return self.aliases[head] + ("." + rest if rest else "")
        return dotted

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
            self.imported_roots.add(alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        self.imported_roots.add(module.split(".")[0])
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}" if module else alias.name

    def is_loader_call(self, node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        target = self.resolve(node.func) or ""
        return target.rsplit(".", 1)[-1] in EXTENSION_LOADERS and (
            target.startswith(CPP_EXTENSION_MODULE) or target in EXTENSION_LOADERS
        )

    def visit_Call(self, node: ast.Call) -> None:
        if self.is_loader_call(node):
            self.loader_calls += 1
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        value_root = dotted_name(node.value.func if isinstance(node.value, ast.Call) else node.value) or ""
        binds_extension = self.is_loader_call(node.value) or value_root.split(".")[0] in self.extension_names
        for target in node.targets:
            if binds_extension and isinstance(target, ast.Name):
                self.extension_names.add(target.id)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.setdefault(node.name, node)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes[node.name] = node
        self.generic_visit(node)


def mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(sub, ast.Name) and sub.id in names for sub in ast.walk(node))


def self_attribute_kinds(cls: ast.ClassDef, facts: ModuleFacts,
                          reaching: frozenset[str] = frozenset()) -> tuple[set[str], set[str]]:
    """Attributes of `self` that reach an extension when called (bound to an extension handle, or built from a
    local class or function in `reaching`, directly or through one of this class's methods), and those bound to a
    torch.nn module (compute when called)."""
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    reaching = frozenset(names_built_from(cls, set(reaching))) if reaching else reaching
    reaching_methods = reaching & set(methods)  # names_built_from counts the builder methods (`_make_layer`) too
    extension_attrs: set[str] = set()
    torch_module_attrs: set[str] = set()
    for node in ast.walk(cls):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"):
                continue
            value = unwrap_module_moves(node.value)
            root = dotted_name(value.func if isinstance(value, ast.Call) else value) or ""
            called = [(dotted_name(sub.func) or "").split(".") for sub in ast.walk(value) if isinstance(sub, ast.Call)]
            builds_reaching = mentions(value, set(reaching)) or any(
                parts[0] == "self" and parts[-1] in reaching_methods for parts in called)
            if facts.is_loader_call(value) or root.split(".")[0] in facts.extension_names or builds_reaching:
                extension_attrs.add(target.attr)
            elif isinstance(value, ast.Call) and builds_torch_module(value, facts):
                torch_module_attrs.add(target.attr)
    return extension_attrs, torch_module_attrs


def builds_torch_module(value: ast.Call, facts: ModuleFacts) -> bool:
    """A torch.nn module that computes when called; a ModuleList/ModuleDict counts when it holds one."""
    resolved = facts.resolve(value.func) or ""
    leaf = resolved.rsplit(".", 1)[-1]
    if not resolved.startswith("torch.nn."):
        return False
    if leaf in ("ModuleList", "ModuleDict"):
        return any(isinstance(sub, ast.Call) and sub is not value and builds_torch_module(sub, facts)
                   for sub in ast.walk(value))
    return leaf not in NON_COMPUTE_TORCH_CALLS


def names_built_from(scope: ast.AST, names: set[str]) -> set[str]:
    """`names` plus the local names in `scope` whose value is built from them: assigned (`block = Fn(...)`),
    collected (`layers.append(Relu2())`, `layers += [...]`), or nested functions that use them; to a fixed point.
    Lenient across a class's methods (a name tainted in one counts in all): a reach found here still has to show
    in the runtime profiler."""
    names = set(names)
    while True:
        found: set[str] = set()
        for node in ast.walk(scope):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not scope \
                    and any(mentions(statement, names) for statement in node.body):
                found.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None \
                    and mentions(node.value, names):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found |= {t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) \
                    and node.func.attr in ("append", "extend", "insert", "add", "update", "add_module") \
                    and any(mentions(arg, names) for arg in [*node.args, *[k.value for k in node.keywords]]):
                found.add(node.func.value.id)
        if found <= names:
            return names
        names |= found


def is_extension_call(node: ast.Call, facts: ModuleFacts, extension_attrs: set[str], reaching: frozenset[str],
                       loop_names: set[str] = frozenset()) -> bool:
    """A call that runs candidate kernels: through an extension handle, a `self` attribute reaching one, a
    registered custom op, a local class/function that reaches one (`Fn.apply`, `get_ext().fn`, a helper module),
    or a name bound by looping over such an attribute."""
    parts = (dotted_name(node.func) or "").split(".")
    resolved = facts.resolve(node.func) or ""
    return (parts[0] in facts.extension_names
            or (parts[0] == "self" and len(parts) >= 2 and parts[1] in extension_attrs)
            or (resolved.startswith("torch.ops.") and not resolved.startswith(BUILTIN_OP_NAMESPACES))
            or facts.is_loader_call(node)
            or call_base_name(node.func) in reaching
            or (len(parts) == 1 and parts[0] in loop_names))


def extension_reaching_locals(tree: ast.Module, facts: ModuleFacts) -> frozenset[str]:
    """Module-level classes and functions other than ModelNew whose code uses, calls or loads an extension, directly
    or through another such class or function (to a fixed point): helper modules, autograd Functions, lazy loaders
    (`def get_ext(): return ext`)."""
    defs = {n.name: n for n in tree.body
            if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name != "ModelNew"}
    reaching: set[str] = set()
    while True:
        found = set()
        for name, node in defs.items():
            if name in reaching:
                continue
            attrs = self_attribute_kinds(node, facts, frozenset(reaching))[0] if isinstance(node, ast.ClassDef) \
                else set()
            if mentions(node, facts.extension_names | reaching) or any(
                    isinstance(sub, ast.Call) and is_extension_call(sub, facts, attrs, frozenset(reaching))
                    for sub in ast.walk(node)):
                found.add(name)
        if not found:
            return frozenset(reaching)
        reaching |= found


def loop_names_over(funcs: list[ast.FunctionDef], attrs: set[str]) -> set[str]:
    """Names bound by `for layer in self.attr` (or `self.attr.children()`, `enumerate(self.attr)`, ...) over the
    given attributes: calling them calls what the attribute holds."""
    names: set[str] = set()
    for func in funcs:
        for node in ast.walk(func):
            if isinstance(node, ast.For) and any(
                    (dotted_name(sub) or "").split(".")[:2] in [["self", a] for a in attrs] for sub in ast.walk(node.iter)):
                names |= {sub.id for sub in ast.walk(node.target) if isinstance(sub, ast.Name)}
    return names


def forward_path_of(cls: ast.ClassDef, facts: ModuleFacts) -> list[ast.FunctionDef]:
    """`forward` plus the methods and module-level functions it reaches by direct calls."""
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if "forward" not in methods:
        return []
    reached: dict[int, ast.FunctionDef] = {}
    pending = [methods["forward"]]
    while pending:
        func = pending.pop()
        if id(func) in reached:
            continue
        reached[id(func)] = func
        for node in ast.walk(func):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "self" and node.func.attr in methods:
                pending.append(methods[node.func.attr])
            elif isinstance(node.func, ast.Name) and node.func.id in facts.functions:
                pending.append(facts.functions[node.func.id])
    return list(reached.values())


def classify_forward_calls(funcs: list[ast.FunctionDef], facts: ModuleFacts, extension_attrs: set[str],
                            torch_module_attrs: set[str], reaching: frozenset[str] = frozenset()) -> tuple[int, list[str]]:
    """Count extension calls and list PyTorch compute ops on the forward path."""
    extension_calls = 0
    torch_ops: list[str] = []
    loop_names = loop_names_over(funcs, extension_attrs)
    torch_loop_names = loop_names_over(funcs, torch_module_attrs) - loop_names
    for func in funcs:
        # `get_ext().fn(x)` is one call: the calls inside another call's callee chain are not counted again.
        chained = {id(inner) for node in ast.walk(func) if isinstance(node, ast.Call)
                   for inner in ast.walk(node.func) if isinstance(inner, ast.Call)}
        for node in ast.walk(func):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                torch_ops.append("@")
            if not isinstance(node, ast.Call) or id(node) in chained:
                continue
            dotted = dotted_name(node.func) or ""
            parts = dotted.split(".")
            resolved = facts.resolve(node.func) or ""
            builtin_op = resolved.startswith(BUILTIN_OP_NAMESPACES)
            if is_extension_call(node, facts, extension_attrs, reaching, loop_names):
                extension_calls += 1
            elif isinstance(node.func, ast.Call) and builds_torch_module(node.func, facts):
                torch_ops.append(f"{facts.resolve(node.func.func)}(...)(...) (a torch.nn module built and called)")
            elif parts[0] == "self" and len(parts) == 2 and parts[1] in torch_module_attrs:
                torch_ops.append(f"self.{parts[1]} (torch.nn module)")
            elif len(parts) == 1 and parts[0] in torch_loop_names:
                torch_ops.append(f"{parts[0]} (a torch.nn module looped over)")
            elif builtin_op or (resolved.startswith("torch.") and parts[-1] not in NON_COMPUTE_TORCH_CALLS
                                and not resolved.startswith(("torch.cuda.", "torch.ops."))):
                torch_ops.append(resolved)
            elif isinstance(node.func, ast.Attribute) and node.func.attr in TENSOR_COMPUTE_METHODS \
                    and not resolved.startswith("torch."):
                torch_ops.append(f".{node.func.attr}()")
    return extension_calls, torch_ops


def host_transfers(funcs: list[ast.FunctionDef], facts: ModuleFacts) -> list[str]:
    """Calls on the forward path that bring a tensor's values to the host: `.cpu()`, `.numpy()`, `.to("cpu")`
    (also `device="cpu"` or `torch.device("cpu")`), `torch.from_numpy`."""
    def names_cpu(arg: ast.AST) -> bool:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value.split(":")[0] == "cpu"
        return isinstance(arg, ast.Call) and (facts.resolve(arg.func) or "") == "torch.device" \
            and bool(arg.args) and names_cpu(arg.args[0])

    found: list[str] = []
    for func in funcs:
        for node in ast.walk(func):
            if not isinstance(node, ast.Call):
                continue
            resolved = facts.resolve(node.func) or ""
            if resolved == "torch.from_numpy":
                found.append(f"line {node.lineno}: torch.from_numpy")
            elif isinstance(node.func, ast.Attribute) and not resolved.startswith("torch."):
                attr = node.func.attr
                if attr in HOST_TRANSFER_METHODS or (attr == "to" and any(
                        names_cpu(a) for a in [*node.args, *(k.value for k in node.keywords if k.arg == "device")])):
                    found.append(f"line {node.lineno}: .{attr}({'cpu' if attr == 'to' else ''})")
    return found
