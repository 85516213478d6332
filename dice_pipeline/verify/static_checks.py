"""Static (AST + source-text) checks on a candidate `ModelNew` file: the deceptive-kernel patterns of NOTES.md
section 3 that can be recognised without running anything. Never executes or imports the candidate.

Policy (each finding is a `Reason` with stage "static"; `deceptive` findings reject the candidate):
- `torch_only_forward` (deceptive): ModelNew's forward path calls PyTorch compute ops and no extension function.
  An extension is reached however real candidates call it: a module-level handle or a `self` attribute bound to it
  (`self.f = ext.fn; self.f(x)`), a registered `torch.ops` op, a lazy loader (`get_ext().fn(x)`), an
  `autograd.Function` (`Fn.apply(x)`), or a helper `nn.Module` of the file whose code calls one, held in an
  attribute, a `Sequential`/`ModuleList` or a `_make_layer`-style method and called or looped over in forward.
  Where the reach is real but indirect, the runtime profiler still has to see the candidate's kernels run.
- `torch_op_on_forward_path`: PyTorch compute ops next to extension calls. KernelBench allows this (a fused custom
  epilogue after a cuDNN conv is a common, honest pattern), so it is a flag unless the config forbids it; the
  runtime profiler then reports how much GPU time the candidate's own kernels took.
- `no_cuda_extension` (deceptive): no `load_inline`/`load` call at all, so no custom kernel can run.
- `inherits_reference` / `reference_access` (deceptive): `ModelNew(Model)`, any use of `Model` inside ModelNew, or
  an import of the module the verifier loads the reference as.
- `try_except_fallback` (deceptive): a `try` with a handler that does not end by re-raising (logging first is
  fine; returning, breaking or continuing before the raise is not), or `contextlib.suppress`; a kernel file has no
  honest need to swallow errors, and every such block seen in the wild was a fallback.
- `side_stream`, `thread_spawn` (deceptive): new CUDA streams or threads (Python or C++) escape the timer.
- `monkeypatch`, `global_flag_flip` (deceptive): assigning to attributes of imported modules (timers, allclose)
  or mutating a namespace mapping (`vars(m).update`, `m.__dict__[...]`),
  or flipping TF32/cuDNN/precision flags (Python or C++), which slows the baseline or fakes the check.
- `frame_or_gc_access` (deceptive): `gc`, frames, `sys.modules`, `ctypes`, `__builtins__`, or such modules reached
  through another module (`torch.sys.modules`): ways to reach the reference's output or the harness.
- `process_spawn` (deceptive): `subprocess`/`signal`/`socket`, `os.system`/`fork`/`exec*`/`spawn*`, or fork/popen/
  system/exec from C++: work or interference outside the judged call.
- `dynamic_code` (deceptive): `__import__`, `eval`, `exec`, `compile`, or `getattr` of an imported module with a
  computed name (`getattr(torch, "s" + "ys")`, `vars(torch)[name]`): code these checks cannot read. A constant
  name is read as the attribute it names. (Routes remain that no reading of the source closes, `operator.attrgetter`
  among them: the runtime guard is the check of record.)
- `tensor_subclass` (deceptive): `__torch_function__`/`__torch_dispatch__`/Tensor subclasses (lazy outputs).
- `dispatcher_override` (deceptive): kernels registered for PyTorch's own operators (`torch.library` impls or
  `TORCH_LIBRARY_IMPL`/`TORCH_LIBRARY_FRAGMENT` into a namespace the file does not define, e.g. `aten`; backend
  fallbacks; the C++ dispatcher's registration API) or Python modes and dispatch-key switches that re-route every
  op call (`TorchDispatchMode`, `torch._C._push_on_torch_*_stack`, ...): they change what the reference computes
  and what the output checks answer. Registering the candidate's own operators in its own namespace is fine.
  The runtime guard compares the dispatcher itself (harness.DispatcherSnapshot) for what escapes this reading.
- `host_compute` (deceptive): the forward path moves tensors to the host (`.cpu()`, `.numpy()`, `.to("cpu")`,
  `torch.from_numpy`): work done on the CPU is not a CUDA kernel, and a GPU profile shows none of it.
- `precision_downgrade` (deceptive): fp16/bf16/TF32 arithmetic in a candidate whose reference is fp32-only.
  The C/C++ text checks read the file's string literals without C/C++ comments and without Python docstrings, and
  a dtype compared in a guard (`x.scalar_type() != at::kHalf`) is not a use of it.
- Kernels that are not the candidate's CUDA doing the work, each deceptive: `compiled_torch_code` (`torch.compile`,
  dynamo/inductor, TorchScript `jit.script`/`trace`, the jiterator: PyTorch code compiled into fused kernels, whose
  speedup over eager is the compiler's), `foreign_kernel_backend` (Triton, CuPy, Numba, PyCUDA, cuda-python, TVM,
  TileLang, Warp, the CUTLASS Python DSL, ...: kernels outside the CUDA sources being judged), and
  `cuda_graph_capture` (`torch.cuda.graph`/`CUDAGraph`/`make_graphed_callables` from Python: replaying captured
  PyTorch ops removes the launch overhead the eager baseline pays, a speedup with no kernel written). Found in any
  use of the name (call, decorator, alias, import, `getattr` with a constant name), not only on the forward path.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from dice_pipeline.verify.static_reading import (
    classify_forward_calls,
    dotted_name,
    extension_reaching_locals,
    forward_path_of,
    host_transfers,
    ModuleFacts,
    self_attribute_kinds,
)
from dice_pipeline.verify.verdict import Reason, Status

# The names the verifier's worker imports the reference and the candidate under (worker.run_judge_stage).
REFERENCE_MODULE = "reference_module"
CANDIDATE_MODULE = "candidate_module"
THREAD_MODULES = frozenset({"threading", "_thread", "concurrent", "multiprocessing", "asyncio"})
INTROSPECTION_MODULES = frozenset({"gc", "inspect", "ctypes", "importlib", "builtins", "dice_pipeline"})
# Other processes, signals and sockets: work or interference outside the judged call.
PROCESS_MODULES = frozenset({"subprocess", "pty", "signal", "socket", "pexpect", "sh"})
PROCESS_CALLS = frozenset({"system", "popen", "fork", "forkpty", "kill", "killpg", "posix_spawn", "posix_spawnp",
                           "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
                           "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe"})
# Standard-library modules that other modules re-export (torch.sys, torch.os, ...): reaching them that way is
# reaching them all the same.
REEXPORTED_STDLIB = THREAD_MODULES | INTROSPECTION_MODULES | PROCESS_MODULES | {"sys", "os"}
# Mutating a namespace mapping (`vars(m).update(...)`, `m.__dict__.setdefault(...)`) patches it.
MAPPING_MUTATORS = frozenset({"update", "setdefault", "__setitem__", "__delitem__", "pop", "popitem", "clear"})
GLOBAL_FLAG_CALLS = frozenset(
    {
        "torch.set_float32_matmul_precision", "torch.set_default_dtype", "torch.set_default_tensor_type",
        "torch.set_default_device",
        "torch.use_deterministic_algorithms", "torch.set_flush_denormal", "torch.backends.cudnn.flags",
        "torch.backends.cuda.sdp_kernel", "torch.backends.cuda.enable_flash_sdp",
        "torch.backends.cuda.enable_math_sdp", "torch.backends.cuda.enable_mem_efficient_sdp",
    }
)
# Names (and everything under them) that put work in kernels other than the candidate's own CUDA; see the policy.
COMPILED_TORCH_NAMES = ("torch.compile", "torch.compiler", "torch._dynamo", "torch._inductor", "torch.jit.script",
                        "torch.jit.trace", "torch.jit.trace_module", "torch.jit.freeze",
                        "torch.jit.optimize_for_inference", "torch.cuda.jiterator", "torch._C._jit")
GRAPH_CAPTURE_NAMES = ("torch.cuda.graph", "torch.cuda.graphs", "torch.cuda.CUDAGraph",
                       "torch.cuda.make_graphed_callables", "torch._C._CUDAGraph")
# Names (and everything under them) that re-route PyTorch's op calls, the reference's and the harness's included.
DISPATCH_ROUTING_NAMES = ("torch._C._dispatch_", "torch._C._push_on_torch_", "torch._C._set_torch_function_mode",
                          "torch._C._set_dispatch_mode", "torch._C._EnablePythonDispatcher",
                          "torch._C._EnableTorchFunction", "torch._C._DisableTorchDispatch",
                          "torch._C._ExcludeDispatchKeyGuard", "torch._C._IncludeDispatchKeyGuard",
                          "torch._C._set_autograd_fallback_mode", "torch.utils._python_dispatch",
                          "torch.overrides.TorchFunctionMode", "torch.overrides.BaseTorchFunctionMode",
                          "torch._ops.HigherOrderOperator.py_impl")
# torch.library calls that give an operator named by its first argument ("ns::op") a kernel of the caller's.
LIBRARY_KERNEL_CALLS = frozenset({"impl", "register_kernel", "register_fake", "register_autograd", "impl_abstract",
                                  "register_torch_dispatch", "register_vmap", "register_autocast", "fallthrough_kernel"})
# torch.library calls that define an operator ("ns::op"): the namespace is then the candidate's own.
LIBRARY_DEFINE_CALLS = frozenset({"custom_op", "define", "triton_op"})
# Leaves of `torch._C._set_*`: private setters of global state (TF32, cuDNN, precision, determinism, ...).
PRIVATE_SETTER_PREFIX = "torch._C._set_"
FOREIGN_KERNEL_MODULES = frozenset({"triton", "cupy", "cupyx", "numba", "pycuda", "cuda", "tvm", "tilelang", "warp",
                                    "cutlass", "taichi", "jax", "tensorflow", "hidet", "thunderkittens"})
STREAM_ATTRS = frozenset({"Stream", "stream", "ExternalStream", "set_stream", "StreamContext"})
STREAM_NAMESPACES = ("torch.cuda.", "torch.accelerator.")
HALF_DTYPE_ATTRS = frozenset({"float16", "half", "bfloat16"})
TORCH_OVERRIDE_HOOKS = ("__torch_function__", "__torch_dispatch__")
HALF_CAST_METHODS = frozenset({"half", "bfloat16"})

CUDA_TEXT_PATTERNS: list[tuple[str, re.Pattern[str], str]] = [
    ("side_stream", re.compile(r"cudaStreamCreate\w*|getStreamFromPool|cudaStreamNonBlocking|cudaStreamPerThread"
                               r"|CU_STREAM_PER_THREAD|default-stream[ =]+per-thread|CUDA_API_PER_THREAD_DEFAULT_STREAM"),
     "creates or selects another CUDA stream (per-thread default streams too); its work escapes the timer"),
    ("thread_spawn", re.compile(r"std::j?thread\b|std::async\b|pthread_create|#\s*include\s*<thread>"),
     "spawns a host thread from C++"),
    ("process_spawn", re.compile(r"\b(?:fork|vfork|popen|system|execv\w*|execl\w*|posix_spawn\w*)\s*\("),
     "starts another process from C++"),
    ("dispatcher_override", re.compile(r"\bc10::Dispatcher\b|\bDispatcher::singleton\b|\bRegisterOperators\b"
                                       r"|\bregisterFallback\b|\bregisterImpl\b"),
     "registers kernels through the C++ dispatcher's API, for any operator (PyTorch's included)"),
    ("global_flag_flip", re.compile(r"cublasSetMathMode|setAllowTF32\w*|setBenchmarkCuDNN|setFloat32MatmulPrecision"
                                    r"|setAllowFP16ReductionCuBLAS|setAllowBF16ReductionCuBLAS"),
     "changes a global math/cuDNN setting from C++"),
]
HALF_TEXT_PATTERN = re.compile(
    r"\b__half2?\b|\bhalf2\b|__nv_bfloat16|\bnv_bfloat16\b|__float2half|__float2bfloat16|__float_to_tf32"
    r"|precision::tf32|\.tf32\b|\bkHalf\b|\bkBFloat16\b|\bkFloat16\b"
)
REFERENCE_HALF_PATTERN = re.compile(r"float16|bfloat16|\.half\(\)|torch\.half\b|__half|kHalf|kBFloat16")
GLOBAL_KERNEL_PATTERN = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?[^;{(]*?\b(\w+)\s*\(")


@dataclass
class StaticReport:
    """What the static pass found. `status` is None when nothing rejects the candidate."""

    reasons: list[Reason] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    status: Status | None = None
    extension_calls_on_forward: int = 0
    torch_ops_on_forward: list[str] = field(default_factory=list)
    kernel_names: list[str] = field(default_factory=list)  # __global__ functions in the candidate's strings

    def reject(self, status: Status, code: str, message: str) -> None:
        self.reasons.append(Reason(code=code, message=message, stage="static"))
        # compile_error (cannot even parse) outranks deceptive: nothing else can be said about such a file.
        if self.status is None or status == Status.COMPILE_ERROR:
            self.status = status


def cuda_kernel_names(source_text: str) -> list[str]:
    """Names of `__global__` functions declared in CUDA source text, in order, without duplicates."""
    return list(dict.fromkeys(GLOBAL_KERNEL_PATTERN.findall(source_text)))


_CPP_LIBRARY = re.compile(r"\bTORCH_LIBRARY(_IMPL|_FRAGMENT)?\s*\(\s*(\w+)")


def _check_dispatcher_registrations(report: StaticReport, tree: ast.Module, facts: ModuleFacts,
                                    cuda_text: str) -> None:
    """Kernels registered into a namespace the file does not define itself (PyTorch's `aten`, `prims`, ...; `_`:
    a backend fallback for every operator): Python `torch.library` and C++ `TORCH_LIBRARY_IMPL`/`_FRAGMENT`.
    A namespace is the file's own where it defines it: `TORCH_LIBRARY(ns, m)`, `Library("ns", "DEF")`,
    `torch.library.custom_op("ns::f")`/`define("ns::f")`."""
    def constant(node: ast.Call, position: int, keyword: str) -> str | None:
        arg = node.args[position] if len(node.args) > position else next(
            (k.value for k in node.keywords if k.arg == keyword), None)
        return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None

    own: set[str] = set()
    registrations: list[tuple[str | None, str]] = []  # (namespace or None when not a constant, where)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        resolved = facts.resolve(node.func) or ""
        if not resolved.startswith("torch.library."):
            continue
        leaf = resolved.rsplit(".", 1)[-1]
        if leaf == "Library":
            ns, kind = constant(node, 0, "ns"), constant(node, 1, "kind")
            if kind == "DEF" and ns is not None:
                own.add(ns)
            elif kind != "DEF":
                registrations.append((ns, f"line {node.lineno}: torch.library.Library({ns!r}, {kind!r})"))
        elif leaf in LIBRARY_DEFINE_CALLS and (name := constant(node, 0, "name")) and "::" in name:
            own.add(name.split("::")[0])
        elif leaf in LIBRARY_KERNEL_CALLS and (name := constant(node, 0, "qualname")) is not None:
            registrations.append((name.split("::")[0] if "::" in name else None, f"line {node.lineno}: {resolved}({name!r})"))
    for match in _CPP_LIBRARY.finditer(cuda_text):
        if match.group(1) is None:
            own.add(match.group(2))
        else:
            registrations.append((match.group(2), match.group(0)))
    foreign = [where for ns, where in registrations if ns is None or ns == "_" or ns not in own]
    if foreign:
        report.reject(Status.DECEPTIVE, "dispatcher_override",
                      f"registers kernels into a namespace it does not define ({'; '.join(foreign[:3])}): PyTorch's "
                      f"operators would run the candidate's code, in the reference and the output checks too")


# A reduced-precision dtype compared in a guard (`x.scalar_type() != at::kHalf`) is not a use of it.
DTYPE_COMPARISON_PATTERN = re.compile(r"[!=]=\s*(?:(?:at|c10|torch)::)?(?:ScalarType::)?k(?:Half|BFloat16|Float16)\b"
                                      r"|\bk(?:Half|BFloat16|Float16)\s*[!=]=")


def _string_constants(tree: ast.AST) -> str:
    """The module's string literals joined, where the CUDA/C++ sources live: without Python docstrings and without
    C/C++ comments, so prose about a pattern is not taken for the pattern."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
                  and isinstance(node.body[0].value.value, str)}
    return "\n".join(strip_c_comments(n.value) for n in ast.walk(tree)
                     if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings)


def strip_c_comments(source: str) -> str:
    """C/C++ source without its comments (each replaced by a space; newlines kept). String and character literals
    are skipped over, so a `//` inside `"http://..."` does not hide the code after it on that line. Each Python
    string is stripped on its own: a `/*` in one cannot swallow the next."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        two = source[i:i + 2]
        if two == "//":
            end = source.find("\n", i)
            i = n if end < 0 else end
            out.append(" ")
        elif two == "/*":
            end = source.find("*/", i + 2)
            comment = source[i:n if end < 0 else end + 2]
            out.append(" " + "\n" * comment.count("\n"))
            i += len(comment)
        elif source[i] in "\"'":
            quote, j = source[i], i + 1
            while j < n and source[j] != quote and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            out.append(source[i:j + 1])
            i = j + 1
        else:
            out.append(source[i])
            i += 1
    return "".join(out)


def _check_model_new(report: StaticReport, tree: ast.Module, facts: ModuleFacts, forbid_torch: bool) -> None:
    cls = facts.classes.get("ModelNew")
    if cls is None:
        report.reject(Status.COMPILE_ERROR, "missing_model_new", "the candidate defines no class ModelNew")
        return
    base_names = {(dotted_name(b) or "").rsplit(".", 1)[-1] for b in cls.bases}
    if "Model" in base_names:
        report.reject(Status.DECEPTIVE, "inherits_reference", "ModelNew subclasses the reference Model")
    if any(isinstance(n, ast.Name) and n.id == "Model" for n in ast.walk(cls)):
        report.reject(Status.DECEPTIVE, "reference_access", "ModelNew refers to the reference class Model")
    reaching = extension_reaching_locals(tree, facts)
    extension_attrs, torch_module_attrs = self_attribute_kinds(cls, facts, reaching)
    forward_funcs = forward_path_of(cls, facts)
    if not forward_funcs:
        if "Model" not in base_names:
            report.reject(Status.COMPILE_ERROR, "missing_forward", "ModelNew defines no forward method")
        return
    report.extension_calls_on_forward, report.torch_ops_on_forward = classify_forward_calls(
        forward_funcs, facts, extension_attrs, torch_module_attrs, reaching
    )
    ops = sorted(set(report.torch_ops_on_forward))
    host = host_transfers(forward_funcs, facts)
    if host:
        report.reject(Status.DECEPTIVE, "host_compute",
                      f"forward path moves tensors to the host ({'; '.join(host[:3])}): work on the CPU, not a kernel")
    if report.torch_ops_on_forward and report.extension_calls_on_forward == 0:
        report.reject(Status.DECEPTIVE, "torch_only_forward",
                      f"forward path calls PyTorch compute ops ({', '.join(ops)}) and no extension function")
    elif report.torch_ops_on_forward:
        if forbid_torch:
            report.reject(Status.DECEPTIVE, "torch_op_on_forward_path",
                          f"PyTorch compute ops on the forward path: {', '.join(ops)}")
        else:
            report.flags.append("torch_ops_on_forward_path")


def _check_statements(report: StaticReport, tree: ast.Module, facts: ModuleFacts, reference_is_fp32: bool) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            if node.handlers and not all(_handler_reraises(h) for h in node.handlers):
                report.reject(Status.DECEPTIVE, "try_except_fallback",
                              f"line {node.lineno}: try/except that does not re-raise (a fallback path)")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                _check_assignment_target(report, target, facts)
        elif isinstance(node, ast.Call):
            _check_call(report, node, facts, reference_is_fp32)
        elif isinstance(node, ast.Attribute):
            if node.attr in ("__globals__", "f_back", "f_locals", "f_globals", "_getframe", "__subclasses__"):
                report.reject(Status.DECEPTIVE, "frame_or_gc_access", f"line {node.lineno}: accesses .{node.attr}")
            resolved = facts.resolve(node) or ""
            if resolved in ("sys.modules",):
                report.reject(Status.DECEPTIVE, "frame_or_gc_access", f"line {node.lineno}: reads sys.modules")
            # Checked where the chain first reaches the module (`torch.sys`), so `torch.sys.modules` counts once.
            if _reaches_stdlib(resolved, facts):
                report.reject(Status.DECEPTIVE, "frame_or_gc_access",
                              f"line {node.lineno}: reaches a standard-library module through {resolved}")
            if reference_is_fp32 and resolved.startswith("torch.") and resolved.rsplit(".", 1)[-1] in HALF_DTYPE_ATTRS:
                report.reject(Status.DECEPTIVE, "precision_downgrade",
                              f"line {node.lineno}: uses {resolved} in an fp32 task")
        elif isinstance(node, ast.Subscript) and _is_namespace_mapping(node.value, facts) \
                and not isinstance(node.slice, ast.Constant):
            report.reject(Status.DECEPTIVE, "dynamic_code",
                          f"line {node.lineno}: a namespace read with a computed key hides what it reaches")
        elif isinstance(node, ast.Name) and node.id == "__builtins__":
            report.reject(Status.DECEPTIVE, "frame_or_gc_access", f"line {node.lineno}: uses __builtins__")
        elif isinstance(node, ast.FunctionDef) and node.name in TORCH_OVERRIDE_HOOKS:
            report.reject(Status.DECEPTIVE, "tensor_subclass", f"defines {node.name} (a tensor subclass/lazy output)")
        elif isinstance(node, ast.Constant) and node.value in TORCH_OVERRIDE_HOOKS:  # type("M", (...), {...: f})
            report.reject(Status.DECEPTIVE, "tensor_subclass", f"line {node.lineno}: names {node.value}")
        elif isinstance(node, ast.ClassDef):
            if any((facts.resolve(b) or "") in ("torch.Tensor", "torch._C.TensorBase") for b in node.bases):
                report.reject(Status.DECEPTIVE, "tensor_subclass", f"class {node.name} subclasses torch.Tensor")


def _getattr_target(node: ast.Call, facts: ModuleFacts) -> str | None:
    """`getattr(torch.cuda, "CUDAGraph")` read as the attribute it names ("torch.cuda.CUDAGraph"); None for any
    other call, or a name that is not a constant string."""
    if (facts.resolve(node.func) or "") not in ("getattr", "builtins.getattr") or len(node.args) < 2:
        return None
    owner, name = facts.resolve(node.args[0]), node.args[1]
    if owner and isinstance(name, ast.Constant) and isinstance(name.value, str):
        return f"{owner}.{name.value}"
    return None


def _reaches_stdlib(resolved: str, facts: ModuleFacts) -> bool:
    """`torch.sys`, `np.os`, ...: a standard-library module reached through another imported module."""
    parts = resolved.split(".")
    return len(parts) >= 2 and parts[0] in facts.imported_roots and parts[0] not in REEXPORTED_STDLIB \
        and parts[-1] in REEXPORTED_STDLIB


def _handler_reraises(handler: ast.ExceptHandler) -> bool:
    """The handler always ends in a raise: its last statement raises and nothing before it leaves the handler
    (statements such as logging are fine)."""
    if not handler.body or not isinstance(handler.body[-1], ast.Raise):
        return False
    def leaves(node: ast.AST) -> bool:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False  # a nested definition's return is its own
        if isinstance(node, (ast.Return, ast.Break, ast.Continue, ast.Yield, ast.YieldFrom)):
            return True
        return any(leaves(child) for child in ast.iter_child_nodes(node))
    return not any(leaves(statement) for statement in handler.body[:-1])


def _check_assignment_target(report: StaticReport, target: ast.AST, facts: ModuleFacts) -> None:
    if isinstance(target, ast.Subscript) and facts.resolve(target.value) == "os.environ":
        return  # setting build variables (TORCH_CUDA_ARCH_LIST, ...) for this process is not patching a module
    for sub in ast.walk(target):
        if not isinstance(sub, ast.Attribute):
            continue
        resolved = facts.resolve(sub) or ""
        root = (dotted_name(sub) or "").split(".")[0]
        if resolved.startswith("torch.backends."):
            report.reject(Status.DECEPTIVE, "global_flag_flip", f"line {sub.lineno}: sets {resolved}")
        elif root and root in facts.aliases and root not in facts.extension_names:
            report.reject(Status.DECEPTIVE, "monkeypatch", f"line {sub.lineno}: assigns to {resolved} of an imported module")
        break  # only the outermost attribute of the target is being assigned


def _check_call(report: StaticReport, node: ast.Call, facts: ModuleFacts, reference_is_fp32: bool) -> None:
    resolved = facts.resolve(node.func) or ""
    leaf = resolved.rsplit(".", 1)[-1]
    if resolved in GLOBAL_FLAG_CALLS:
        report.reject(Status.DECEPTIVE, "global_flag_flip", f"line {node.lineno}: calls {resolved}")
    elif resolved.startswith(PRIVATE_SETTER_PREFIX):
        report.reject(Status.DECEPTIVE, "global_flag_flip", f"line {node.lineno}: calls {resolved}")
    elif (resolved.startswith(STREAM_NAMESPACES) and leaf in STREAM_ATTRS) or resolved == "torch.Stream":
        report.reject(Status.DECEPTIVE, "side_stream", f"line {node.lineno}: calls {resolved}")
    elif resolved in ("setattr", "delattr", "builtins.setattr") and node.args:
        owner = (dotted_name(node.args[0]) or "").split(".")[0]
        if owner in facts.aliases:
            report.reject(Status.DECEPTIVE, "monkeypatch", f"line {node.lineno}: setattr on imported module {owner}")
    elif isinstance(node.func, ast.Attribute) and node.func.attr in MAPPING_MUTATORS and _is_namespace_mapping(
            node.func.value, facts):
        report.reject(Status.DECEPTIVE, "monkeypatch", f"line {node.lineno}: mutates a module's or class's namespace")
    elif leaf in PROCESS_CALLS and {"os", "posix", "pty"} & set(resolved.split(".")[:-1]):
        report.reject(Status.DECEPTIVE, "process_spawn", f"line {node.lineno}: calls {resolved}")
    elif resolved in ("getattr", "builtins.getattr") and len(node.args) >= 2 \
            and (owner := facts.resolve(node.args[0]) or "").split(".")[0] in facts.imported_roots:
        target = _getattr_target(node, facts)
        if target is None:
            report.reject(Status.DECEPTIVE, "dynamic_code",
                          f"line {node.lineno}: getattr({owner}, <a computed name>) hides what it reaches")
        elif _reaches_stdlib(target, facts):
            report.reject(Status.DECEPTIVE, "frame_or_gc_access",
                          f"line {node.lineno}: reaches a standard-library module through getattr, {target}")
    elif resolved in ("__import__", "eval", "exec", "compile", "builtins.__import__"):
        report.reject(Status.DECEPTIVE, "dynamic_code", f"line {node.lineno}: {resolved}() hides code from these checks")
    elif resolved in ("contextlib.suppress", "suppress"):
        report.reject(Status.DECEPTIVE, "try_except_fallback", f"line {node.lineno}: contextlib.suppress swallows errors")
    elif resolved in ("torch.Tensor._make_subclass", "torch.Tensor._make_wrapper_subclass"):
        report.reject(Status.DECEPTIVE, "tensor_subclass", f"line {node.lineno}: builds a tensor subclass")
    if reference_is_fp32 and isinstance(node.func, ast.Attribute) and node.func.attr in HALF_CAST_METHODS \
            and not node.args and not resolved.startswith("torch."):
        report.reject(Status.DECEPTIVE, "precision_downgrade", f"line {node.lineno}: .{node.func.attr}() in an fp32 task")


def _is_namespace_mapping(node: ast.AST, facts: ModuleFacts) -> bool:
    """`vars(x)`, `x.__dict__` or `globals()`: the mapping behind a namespace."""
    if isinstance(node, ast.Call) and (facts.resolve(node.func) or "") in ("vars", "globals", "builtins.vars"):
        return True
    return isinstance(node, ast.Attribute) and node.attr == "__dict__"


def _check_imports(report: StaticReport, facts: ModuleFacts) -> None:
    if facts.imported_roots & {REFERENCE_MODULE, CANDIDATE_MODULE}:
        report.reject(Status.DECEPTIVE, "reference_access",
                      "imports the module the verifier loads the reference (or the candidate) as: a way to change "
                      "what it is compared with")
    for root in sorted(facts.imported_roots & THREAD_MODULES):
        report.reject(Status.DECEPTIVE, "thread_spawn", f"imports {root}: work on another thread escapes the timer")
    for root in sorted(facts.imported_roots & INTROSPECTION_MODULES):
        report.reject(Status.DECEPTIVE, "frame_or_gc_access", f"imports {root}: a way to reach harness objects")
    for root in sorted(facts.imported_roots & PROCESS_MODULES):
        report.reject(Status.DECEPTIVE, "process_spawn",
                      f"imports {root}: other processes, signals or sockets act outside the judged call")


def _named_under(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def _check_kernel_sources(report: StaticReport, tree: ast.Module, facts: ModuleFacts) -> None:
    """Kernels other than the candidate's own CUDA doing the work: compiled PyTorch, other kernel languages, and
    replayed graphs of PyTorch ops (see the policy above). One reason per code, at its first use."""
    uses: dict[str, list[tuple[int, str]]] = {}

    def classify(name: str, line: int) -> None:
        if name.startswith(DISPATCH_ROUTING_NAMES):
            uses.setdefault("dispatcher_override", []).append((line, name))
        elif _named_under(name, COMPILED_TORCH_NAMES):
            uses.setdefault("compiled_torch_code", []).append((line, name))
        elif _named_under(name, GRAPH_CAPTURE_NAMES):
            uses.setdefault("cuda_graph_capture", []).append((line, name))
        elif name.split(".")[0] in FOREIGN_KERNEL_MODULES and name.split(".")[0] in facts.imported_roots:
            uses.setdefault("foreign_kernel_backend", []).append((line, name))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            for alias in node.names:
                classify(f"{module}.{alias.name}" if module else alias.name, node.lineno)
        elif isinstance(node, (ast.Attribute, ast.Name)):
            classify(facts.resolve(node) or "", node.lineno)
        elif isinstance(node, ast.Call) and (target := _getattr_target(node, facts)):
            classify(target, node.lineno)
    what = {"compiled_torch_code": "PyTorch code compiled into kernels that are not the candidate's CUDA",
            "cuda_graph_capture": "a replayed graph of PyTorch ops is launch overhead removed, not a kernel written",
            "foreign_kernel_backend": "kernels from another language or library, not the CUDA sources being judged",
            "dispatcher_override": "re-routes PyTorch's op calls (the reference's and the output checks' too)"}
    for code, found in uses.items():
        line, name = min(found)
        more = len({n for _, n in found} - {name})
        report.reject(Status.DECEPTIVE, code, f"line {line}: {name}{f' (and {more} more)' if more else ''}: "
                                              f"{what[code]}")


def _check_cuda_text(report: StaticReport, text: str, reference_is_fp32: bool) -> None:
    for code, pattern, message in CUDA_TEXT_PATTERNS:
        match = pattern.search(text)
        if match:
            report.reject(Status.DECEPTIVE, code, f"{message} ({match.group(0)!r})")
    if reference_is_fp32:
        match = HALF_TEXT_PATTERN.search(DTYPE_COMPARISON_PATTERN.sub(" ", text))
        if match:
            report.reject(Status.DECEPTIVE, "precision_downgrade",
                          f"CUDA source computes in reduced precision ({match.group(0)!r}) for an fp32 task")


def check_candidate_source(reference_src: str, candidate_src: str, *, forbid_torch_compute_on_forward: bool = False) -> StaticReport:
    """Run every static check on a candidate; the reference is read only to learn its dtypes."""
    report = StaticReport()
    try:
        tree = ast.parse(candidate_src)
    except SyntaxError as exc:
        report.reject(Status.COMPILE_ERROR, "syntax_error", f"candidate does not parse: {exc.msg} (line {exc.lineno})")
        return report
    facts = ModuleFacts()
    facts.visit(tree)
    reference_is_fp32 = not REFERENCE_HALF_PATTERN.search(reference_src)
    cuda_text = _string_constants(tree)
    report.kernel_names = cuda_kernel_names(cuda_text)
    if facts.loader_calls == 0:
        report.reject(Status.DECEPTIVE, "no_cuda_extension", "no load_inline/load call: no custom kernel can run")
    _check_model_new(report, tree, facts, forbid_torch_compute_on_forward)
    _check_statements(report, tree, facts, reference_is_fp32)
    _check_imports(report, facts)
    _check_kernel_sources(report, tree, facts)
    _check_dispatcher_registrations(report, tree, facts, cuda_text)
    _check_cuda_text(report, cuda_text, reference_is_fp32)
    return report
