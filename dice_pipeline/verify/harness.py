"""The GPU judgement of one candidate, run inside an isolated worker: correctness trials, runtime anti-gaming
checks and interleaved timing. Imports torch and the standard library only.

Runtime policy (reason codes; NOTES.md section 3):
- `output_mismatch`, `shape_mismatch`, `dtype_mismatch`, `device_mismatch`, `output_structure_mismatch`,
  `output_not_plain_tensor` (incorrect): N seeded trials, candidate called before and after the reference on cloned inputs.
- `output_not_fully_written` (incorrect): outputs are allocated from NaN-poisoned memory; poison left = unwritten.
- `mutated_inputs` (deceptive): an input changed by a candidate call (correctness or timed).
- `stale_output_reuse` (deceptive): a wrong output that equals the reference's result for an earlier call's inputs
  (a memoising cache keyed by pointer, shape or call count).
- `runtime_monkeypatch`, `global_flag_flip`, `spawned_thread` (deceptive): identities of torch/time callables,
  math flags and the thread count are compared with a snapshot taken before the candidate was imported.
- `dispatcher_override` (deceptive): PyTorch's operators given the candidate's kernels (`torch.library` impls or
  `TORCH_LIBRARY_IMPL(aten, ...)` on existing operators, backend fallbacks) or op calls re-routed (Python modes left
  on the stacks, autocast, dispatch keys included/excluded): they change the reference and the output checks too.
- `no_custom_kernel_ran` (deceptive): a profiler pass saw none of the candidate's own kernels; the custom share of
  GPU time is recorded (flag `minor_custom_kernel_share` under config.minor_custom_share).
- `baseline_kernel` (deceptive under config.baseline_kernel_policy "reject", else a flag): the candidate's own
  kernels did a minor share of its GPU time and PyTorch/library compute kernels the rest.
- `nondeterministic_output` (incorrect): two runs of the candidate on the same inputs disagree far beyond rounding.
- `infrastructure_error`: the verifier's own state ran out of GPU memory (`harness_out_of_memory`,
  `reference_out_of_memory`); `candidate_out_of_memory` is the candidate's runtime error. Both are judged once
  more with less resident state (config.low_memory) before the verdict stands.
- `generated_kernels_ran` (deceptive): that profiler pass saw kernels a compiler generated from PyTorch code
  (Inductor's Triton kernels, nvFuser): torch.compile reached some way the static checks could not read.
- `timed_output_mismatch` (deceptive): every timed call runs on fresh input values and its output is re-checked.
- timing: every pair is timed in both conventions (`speedup_gpu`: flush and call enqueued back to back;
  `speedup_host`: device synchronized before the call); `speedup` is config.speedup_convention's.
- `work_outside_timed_stream` (deceptive): wall clock to a device-wide sync far exceeds the timed stream's events.
- flags: `degenerate_task` (zeros or a constant pass the task), `overhead_dominated` (the reference takes under
  config.overhead_floor_multiple launch floors: never rewarded), `nondeterministic_reference`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import os
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from collections.abc import Iterator
from typing import Any, Callable

import torch

from dice_pipeline.verify.config import TOLERANCE_LOOSE, TOLERANCE_STRICT, VerifyConfig
from dice_pipeline.verify.gpu_share import GpuShareClient
from dice_pipeline.verify.verdict import (
    Reason,
    Status,
    TimingStats,
    generated_kernel_names,
    generated_kernels_reason,
    kernel_is_named,
)


class Rejection(Exception):
    """Ends the judgement early with a status; the verdict keeps whatever was measured before."""

    def __init__(self, status: Status, code: str, message: str, stage: str):
        super().__init__(message)
        self.reason = Reason(code=code, message=message, stage=stage)
        self.status = status


def _flags_snapshot() -> dict[str, Any]:
    return {
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "cudnn.enabled": torch.backends.cudnn.enabled,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
    }


# --- PyTorch's dispatcher -----------------------------------------------------------------------------------------
# Its entry points, taken at import (before any candidate code): a candidate that rebinds them hides nothing.
_ALL_OP_NAMES = torch._C._dispatch_get_all_op_names
_DISPATCH_DUMP = torch._C._dispatch_dump
_HAS_BACKEND_FALLBACK = torch._C._dispatch_has_backend_fallback
# One name per key (the enum has aliases: CPU, Dense and StartOfDenseBackends are one value).
_DISPATCH_KEYS = tuple({int(key): key for key in reversed(torch._C.DispatchKey.__members__.values())}.values())
_ROUTING_PROBES = {
    "torch_function_modes": torch._C._len_torch_function_stack,
    "torch_dispatch_modes": torch._C._len_torch_dispatch_stack,
    "dispatch_keys_included": lambda _f=torch._C._dispatch_tls_local_include_set: str(_f()),
    "dispatch_keys_excluded": lambda _f=torch._C._dispatch_tls_local_exclude_set: str(_f()),  # autocast shows here
    "autograd_fallback_mode": torch._C._get_autograd_fallback_mode,
}
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# Where a kernel registered through torch.library's public API is recorded (the API's own frame, not its caller's).
_PUBLIC_REGISTRATION_FILES = tuple(_TORCH_DIR + name for name in ("library.py", "_library" + os.sep, "_custom_ops.py",
                                                                  "_ops.py"))


def _registered_by_pytorch(where: str) -> bool:
    """A kernel PyTorch registered for itself: from one of its own files other than the public registration API."""
    return where.startswith(_TORCH_DIR) and not where.startswith(_PUBLIC_REGISTRATION_FILES)


def _dispatch_routing() -> dict[str, Any]:
    """What routes every op call, the reference's and the output checks' too, whatever the kernels: Python modes
    left on the mode stacks (TorchFunctionMode/TorchDispatchMode), the thread's dispatch-key include and exclude
    sets (autocast, inference mode), the autograd fallback. Cheap: read on every guard check."""
    return {name: probe() for name, probe in _ROUTING_PROBES.items()}


def _kernel_entries(dumps: dict[str, str]) -> dict[tuple[str, str], str]:
    """(operator, dispatch key) -> where its kernel was registered ("file:line"), from the dispatcher's dumps;
    a kernel an override shadowed stays listed under "<key> (inactive)"."""
    entries: dict[tuple[str, str], str] = {}
    for op, dump in dumps.items():
        for line in dump.splitlines():
            key, sep, rest = line.partition(": registered at ")
            if sep and key != "debug":  # "debug": where the schema was defined, not a kernel
                entries[(op, key)] = rest.split(" :: ", 1)[0]
    return entries


class DispatcherSnapshot:
    """The kernels PyTorch's dispatcher routes each operator to (per dispatch key, with where each was registered)
    and the keys with a backend fallback, captured before the candidate is imported. A candidate that registers
    its own kernel for an operator that existed then (`torch.library.Library("aten", "IMPL").impl(...)`,
    `torch.library.register_kernel`, `TORCH_LIBRARY_IMPL(aten, CUDA, m)` in its extension) changes what the
    reference computes and what the output checks answer: `overrides` lists every such change. New operators of
    the candidate's own (`TORCH_LIBRARY(myops, m)`, `torch.library.custom_op("myops::f")`) are not overrides, and
    neither are kernels PyTorch registers for itself when one of its modules is first imported (registered from
    PyTorch's own files other than torch.library's public API, or new entries from files the snapshot knew).
    Reading it costs about 0.06 s (3,600 operators, on the 2-core CPU machine), so the guard reads it once a
    judgement, not after every call:
    after the timed pairs, once the GPU is given back (before any verdict: a kernel registered at import, in
    `__init__` or in a call is still registered then), or after the correctness trials of a judgement without
    timing (the RL reward's). One registered and removed again before the end could only have faked the
    correctness trials, and the timed pairs check every timed output on fresh inputs."""

    __slots__ = ("dumps", "fallbacks", "_entries")  # no instance attribute can shadow `overrides`

    def __init__(self) -> None:
        self.dumps = self._dumps()
        self.fallbacks = self._fallbacks()
        self._entries: dict[tuple[str, str], str] | None = None  # parsed on first need

    @staticmethod
    def _dumps() -> dict[str, str]:
        return {name: _DISPATCH_DUMP(name) for name in _ALL_OP_NAMES()}

    @staticmethod
    def _fallbacks() -> frozenset[str]:
        return frozenset(str(key) for key in _DISPATCH_KEYS if _HAS_BACKEND_FALLBACK(key))

    @property
    def entries(self) -> dict[tuple[str, str], str]:
        if self._entries is None:
            self._entries = _kernel_entries(self.dumps)
        return self._entries

    def overrides(self) -> list[str]:
        """What changed since the snapshot that re-routes an existing operator, one line each (empty: nothing).
        Changes that re-route nothing (new operators, PyTorch's own lazy registrations) become the new snapshot."""
        dumps, fallbacks = self._dumps(), self._fallbacks()
        found = [f"backend fallback {'added' if key in fallbacks else 'removed'} for {key}"
                 for key in sorted(fallbacks ^ self.fallbacks)]
        if dumps != self.dumps:
            before, now = self.entries, _kernel_entries(dumps)
            known_files = {loc.rsplit(":", 1)[0] for loc in before.values()}
            existing_ops = {op for op, _ in before}
            for (op, key), where in now.items():
                was = before.get((op, key))
                if was is None and op in existing_ops and (
                        not (where.startswith(_TORCH_DIR) or where.rsplit(":", 1)[0] in known_files)
                        # through torch.library's public API: PyTorch's lazy imports add kernels that way too,
                        # but not to aten's operators (the ones the reference and the checks run)
                        or (op.startswith("aten::") and key != "Meta" and where.startswith(_PUBLIC_REGISTRATION_FILES))):
                    found.append(f"{op} [{key}]: a kernel registered at {where}")
                elif was is not None and was != where and not key.endswith("(inactive)") \
                        and not _registered_by_pytorch(where):
                    found.append(f"{op} [{key}]: kernel replaced ({was} -> {where})")
            found += [f"{op} [{key}]: kernel removed (was {was})" for (op, key), was in before.items()
                      if (op, key) not in now]
            if not found:
                self.dumps, self._entries = dumps, now
        return found


_NN_MODULE_INTERNALS = sys.modules[torch.nn.Module.__module__]  # where nn.Module keeps its global hooks


def _global_module_hooks() -> dict[str, tuple[Any, ...]]:
    """The hooks every nn.Module call runs (`torch.nn.modules.module.register_module_forward_hook` and kin): one
    registered by a candidate runs inside the reference's forward too, and can rewrite its output."""
    return {name: tuple(value) for name, value in vars(_NN_MODULE_INTERNALS).items()
            if name.startswith("_global_") and isinstance(value, dict)}


def _model_state(model: torch.nn.Module) -> list[tuple[Any, ...]]:
    """Per module of a model: its class, its hooks, and the callables set on the instance (an instance `forward`
    shadows its class's)."""
    return [(type(module), *(len(getattr(module, hooks, ())) for hooks in (
                "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")),
             tuple(sorted(key for key, value in vars(module).items() if callable(value))))
            for module in model.modules()]


def _instance_functions(obj: Any) -> dict[str, Any]:
    """Callables set on an instance (they shadow its class's methods); the models it holds are not among them."""
    return {key: value for key, value in vars(obj).items()
            if callable(value) and not isinstance(value, torch.nn.Module)}


def _parameter_fingerprint(model: torch.nn.Module) -> list[tuple[Any, ...]]:
    """Per parameter of a model: the tensor object, its storage, and its sum and 2-norm in float64 (no full-size
    copy). A candidate that found the reference model could zero its weights in place and answer zeros itself.
    Buffers are left out: a BatchNorm in training mode updates its running statistics on every call."""
    with torch.no_grad():
        # float.hex: a NaN in an uninitialised (torch.empty) parameter equals itself
        return [(name, id(p), p.data_ptr(), tuple(p.shape), float(p.sum(dtype=torch.float64)).hex(),
                 float(_VECTOR_NORM(p, 2, dtype=torch.float64)).hex()) for name, p in model.named_parameters()]


def _torch_nn_classes() -> dict[str, type]:
    """torch.nn's module classes (Linear, Conv2d, ...): the reference's layers call their `forward`."""
    return {f"torch.nn.{name}": value for name, value in vars(torch.nn).items()
            if isinstance(value, type) and issubclass(value, torch.nn.Module)}


_MISSING = object()
# CandidateJudge attributes that hold the same object from the trusted set-up on: what it compares against and how
# (the reference, its model, the config, the tolerances, the candidate's kernel names, the GPU's gate). The
# harness's own timer, events and device sync are callables set on the instance: watched as those (watch_judge).
JUDGE_FIXED_ATTRIBUTES = ("reference", "ref_model", "config", "guard", "device", "tolerances", "control",
                          "custom_kernel_names", "gpu_share")


class RuntimeGuard:
    """Identities of the callables a cheat would patch (torch's, torch.nn's classes', the harness's, and once
    `watch_reference` ran, the reference's), methods added to those classes (one shadows an inherited method: a
    `softmax` set on torch.Tensor), nn.Module's global hooks, the global math flags, what routes op calls and (with
    `thorough`) the dispatcher's kernels and the reference's parameters, captured before the candidate is imported;
    `check` rejects any change.
    The harness itself only uses references it took before that. Slots, so no instance attribute shadows `check`,
    and `check` first verifies the guard's own state (`_own_state`)."""

    __slots__ = ("namespaces", "identities", "class_keys", "module_hooks", "reference", "model", "judge", "flags",
                 "routing", "threads", "dispatcher", "own_state")

    def __init__(self, dispatcher: DispatcherSnapshot | None = None) -> None:
        import builtins

        self.namespaces: dict[str, Any] = {
            "torch": torch, "torch.Tensor": torch.Tensor, "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event,
            "torch.nn.functional": torch.nn.functional, "torch.nn.Module": torch.nn.Module, "time": time,
            "torch.testing": torch.testing, "torch.linalg": torch.linalg, "builtins": builtins,
            "statistics": statistics, "math": math,
            # The harness itself: its functions and the methods of its classes, however a candidate reached them.
            "harness": sys.modules[__name__],
            **{f"harness.{cls.__name__}": cls
               for cls in (CandidateJudge, RuntimeGuard, DispatcherSnapshot, Comparison, Judgement)},
            "GpuShareClient": GpuShareClient,  # the timed sections' exclusive use of the GPU
            **_torch_nn_classes(),
        }
        self.identities: dict[tuple[str, str], int] = {}
        self.class_keys: dict[str, frozenset[str]] = {}
        for ns_name, ns in list(self.namespaces.items()):
            self._snapshot(ns_name, ns)
        self.module_hooks = _global_module_hooks()
        self.reference: tuple[ModuleType, dict[str, Any]] | None = None  # the module and its simple values
        self.model: tuple[torch.nn.Module, list[tuple[Any, ...]], list[tuple[Any, ...]]] | None = None
        # the judge, its fixed attributes' ids, its instance callables' ids, its config's values
        self.judge: tuple[CandidateJudge, dict[str, int], dict[str, int], dict[str, Any]] | None = None
        self.flags = _flags_snapshot()
        self.routing = _dispatch_routing()
        self.threads = threading.active_count()
        # Taken before the worker's go where it was prestarted (worker.py), else now.
        self.dispatcher = dispatcher or DispatcherSnapshot()
        self.own_state = self._own_state()

    def _own_state(self) -> tuple[Any, ...]:
        """The guard's own containers and snapshots: swapped, or grown or shrunk in place, the guard is disarmed."""
        parts = (self.namespaces, self.identities, self.class_keys, self.module_hooks, self.flags, self.routing,
                 self.dispatcher, self.reference, self.model, self.judge)
        return (*map(id, parts), len(self.identities), len(self.class_keys), len(self.namespaces), self.threads)

    def _snapshot(self, ns_name: str, namespace: Any) -> None:
        self.namespaces[ns_name] = namespace
        items = list(vars(namespace).items())
        self.identities.update({(ns_name, key): id(value) for key, value in items if callable(value)})
        if isinstance(namespace, type):
            self.class_keys[ns_name] = frozenset(key for key, _ in items)

    def watch_reference(self, module: ModuleType, model: torch.nn.Module) -> None:
        """Also guard the reference (trusted code, set up before the candidate is imported): its module's functions
        and simple values (get_inputs() reads its sizes from them), the classes of every module of its model, and
        the model's hooks and instance callables. A candidate that rewrote any of them would change what it is
        compared with. The module is taken once (its first snapshot is the clean one); the model each time the
        reference is built."""
        if self.reference is None:
            self._snapshot("reference", module)
            simple = (int, float, bool, str, bytes, tuple, type(None))
            self.reference = (module, {k: v for k, v in vars(module).items() if isinstance(v, simple)})
        watched = {id(ns) for ns in self.namespaces.values()}
        for submodule in model.modules():
            for cls in type(submodule).__mro__:
                if cls is not object and id(cls) not in watched:
                    watched.add(id(cls))
                    self._snapshot(f"{cls.__module__}.{cls.__qualname__}", cls)
        self.model = (model, _model_state(model), _parameter_fingerprint(model))
        self.own_state = self._own_state()

    def watch_judge(self, judge: CandidateJudge, *, fields: tuple[str, ...] = ()) -> None:
        """Also guard the judge's own state (a candidate that found it, through the garbage collector say, could
        swap the reference model, loosen the config or replace the harness's timer): the objects its fixed
        attributes hold and the config's values. `fields`: those set again by trusted code since (the worker sets
        the candidate's kernel names after its build), taken anew and the rest left as first taken."""
        ids = {name: id(getattr(judge, name)) for name in JUDGE_FIXED_ATTRIBUTES}
        if self.judge is None or self.judge[0] is not judge:
            # callables set on the instance shadow the class's methods (a `run_profiler_check` that does nothing)
            functions = {key: id(value) for key, value in _instance_functions(judge).items()}
            self.judge = (judge, ids, functions, judge.config.to_dict())
        else:
            self.judge[1].update({name: ids[name] for name in fields})
        self.own_state = self._own_state()

    def check(self, when: str, *, thorough: bool = False) -> None:
        """Reject any change since the snapshot; `thorough` also reads the dispatcher's kernels (0.06 s) and the
        reference model's parameters (a pass over them on the device): once a judgement, see DispatcherSnapshot."""
        def patched(what: str) -> Rejection:
            return Rejection(Status.DECEPTIVE, "runtime_monkeypatch", f"{what} {when}", "anti_gaming")

        if self._own_state() != self.own_state:
            raise patched("the runtime guard's own state was changed")

        for (ns_name, key), ident in self.identities.items():
            if id(vars(self.namespaces[ns_name]).get(key)) != ident:
                raise patched(f"{ns_name}.{key} was replaced")
        for ns_name, keys in self.class_keys.items():
            # Data a library caches on a class (copyreg's __slotnames__) is not a method; a callable or a
            # descriptor (property, staticmethod) shadows what the class inherited.
            added = [key for key, value in vars(self.namespaces[ns_name]).items() if key not in keys
                     and (callable(value) or hasattr(value, "__get__"))]
            if added:
                raise patched(f"{ns_name}.{added[0]} was added")
        if _global_module_hooks() != self.module_hooks:
            raise patched("a global nn.Module hook (it runs inside the reference's forward too) was registered")
        if self.reference is not None:
            module, values = self.reference
            changed = sorted(k for k, v in values.items() if vars(module).get(k, _MISSING) != v)
            if changed:
                raise patched(f"the reference module's {changed[0]} was changed")
        if self.model is not None and _model_state(self.model[0]) != self.model[1]:
            raise patched("the reference model's modules (their classes, hooks or instance methods) were changed")
        if self.judge is not None:
            judge, ids, functions, config = self.judge
            now = _instance_functions(judge)
            swapped = [name for name, ident in ids.items() if id(getattr(judge, name, None)) != ident]
            swapped += [key for key, ident in functions.items() if id(now.get(key, _MISSING)) != ident]
            swapped += [f"{key} (set on the judge)" for key in now if key not in functions]
            if swapped:
                raise patched(f"the harness's own {swapped[0]} was replaced")
            if judge.config.to_dict() != config:
                raise patched("the judgement's config was changed")
        flags = _flags_snapshot()
        changed = {k: (self.flags[k], v) for k, v in flags.items() if self.flags[k] != v}
        if changed:
            raise Rejection(Status.DECEPTIVE, "global_flag_flip", f"global flags changed {when}: {changed}", "anti_gaming")
        if threading.active_count() > self.threads:
            raise Rejection(Status.DECEPTIVE, "spawned_thread", f"a Python thread was started {when}", "anti_gaming")
        routing = _dispatch_routing()
        rerouted = {k: (self.routing[k], v) for k, v in routing.items() if self.routing[k] != v}
        if rerouted:
            raise Rejection(Status.DECEPTIVE, "dispatcher_override",
                            f"what routes PyTorch's op calls changed {when}: {rerouted}", "anti_gaming")
        if thorough and self.model is not None and _parameter_fingerprint(self.model[0]) != self.model[2]:
            raise patched("the reference model's parameters were changed")
        overrides = self.dispatcher.overrides() if thorough else []
        if overrides:
            shown = "; ".join(overrides[:5]) + (f"; and {len(overrides) - 5} more" if len(overrides) > 5 else "")
            raise Rejection(Status.DECEPTIVE, "dispatcher_override",
                            f"PyTorch's operators were given other kernels {when}: {shown}", "anti_gaming")


# --- tensors ------------------------------------------------------------------------------------------------------
def _to_device(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _clone(values: list[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def _shares_memory(values: list[Any], others: list[Any]) -> bool:
    """Whether any tensor of `values` lives in the storage of any tensor of `others`."""
    storages = {o.untyped_storage().data_ptr() for o in others if isinstance(o, torch.Tensor)}
    return any(isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() in storages for v in values)


def _flatten_outputs(output: Any) -> list[Any]:
    if isinstance(output, (tuple, list)):
        return [leaf for item in output for leaf in _flatten_outputs(item)]
    return [output]


def _reject_mutated_inputs(before: list[Any], after: list[Any], when: str) -> None:
    for index, (original, given) in enumerate(zip(before, after)):
        if isinstance(original, torch.Tensor) and not _same_tensor_values(original, given):
            raise Rejection(Status.DECEPTIVE, "mutated_inputs", f"input {index} was modified in place {when}",
                            "anti_gaming")


def output_bytes(outputs: list[Any]) -> int:
    """Bytes of every tensor leaf of `outputs`."""
    return sum(leaf.numel() * leaf.element_size() for output in outputs for leaf in _flatten_outputs(output)
               if isinstance(leaf, torch.Tensor))


# Elements compared at a time: float64 temporaries of one chunk stay at 128 MB, whatever the output's size (a
# full-size KernelBench output is 4 GiB of fp32; whole-tensor float64 temporaries of it do not fit beside it).
COMPARE_CHUNK_ELEMENTS = 1 << 24
# Timed calls draw fresh inputs each call only when one draw takes less than this.
FRESH_DRAW_MAX_SECONDS = 0.02
# The warm-up ends when the median of the last WARMUP_WINDOW pairs' device time is within this share of the median
# of the WARMUP_WINDOW before (see warm_up).
WARMUP_WINDOW = 3
WARMUP_STEADY_TOLERANCE = 0.03
# Earlier reference outputs kept on the GPU for the stale-output check (the newest is always kept).
STALE_CHECK_BYTES = 2 * 2**30


def _same_tensor_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b) or (
        a.is_floating_point() and torch.equal(torch.nan_to_num(a, nan=0.5), torch.nan_to_num(b, nan=0.5))))


@dataclass
class Comparison:
    """Candidate vs reference outputs of one call."""

    max_abs_diff: float = 0.0
    mean_abs_diff: float = 0.0
    passes: dict[float, bool] = field(default_factory=dict)  # tolerance -> allclose over every output
    problem: tuple[str, str] | None = None  # (reason code, message) when the outputs cannot match at all
    unwritten_elements: int = 0  # NaN (our poison) where the reference is finite
    dtype_names: list[str] = field(default_factory=list)


def compare_outputs(reference: Any, candidate: Any, tolerances: tuple[float, ...],
                    chunk: int = COMPARE_CHUNK_ELEMENTS, *, stats: bool = True, quick: bool = True) -> Comparison:
    """Compare every output leaf; any structural problem (count, type, shape, dtype) fails every tolerance.
    `stats=False` decides `passes` alone, exactly as with stats (the same float64 allclose per chunk) but with
    one device sync per leaf and none of the statistics (max/mean difference, unwritten elements stay 0): the
    check made on every timed call, where a full-size output is compared dozens of times. There quick tests in
    the outputs' own precision vouch for leaves that pass by a margin (`_within_absolute`, then `_surely_close`);
    `quick=False` leaves every decision to the float64 comparison (the same answers, slower:
    benchmarks/compare_check.py)."""
    result = _compare_leaves(reference, candidate, tolerances, chunk, stats=stats, quick=quick)
    if result.problem is not None:
        result.passes = {tol: False for tol in tolerances}
    return result


def _flat_chunks(tensor: torch.Tensor, chunk: int, *, by_rows: bool = False):
    """Consecutive flat pieces of `tensor` (row-major order) of at most about `chunk` elements, without a
    whole-tensor copy: views of a contiguous tensor, else (or with `by_rows`) slices along the first dimension."""
    if tensor.dim() == 0:
        yield tensor.reshape(1)
        return
    if tensor.is_contiguous() and not by_rows:
        flat = tensor.view(-1)
        for start in range(0, flat.numel(), chunk):
            yield flat[start:start + chunk]
        return
    rows = max(1, chunk // max(1, tensor[0].numel()))
    for start in range(0, tensor.shape[0], rows):
        yield tensor[start:start + rows].reshape(-1)


def _paired_chunks(ref: torch.Tensor, cand: torch.Tensor, chunk: int):
    """The same pieces of two tensors of one shape: flat views where both are contiguous, else row slices of
    both (a transposed reference output against a contiguous candidate one must still line up)."""
    by_rows = not (ref.is_contiguous() and cand.is_contiguous())
    return zip(_flat_chunks(ref, chunk, by_rows=by_rows), _flat_chunks(cand, chunk, by_rows=by_rows))


# Relative margin of the quick pass test: far above the rounding of its float32 arithmetic (a few 2**-24), far below
# any tolerance, so an element it passes is one the float64 comparison passes too.
SURELY_CLOSE_MARGIN = 2.0**-20
_QUICK_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _surely_close(ref: torch.Tensor, cand: torch.Tensor, tol: float) -> torch.Tensor:
    """A 0-dim bool on the device: True only if every element passes torch.isclose(atol=rtol=tol) in float64.
    In the outputs' own precision (float32 for half types), in place: about a third of the float64 comparison's
    memory traffic. It errs only towards False (NaN, infinities, values within the margin of the tolerance, a
    float32 overflow), where the caller decides with the float64 comparison."""
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    r, c = ref.to(work), cand.to(work)  # neither is written to: each op below makes its own tensor first
    error = torch.sub(c, r).abs_()
    scale = tol * (1 - SURELY_CLOSE_MARGIN)
    # |r| capped at the largest finite value: an infinite reference allows no infinite error (inf <= inf holds);
    # with tol < 1 nothing else can overflow.
    allowed = r.abs().clamp_(max=torch.finfo(work).max).mul_(scale).add_(scale)
    return torch.le(error, allowed).all()


_ABSOLUTE_DTYPES = (torch.float32, torch.float64)
_VECTOR_NORM = torch.linalg.vector_norm  # taken at import, before any candidate code (RuntimeGuard guards it too)


def _within_absolute(ref: torch.Tensor, cand: torch.Tensor, tol: float) -> torch.Tensor:
    """A 0-dim bool on the device: True only if every element of a float32/float64 pair differs by at most
    tol (less the margin), which passes torch.isclose(atol=rtol=tol) in float64 whatever |ref| is (the allowed error
    is tol * (1 + |ref|) >= tol). Two passes (the difference, its largest magnitude), a quarter of `_surely_close`'s
    memory traffic: the first test on every timed call. The difference in the outputs' own precision is off by at
    most 2**-24 of itself for float32, far inside the margin. NaN or an infinity anywhere gives False."""
    if ref.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=ref.device)
    largest = _VECTOR_NORM(torch.sub(cand, ref), float("inf"))
    return torch.le(largest, tol * (1 - SURELY_CLOSE_MARGIN))


def _tensor_passes(ref: torch.Tensor, cand: torch.Tensor, tolerances: tuple[float, ...], result: Comparison,
                   chunk: int, quick: bool = True) -> None:
    """`result.passes` for one output leaf: torch.allclose in float64 chunk by chunk, folded on the device. Quick
    tests in the outputs' own precision come first (one sync each): every difference within tol (float32/64), else
    every element within tol of its own reference value; only where neither can vouch for every element does the
    float64 comparison decide (so the answer is always the float64 one)."""
    def every_chunk(test: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
        folded: torch.Tensor | None = None
        for ref_chunk, cand_chunk in _paired_chunks(ref, cand, chunk):
            close = test(ref_chunk, cand_chunk)
            folded = close if folded is None else folded & close
        return True if folded is None else bool(folded)

    quick_tests = [test for dtypes, test in ((_ABSOLUTE_DTYPES, _within_absolute), (_QUICK_DTYPES, _surely_close))
                   if quick and ref.dtype in dtypes]
    for tol in tolerances:
        if not result.passes[tol]:
            continue
        if 0 < tol < 1 and any(every_chunk(functools.partial(test, tol=tol)) for test in quick_tests):
            continue
        result.passes[tol] = every_chunk(
            lambda r, c: torch.isclose(c.double(), r.double(), atol=tol, rtol=tol, equal_nan=True).all())  # noqa: B023


def _compare_tensor(ref: torch.Tensor, cand: torch.Tensor, tolerances: tuple[float, ...], result: Comparison,
                    chunk: int) -> tuple[float, int]:
    """Fold one output leaf into `result` chunk by chunk (max diff, unwritten count, allclose per tolerance);
    returns (sum of finite absolute differences, element count) for the mean."""
    total_abs, total_count = 0.0, 0
    for ref_chunk, cand_chunk in _paired_chunks(ref, cand, chunk):
        ref_f, cand_f = ref_chunk.double(), cand_chunk.double()
        result.unwritten_elements += int((torch.isnan(cand_f) & torch.isfinite(ref_f)).sum())
        diff = (ref_f - cand_f).abs().nan_to_num(nan=math.inf)
        diff = torch.where(torch.isnan(ref_f) & torch.isnan(cand_f), torch.zeros_like(diff), diff)
        if diff.numel():
            result.max_abs_diff = max(result.max_abs_diff, float(diff.max()))
            finite = torch.isfinite(diff)
            total_abs += float(torch.where(finite, diff, torch.zeros_like(diff)).sum())
            total_count += diff.numel()
        for tol in tolerances:
            if result.passes[tol]:
                result.passes[tol] = bool(torch.allclose(cand_f, ref_f, atol=tol, rtol=tol, equal_nan=True))
        del ref_f, cand_f, diff
    return total_abs, total_count


def _compare_leaves(reference: Any, candidate: Any, tolerances: tuple[float, ...],
                    chunk: int = COMPARE_CHUNK_ELEMENTS, *, stats: bool = True, quick: bool = True) -> Comparison:
    ref_leaves, cand_leaves = _flatten_outputs(reference), _flatten_outputs(candidate)
    result = Comparison(passes={tol: True for tol in tolerances})
    if len(ref_leaves) != len(cand_leaves):
        result.problem = ("output_structure_mismatch", f"{len(cand_leaves)} outputs, reference has {len(ref_leaves)}")
        return result
    total_abs, total_count = 0.0, 0
    for ref, cand in zip(ref_leaves, cand_leaves):
        if not isinstance(ref, torch.Tensor):
            if ref != cand:
                result.problem = ("output_value_mismatch", f"non-tensor output {cand!r} != {ref!r}")
            continue
        if type(cand) is not torch.Tensor:
            result.problem = ("output_not_plain_tensor", f"output is {type(cand).__name__}, not torch.Tensor")
            return result
        if cand.shape != ref.shape:
            result.problem = ("shape_mismatch", f"output shape {tuple(cand.shape)} != reference {tuple(ref.shape)}")
            return result
        if cand.dtype != ref.dtype:
            result.problem = ("dtype_mismatch", f"output dtype {cand.dtype} != reference {ref.dtype}")
            return result
        if cand.device != ref.device:
            result.problem = ("device_mismatch", f"output on {cand.device}, reference on {ref.device}")
            return result
        result.dtype_names.append(str(ref.dtype).replace("torch.", ""))
        if not stats:
            _tensor_passes(ref, cand, tolerances, result, chunk, quick)
            continue
        leaf_abs, leaf_count = _compare_tensor(ref, cand, tolerances, result, chunk)
        total_abs += leaf_abs
        total_count += leaf_count
    result.mean_abs_diff = total_abs / total_count if total_count else 0.0
    return result


def consistency_tolerance(dtype_name: str, policy_tolerance: float, ratio: float) -> float:
    """atol=rtol two runs of the candidate on identical inputs must agree to: far tighter than the correctness
    tolerance, but never below a few units of the dtype's precision (atomics change the order of a sum)."""
    eps = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-52}.get(dtype_name, 2.0**-23)
    return max(policy_tolerance * ratio, 4 * eps)


def fresh_inputs_on_device(get_inputs: Callable[[], list[Any]], like: list[Any], device: torch.device,
                           seed: int) -> list[Any] | None:
    """A new draw of the task's inputs made directly on `device` (tensor factories default to it inside
    `get_inputs`), so every timed call can see never-seen values at GPU speed. None when the task's `get_inputs`
    cannot run that way or gives tensors of other shapes, dtypes or devices than `like`."""
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            values = list(get_inputs())
    except Exception:  # noqa: BLE001 - e.g. numpy inside get_inputs: the caller falls back to stored input sets
        return None
    if len(values) != len(like):
        return None
    for value, reference in zip(values, like):
        if isinstance(reference, torch.Tensor) != isinstance(value, torch.Tensor):
            return None
        if isinstance(reference, torch.Tensor) and (value.shape != reference.shape or value.dtype != reference.dtype
                                                    or value.device != reference.device):
            return None
    return values


def _constant_outputs_pass(reference: Any, constants: list[float], tol: float,
                           chunk: int = COMPARE_CHUNK_ELEMENTS) -> tuple[bool, bool]:
    """Would all-zeros pass this output? Would a fixed value per output leaf pass it? (degenerate-task detection)

    `constants` are one value per floating-point leaf, taken from the first trial (its mean) and reused for every
    later trial: a task is degenerate when one input-independent answer passes all trials, not merely when each
    output is constant within a trial (a scalar output always is). Chunked, like the comparison."""
    zeros_pass = constant_pass = True
    leaves = [ref for ref in _flatten_outputs(reference)
              if isinstance(ref, torch.Tensor) and ref.is_floating_point() and ref.numel() > 0]
    if not constants:
        for ref in leaves:
            total = sum(float(piece.double().sum()) for piece in _flat_chunks(ref, chunk))
            constants.append(total / ref.numel())
    for ref, constant in zip(leaves, constants):
        for piece in _flat_chunks(ref, chunk):
            ref_f = piece.double()
            zeros_pass = zeros_pass and bool(torch.allclose(torch.zeros_like(ref_f), ref_f, atol=tol, rtol=tol))
            constant_pass = constant_pass and bool(
                torch.allclose(torch.full_like(ref_f, constant), ref_f, atol=tol, rtol=tol))
            if not (zeros_pass or constant_pass):
                return False, False
    return zeros_pass, constant_pass


def timing_stats(samples_ms: list[float]) -> TimingStats:
    ordered = sorted(samples_ms)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    mean = statistics.fmean(ordered)
    std = statistics.pstdev(ordered) if len(ordered) > 1 else 0.0
    return TimingStats(median_ms=statistics.median(ordered), iqr_ms=quartiles[2] - quartiles[0], mean_ms=mean,
                       n=len(ordered), cv=std / mean if mean > 0 else 0.0)


def warm_up(pair: Callable[[], float], min_seconds: float, max_seconds: float, clock: Callable[[], float],
            window: int = WARMUP_WINDOW, tolerance: float = WARMUP_STEADY_TOLERANCE) -> tuple[int, bool]:
    """Run `pair` (one untimed reference/candidate pair; returns its device time in ms) until the device is warm:
    at least min_seconds and 2 x `window` pairs, and the median of the last `window` pairs within `tolerance` of
    the median of the `window` before (clocks climbing from idle shorten every window until they stop); at most
    max_seconds (and never fewer than 3 pairs). A device kept busy by other work before the timed section is
    steady at once; one that sat idle warms for as long as its times keep falling. Returns (pairs, steady)."""
    times: list[float] = []
    started = clock()
    while True:
        times.append(pair())
        elapsed = clock() - started
        if len(times) >= 2 * window and elapsed >= min_seconds:
            last, before = statistics.median(times[-window:]), statistics.median(times[-2 * window:-window])
            if abs(last - before) <= tolerance * before:
                return len(times), True
        if len(times) >= 3 and elapsed >= max_seconds:
            return len(times), False


def median_interval(values: list[float], z: float = 1.96) -> tuple[float, float]:
    """Distribution-free ~95% confidence interval of the median: the order statistics n/2 -/+ z*sqrt(n)/2."""
    ordered = sorted(values)
    n = len(ordered)
    half_width = z * math.sqrt(n) / 2
    low, high = max(0, math.floor(n / 2 - half_width)), min(n - 1, math.ceil(n / 2 + half_width) - 1)
    return ordered[low], ordered[high]


# --- the judgement --------------------------------------------------------------------------------------------------
@dataclass
class Judgement:
    """Accumulates the verdict fields as the stages run (becomes `Verdict.to_dict()` material)."""

    status: Status = Status.CORRECT
    reasons: list[Reason] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)

    def flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)


class CandidateFailed(Exception):
    """Candidate code raised while the harness timed it (the original is the cause)."""


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA out-of-memory error, raised by torch's allocator or reported by a CUDA call."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


_LIBRARY_GEMM = re.compile(r"gemm|xmma|cutlass|cublas|nvjet|wgmma|matmul|gemv|dot_kernel", re.IGNORECASE)
_LIBRARY_CONV = re.compile(r"conv|cudnn|winograd|implicit_?gemm|fft", re.IGNORECASE)
_ELEMENTWISE_LAUNCHER = re.compile(r"(?:vectorized_|unrolled_)?elementwise_kernel(?:_with_index)?<")


def _first_functor(template_args: str) -> str:
    """The first template argument that is not a number, from `<4, Functor<float>, Loader>`'s inside."""
    depth, current, args = 0, "", []
    for char in template_args:
        if char == "<":
            depth += 1
        elif char == ">":
            if depth == 0:
                break
            depth -= 1
        if char == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += char
    args.append(current.strip())
    return next((arg for arg in args if arg and not arg.isdigit()), "")


def kernel_family(name: str) -> str:
    """What a profiler kernel computes, independent of the launch details that vary between calls: "gemm" and
    "conv" for library kernels (cuBLAS/cuDNN pick per shape and layout), else the name without its argument list
    and without ATen's elementwise launcher variant (vectorized / unrolled)."""
    head = name.split("(")[0].removeprefix("void ").strip()
    if _LIBRARY_CONV.search(head):
        return "conv"
    if _LIBRARY_GEMM.search(head):
        return "gemm"
    launcher = _ELEMENTWISE_LAUNCHER.search(head)
    if launcher:  # ATen's elementwise kernels: the functor is the op; the launcher variant depends on alignment
        return f"elementwise<{_first_functor(head[launcher.end():])}>"
    return head


def baseline_kernel_finding(custom_us: float, total_us: float, custom_ran: bool, candidate_other_families: set[str],
                            reference_families: set[str], max_share: float) -> str | None:
    """Why the candidate is a baseline kernel, or None: its own kernels ran, did less than `max_share` of its GPU
    time, and the kernels it ran besides them (PyTorch / library compute; memcpy and memset are not counted)
    include every kind of kernel the reference runs: the reference's whole computation is redone by PyTorch and
    the custom kernel replaces none of it (`torch.matmul` plus a copy kernel). A cuBLAS GEMM with a custom fused
    epilogue is not one: the reference's bias/activation kernels are missing from its PyTorch work."""
    if not custom_ran or total_us <= 0 or not reference_families:
        return None
    share = custom_us / total_us
    if share >= max_share or not reference_families <= candidate_other_families:
        return None
    return (f"every kind of kernel the reference runs ({', '.join(sorted(reference_families))[:200]}) also ran "
            f"outside the candidate's own kernels, which did {share:.1%} of its GPU time ({custom_us:.0f} of "
            f"{total_us:.0f} us): the work is PyTorch's, not the candidate's CUDA")


class CandidateJudge:
    """Judges `candidate.ModelNew` against `reference.Model` on the current CUDA device.

    `control=True` judges the reference against itself (the candidate module's ModelNew is the reference's Model):
    the trusted control that measures a task's reference through the correctness and timing path, with no
    profiler pass (it has no custom kernels)."""

    def __init__(self, reference: ModuleType, candidate: ModuleType | None, config: VerifyConfig, guard: RuntimeGuard,
                 custom_kernel_names: list[str], *, control: bool = False, device: torch.device | None = None,
                 gpu_share: GpuShareClient | None = None):
        self.reference = reference
        self.candidate = candidate
        self.config = config
        self.guard = guard
        self.custom_kernel_names = tuple(custom_kernel_names)  # a tuple: the guard watches the object (watch_judge)
        self.control = control
        # A CPU device runs the correctness path only (the harness's own tests); judgements run on CUDA.
        self.device = device or torch.device("cuda", torch.cuda.current_device())
        self.judgement = Judgement()
        self.tolerances = (TOLERANCE_LOOSE, TOLERANCE_STRICT)
        self.policy_tolerance = TOLERANCE_LOOSE
        self.draw_on_gpu = False
        self.probe: Any = None
        self.prepared = False
        # GPU bytes one reference call needs beyond its inputs and its output (its clone of the inputs and its
        # temporaries), measured on the probe call: part of the judgement's expected peak (worker.needs_whole_gpu).
        self.reference_workspace_bytes = 0
        self._peak_floor_bytes = 0  # the allocator's peak before the probe's measurement reset it
        # Harness-owned references, taken before candidate code could patch the modules they live in.
        self._synchronize = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        self._event = torch.cuda.Event
        self._perf_counter = time.perf_counter
        # Other judging lanes on this GPU (VerifyConfig.gpu_lanes): timed sections ask for it alone.
        self.gpu_share = gpu_share or GpuShareClient(None)
        self.phase_seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Wall seconds of one stage of the judgement, kept in provenance["phase_seconds"] (where the time goes).
        Phases never nest, so their seconds add up to the judgement's time without counting any span twice."""
        started = self._perf_counter()
        try:
            yield
        finally:
            self.phase_seconds[name] = round(self.phase_seconds.get(name, 0.0) + self._perf_counter() - started, 4)

    @contextlib.contextmanager
    def alone(self, name: str, *, last_gpu_use: bool = False) -> Iterator[None]:
        """The body with the GPU to this worker alone (a timed section): its wall seconds are phase `name`, the wait
        for the GPU before it is phase `gpu_wait_for_<name>` (kept apart: with several lanes that wait is the other
        lanes' timed work, not this judgement's). `last_gpu_use`: the judgement's GPU work ends with the body, so
        the GPU is given up after it (GpuShareClient.exclusive)."""
        with contextlib.ExitStack() as stack:
            with self.phase(f"gpu_wait_for_{name}"):
                stack.enter_context(self.gpu_share.exclusive(then_release=last_gpu_use))
            with self.phase(name):
                yield

    # -- inputs ---------------------------------------------------------------------------------------------------
    def _inputs(self, seed: int) -> list[Any]:
        torch.manual_seed(seed)
        if self.draw_on_gpu:
            with torch.device(self.device):
                return [_to_device(x, self.device) for x in self.reference.get_inputs()]
        return [_to_device(x, self.device) for x in self.reference.get_inputs()]

    def _choose_input_draw(self) -> None:
        """Draw inputs on the host (the task's own get_inputs(), like KernelBench), or on the GPU when a host draw
        is slow or large. Both models always see the same values; the verdict states which way they were drawn."""
        cfg, provenance = self.config, self.judgement.fields.setdefault("provenance", {})
        get_inputs = self.reference.get_inputs
        planned_bytes = None
        try:  # shapes without allocating: a meta-device dry run (fails for get_inputs that read values)
            torch.manual_seed(cfg.seed)
            with torch.device("meta"):
                planned = list(get_inputs())
            planned_bytes = sum(x.numel() * x.element_size() for x in planned if isinstance(x, torch.Tensor))
        except Exception:  # noqa: BLE001 - the host draw below tells instead
            planned = None
        why = None
        if planned_bytes is not None and planned_bytes > cfg.gpu_draw_bytes:
            why = f"inputs of {planned_bytes / 2**20:.0f} MB"
        else:
            started = self._perf_counter()
            torch.manual_seed(cfg.seed)
            planned = list(get_inputs())
            host_draw_s = self._perf_counter() - started
            if host_draw_s > cfg.slow_draw_seconds:
                why = f"one host draw took {host_draw_s:.2f} s"
        provenance["input_bytes"] = planned_bytes
        if why is not None and planned is not None:
            self._synchronize()
            started = self._perf_counter()
            torch.manual_seed(cfg.seed)
            try:
                with torch.device(self.device):
                    drawn = list(get_inputs())
                self._synchronize()
                usable = len(drawn) == len(planned) and all(
                    isinstance(a, torch.Tensor) == isinstance(b, torch.Tensor)
                    and (not isinstance(a, torch.Tensor) or (a.shape == b.shape and a.dtype == b.dtype))
                    for a, b in zip(drawn, planned))
            except Exception:  # noqa: BLE001 - e.g. numpy inside get_inputs: stay on the host
                usable = False
            gpu_draw_s = self._perf_counter() - started
            del planned
            if usable:
                self.draw_on_gpu = True
                provenance["input_draw"] = (f"get_inputs() under a CUDA device context, seeded ({why}; one GPU draw "
                                            f"{gpu_draw_s:.3f} s)")
                return
            provenance["input_draw"] = f"get_inputs() on the host ({why}; it cannot draw on the GPU)"
        else:
            provenance["input_draw"] = "get_inputs() on the host"

    # -- calls ----------------------------------------------------------------------------------------------------
    def prepare_reference(self) -> tuple[float, float]:
        """Trusted set-up before any candidate code runs: the input draw, the reference model, and one probe call.
        Returns (seconds of one input draw, seconds of one reference call), from which the run's limit is sized."""
        cfg = self.config
        try:
            self._choose_input_draw()
            init_inputs = [_to_device(x, self.device) for x in self.reference.get_init_inputs()]
            self.init_inputs = init_inputs
            torch.manual_seed(cfg.seed)
            self.ref_model = self.reference.Model(*init_inputs).to(self.device)
            self.guard.watch_reference(self.reference, self.ref_model)
            self.guard.watch_judge(self, fields=("ref_model",))  # built anew after release_prepared()
        except Rejection:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken reference is reported, not raised
            if is_out_of_memory(exc):
                raise self._infrastructure("reference_out_of_memory", f"the reference's set-up ran out of memory: "
                                           f"{exc}"[:1000]) from exc
            raise Rejection(Status.RUNTIME_ERROR, "reference_failed", f"reference Model(): {exc!r}"[:2000],
                            "correctness") from exc
        self._synchronize()
        started = self._perf_counter()
        inputs = self._inputs(cfg.seed - 1)  # the probe's draw, made the chosen way, sizes the limit too
        self._synchronize()
        draw_s = self._perf_counter() - started
        measure = self.device.type == "cuda"
        if measure:
            self._peak_floor_bytes = max(self._peak_floor_bytes, torch.cuda.max_memory_allocated(self.device))
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self.probe = self._call_reference(inputs, cfg.seed - 1)
        if measure:
            self.reference_workspace_bytes = max(
                0, torch.cuda.max_memory_allocated(self.device) - before - output_bytes([self.probe]))
            self.judgement.fields.setdefault("provenance", {})["reference_workspace_bytes"] = \
                self.reference_workspace_bytes
        started = self._perf_counter()
        again = self._call_reference(inputs, cfg.seed - 1)
        call_s = self._perf_counter() - started
        del inputs, again
        self.prepared = True
        return draw_s, call_s

    def release_prepared(self) -> None:
        """Give back the GPU memory the trusted set-up holds (the reference model, the probe's output, the caching
        allocator's blocks), before this judgement waits for the GPU's memory whole (worker.py).
        prepare_reference() again afterwards draws the same inputs: every draw is seeded."""
        self.ref_model = self.probe = self.init_inputs = None
        self.prepared = self.draw_on_gpu = False
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _build_candidate(self) -> None:
        if self.control:
            self.cand_model = self.ref_model
            return
        try:
            torch.manual_seed(self.config.seed)
            self.cand_model = self.candidate.ModelNew(*self.init_inputs).to(self.device)
        except Exception as exc:  # noqa: BLE001
            if is_out_of_memory(exc):
                raise self._candidate_out_of_memory(exc, "construction")
            raise Rejection(Status.RUNTIME_ERROR, "construct_failed", f"ModelNew(): {exc!r}"[:2000],
                            "correctness") from exc
        self.guard.check("while building ModelNew")

    def _infrastructure(self, code: str, message: str) -> Rejection:
        """A failure of the verifier itself: judged again once with less resident state (see api.py)."""
        rejection = Rejection(Status.INFRASTRUCTURE_ERROR, code, message, "infrastructure")
        rejection.retry_low_memory = not self.config.low_memory
        return rejection

    def _candidate_out_of_memory(self, exc: BaseException, stage: str) -> Rejection:
        """The candidate's own allocation failed. On the first attempt the verifier held full resident state, so
        it is judged once more with less of it; if it fails again there, it is the candidate's runtime error."""
        rejection = Rejection(Status.RUNTIME_ERROR, "candidate_out_of_memory",
                              f"ModelNew ran out of GPU memory ({stage}): {exc}"[:2000], stage)
        rejection.retry_low_memory = not self.config.low_memory
        return rejection

    def _call_reference(self, inputs: list[Any], seed: int) -> Any:
        torch.manual_seed(seed)  # same RNG stream for both models (dropout and friends)
        try:
            with torch.no_grad():
                out = self.ref_model(*_clone(inputs))
            self._synchronize()
        except Exception as exc:  # noqa: BLE001
            if is_out_of_memory(exc):
                raise self._infrastructure("reference_out_of_memory",
                                           f"the reference ran out of GPU memory beside the verifier's state: {exc}"[:1000]) from exc
            raise Rejection(Status.RUNTIME_ERROR, "reference_failed", f"reference forward: {exc!r}"[:2000],
                            "correctness") from exc
        return out

    def _call_candidate(self, inputs: list[Any], seed: int, stage: str) -> Any:
        given = _clone(inputs)
        torch.manual_seed(seed)
        try:
            with torch.no_grad():
                out = self.cand_model(*given)
            self._synchronize()
        except Exception as exc:  # noqa: BLE001 - any failure of candidate code is its runtime error
            if is_out_of_memory(exc):
                raise self._candidate_out_of_memory(exc, stage) from exc
            raise Rejection(Status.RUNTIME_ERROR, "candidate_raised", f"{type(exc).__name__}: {exc}"[:2000], stage) from exc
        _reject_mutated_inputs(inputs, given, f"during a {stage} call")
        self.guard.check(f"during a ModelNew call ({stage})")
        return out

    def _poison_allocator(self, template: Any) -> None:
        """Hand the caching allocator NaN-filled blocks of every output's size, so an output that the candidate
        allocates and never writes reads back as NaN instead of a stale (possibly correct) result."""
        copies = 1 if self.config.low_memory else 2
        blocks = []
        for leaf in _flatten_outputs(template):
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                for _ in range(copies):
                    blocks.append(torch.full_like(leaf, float("nan")))
            elif isinstance(leaf, torch.Tensor) and not leaf.is_complex():
                fill = True if leaf.dtype == torch.bool else torch.iinfo(leaf.dtype).max
                for _ in range(copies):
                    blocks.append(torch.full_like(leaf, fill))
        self._synchronize()
        del blocks

    # -- stages ---------------------------------------------------------------------------------------------------
    def run_correctness(self) -> None:
        cfg, j = self.config, self.judgement
        comparisons: list[Comparison] = []
        passed = {tol: 0 for tol in self.tolerances}
        decided = 0
        zeros_everywhere = constant_everywhere = True
        constants: list[float] = []  # the first trial's output means: the fixed answer tried on every trial
        earlier_refs: list[Any] = []  # reference outputs of earlier trials (memory-bounded), for _reject_stale_output
        stale_bytes = 0 if cfg.low_memory else STALE_CHECK_BYTES
        worst_consistency: tuple[float, float] | None = None  # (max abs diff between two runs, tolerance)
        for trial in range(cfg.correctness_trials):
            seed = cfg.seed + trial
            inputs = self._inputs(seed)
            self._poison_allocator(earlier_refs[-1] if earlier_refs else self.probe)
            cand_before = self._call_candidate(inputs, seed, "correctness")
            ref_out = self._call_reference(inputs, seed)
            if trial == 0:
                again = self._call_reference(inputs, seed)
                if not compare_outputs(ref_out, again, (TOLERANCE_STRICT,), stats=False).passes[TOLERANCE_STRICT]:
                    j.flag("nondeterministic_reference")
                del again
            self._poison_allocator(ref_out)
            cand_after = self._call_candidate(inputs, seed, "correctness")
            del inputs
            zeros_pass, constant_pass = _constant_outputs_pass(ref_out, constants, TOLERANCE_LOOSE)
            zeros_everywhere &= zeros_pass
            constant_everywhere &= constant_pass
            trial_cmp = [compare_outputs(ref_out, c, self.tolerances) for c in (cand_before, cand_after)]
            comparisons.extend(trial_cmp)
            for tol in self.tolerances:
                passed[tol] += all(c.passes[tol] for c in trial_cmp)
            policy_tol = min(cfg.tolerance_for(d) for d in (trial_cmp[0].dtype_names or ["float32"]))
            for output, comparison in zip((cand_before, cand_after), trial_cmp):
                if not comparison.passes[policy_tol]:
                    self._reject_stale_output(output, ref_out, earlier_refs, trial)
            if all(c.problem is None for c in trial_cmp) and "nondeterministic_reference" not in j.flags:
                # The same inputs twice (before and after the reference ran): a race shows up as disagreement.
                tight = min(consistency_tolerance(d, policy_tol, cfg.consistency_tolerance_ratio)
                            for d in (trial_cmp[0].dtype_names or ["float32"]))
                consistency = compare_outputs(cand_before, cand_after, (tight,), stats=False)
                if not consistency.passes[tight]:  # once more with statistics, for the verdict's numbers
                    consistency = compare_outputs(cand_before, cand_after, (tight,))
                if not consistency.passes[tight] and (worst_consistency is None
                                                      or consistency.max_abs_diff > worst_consistency[0]):
                    worst_consistency = (consistency.max_abs_diff, tight)
            del cand_before, cand_after
            earlier_refs.append(ref_out)
            while len(earlier_refs) > 1 and output_bytes(earlier_refs) > stale_bytes:
                earlier_refs.pop(0)
            decided += all(c.passes[policy_tol] for c in trial_cmp)
            self.policy_tolerance = policy_tol
        del earlier_refs
        worst = next((c for c in comparisons if c.problem), None) or max(comparisons, key=lambda c: c.max_abs_diff)
        j.fields.update(max_abs_diff=worst.max_abs_diff, mean_abs_diff=worst.mean_abs_diff,
                        correct_at_1e2=passed[TOLERANCE_LOOSE] == cfg.correctness_trials,
                        correct_at_1e4=passed[TOLERANCE_STRICT] == cfg.correctness_trials,
                        trials_passed=decided, trials_run=cfg.correctness_trials)
        if zeros_everywhere or constant_everywhere:
            j.flag("degenerate_task")
        if worst.problem is not None:
            raise Rejection(Status.INCORRECT, worst.problem[0], worst.problem[1], "correctness")
        if decided < cfg.correctness_trials:
            if worst.unwritten_elements:
                raise Rejection(Status.INCORRECT, "output_not_fully_written",
                                f"{worst.unwritten_elements} output elements kept the allocator poison (never written)",
                                "correctness")
            raise Rejection(Status.INCORRECT, "output_mismatch",
                            f"{decided}/{cfg.correctness_trials} trials within atol=rtol={self.policy_tolerance:g}; "
                            f"max abs diff {worst.max_abs_diff:.3e}", "correctness")
        if worst_consistency is not None:
            raise Rejection(Status.INCORRECT, "nondeterministic_output",
                            f"two runs of ModelNew on the same inputs differ by up to {worst_consistency[0]:.3e} "
                            f"(allowed {worst_consistency[1]:.1e}, far inside the correctness tolerance "
                            f"{self.policy_tolerance:g}): a race between threads, not rounding", "correctness")

    @staticmethod
    def _reject_stale_output(output: Any, ref_out: Any, earlier_refs: list[Any], trial: int) -> None:
        """A wrong output that equals the reference's result for an earlier trial's inputs is a memoised result
        (a cache keyed by data pointer, shape or call count that the new inputs hit): deceptive, not a bug."""
        for index, earlier in enumerate(earlier_refs):
            if compare_outputs(earlier, ref_out, (TOLERANCE_LOOSE,), stats=False).passes[TOLERANCE_LOOSE]:
                continue  # the task's result barely depends on its inputs: no evidence either way
            if compare_outputs(earlier, output, (TOLERANCE_STRICT,), stats=False).passes[TOLERANCE_STRICT]:
                raise Rejection(Status.DECEPTIVE, "stale_output_reuse",
                                f"correctness trial {trial} returned the result for the inputs of an earlier call "
                                f"({len(earlier_refs) - index} trial(s) back): a cache not keyed by the input values",
                                "anti_gaming")

    def _profile_kernels(self, model: Any, inputs: list[Any], seed: int) -> list[Any]:
        """GPU kernel events of one call of `model` (memcpy and memset left out). Only the forward call is inside
        the profiler window: the harness's own checks (input comparison, guard) run after it."""
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        given = _clone(inputs)
        torch.manual_seed(seed)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with torch.no_grad():
                model(*given)
            self._synchronize()
        return [e for e in prof.events() if e.device_type == DeviceType.CUDA
                and not e.name.startswith(("Memcpy", "Memset"))]

    def run_profiler_check(self) -> None:
        seed = self.config.seed + 500
        inputs = self._inputs(seed)
        self._call_candidate(inputs, seed, "profiler")  # checked call first: a failure here is the candidate's
        try:
            try:
                events = self._profile_kernels(self.cand_model, inputs, seed)
            except Exception as exc:
                if is_out_of_memory(exc):
                    raise CandidateFailed(f"{type(exc).__name__}: {exc}") from exc
                raise
            reference_events = self._profile_kernels(self.ref_model, inputs, seed)
        except CandidateFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - profiler/CUPTI unavailable is recorded, not fatal
            if isinstance(exc, Rejection):
                raise
            self.judgement.flag("profiler_unavailable")
            self.judgement.reasons.append(Reason("profiler_unavailable", repr(exc)[:500], "anti_gaming"))
            return
        # The profiled call was not checked inside the window: check what it may have done now.
        self.guard.check("during a ModelNew call (profiler)")
        del inputs
        total_us = sum(e.time_range.elapsed_us() for e in events)
        custom = [e for e in events if kernel_is_named(e.name, self.custom_kernel_names)]
        custom_us = sum(e.time_range.elapsed_us() for e in custom)
        provenance = self.judgement.fields.setdefault("provenance", {})
        self.judgement.fields["custom_kernel_time_share"] = custom_us / total_us if total_us > 0 else 0.0
        provenance["kernels_seen"] = sorted({e.name[:120] for e in events})[:20]
        generated = generated_kernel_names((e.name for e in events), self.custom_kernel_names)
        if generated:
            provenance["generated_kernels"] = generated[:20]
            reason = generated_kernels_reason(generated)
            raise Rejection(Status.DECEPTIVE, reason.code, reason.message, reason.stage)
        if not custom:
            raise Rejection(Status.DECEPTIVE, "no_custom_kernel_ran",
                            f"none of the candidate's kernels ({', '.join(self.custom_kernel_names) or 'none found'}) "
                            f"ran; GPU kernels seen: {sorted({e.name[:60] for e in events})[:5]}", "anti_gaming")
        if self.judgement.fields["custom_kernel_time_share"] < self.config.minor_custom_share:
            self.judgement.flag("minor_custom_kernel_share")
        other_families = {kernel_family(e.name) for e in events if not kernel_is_named(e.name, self.custom_kernel_names)}
        reference_families = {kernel_family(e.name) for e in reference_events}
        provenance["reference_kernel_families"] = sorted(reference_families)[:20]
        finding = baseline_kernel_finding(custom_us, total_us, bool(custom), other_families, reference_families,
                                          self.config.baseline_kernel_share)
        if finding is not None:
            if self.config.baseline_kernel_policy == "reject":
                raise Rejection(Status.DECEPTIVE, "baseline_kernel", finding, "anti_gaming")
            self.judgement.flag("baseline_kernel")
            provenance["baseline_kernel"] = finding

    def _timed_gpu(self, fn: Callable[[], Any], flush: torch.Tensor, start: Any, end: Any) -> tuple[Any, float]:
        """GPU-time convention (KernelBench, triton do_bench): the flush and the call are enqueued back to back, so
        the GPU is busy flushing while the host launches and the events bracket GPU work, not launch latency."""
        flush.zero_()
        start.record()
        out = fn()
        end.record()
        self._synchronize()
        return out, start.elapsed_time(end)

    def _timed_host(self, fn: Callable[[], Any], flush: torch.Tensor, start: Any, end: Any) -> tuple[Any, float, float]:
        """Host-inclusive convention: the device is idle when the start event is recorded, so the interval also
        holds the host's launch latency of forward; plus wall clock to a device-wide sync (side-stream check)."""
        flush.zero_()
        self._synchronize()
        wall_start = self._perf_counter()
        start.record()
        out = fn()
        end.record()
        self._synchronize()  # device-wide: work left on any stream is waited for before the wall clock stops
        wall_ms = (self._perf_counter() - wall_start) * 1e3
        return out, start.elapsed_time(end), wall_ms

    def _launch_floors_ms(self, flush: torch.Tensor, start: Any, end: Any) -> dict[str, float]:
        """Median time of a one-element kernel in each convention: the floor under which times are overhead."""
        scalar = torch.zeros(1, device=self.device)
        gpu = [self._timed_gpu(lambda: scalar.add_(1), flush, start, end)[1] for _ in range(30)]
        host = [self._timed_host(lambda: scalar.add_(1), flush, start, end)[1] for _ in range(30)]
        return {"gpu": statistics.median(gpu), "host": statistics.median(host)}

    def run_timing(self, *, last_gpu_use: bool = False) -> None:
        """Interleaved reference/candidate pairs (order alternating, L2 flushed before each call) on fresh inputs,
        each pair timed in both conventions; a speedup is the median of its convention's per-pair ratios, so slow
        drifts (clocks, temperature) cancel. Samples come in rounds with freshly allocated input buffers until the
        configured convention's median is known to cfg.timing_target_precision (or the budget is spent).

        The set-up (the flush buffer, the input buffers' host draw, the device RNG's first draw) is untimed work, so
        it runs beside other lanes' untimed work (phase timing_setup); the rest has the GPU alone (phase timing)."""
        with self.phase("timing_setup"):
            setup = self._timing_setup()
        with self.alone("timing", last_gpu_use=last_gpu_use):
            self._run_timed_pairs(*setup)
        # Outside the section that has the GPU alone: the read is 0.06 s of CPU work the other lanes' timed
        # sections would wait for. Kernels the candidate gave PyTorch's operators at any point still hold now.
        self.guard.check("during the correctness trials and timing", thorough=True)

    def _timing_setup(self) -> tuple[torch.Tensor, list[Any], bool]:
        """(L2 flush buffer, input buffers, whether get_inputs() can draw on the device): the first device draw
        also warms up the device RNG."""
        cfg = self.config
        flush = torch.empty(cfg.l2_flush_mb * 2**20 // 4, dtype=torch.int32, device=self.device)
        buffers = self._inputs(cfg.seed + 1000)
        drawable = self._device_draw(buffers, -2) is not None
        self._synchronize()
        return flush, buffers, drawable

    def _device_draw(self, like: list[Any], sample: int) -> list[Any] | None:
        """The timing's fresh get_inputs() draw for `sample`, made on the device (fresh_inputs_on_device)."""
        return fresh_inputs_on_device(self.reference.get_inputs, like, self.device, self.config.seed + 2000 + sample)

    def _run_timed_pairs(self, flush: torch.Tensor, buffers: list[Any], drawable: bool) -> None:
        cfg, j = self.config, self.judgement
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        generator = torch.Generator(device=self.device).manual_seed(cfg.seed)

        def draw(sample: int) -> list[Any] | None:
            return self._device_draw(buffers, sample)

        # Per-call draws only where they are cheap (a get_inputs() doing real work on the host would slow every
        # sample down), measured with the GPU alone.
        draws_on_device = False
        if drawable:
            draw_started = self._perf_counter()
            draws_on_device = draw(-1) is not None
            self._synchronize()
            draws_on_device &= self._perf_counter() - draw_started < FRESH_DRAW_MAX_SECONDS
        input_sets = [] if draws_on_device else [
            self._inputs(cfg.seed + 1000 + k) for k in range(1 if cfg.low_memory else cfg.timing_input_sets)]

        def load_fresh_inputs(sample: int) -> list[Any] | None:
            # New values every call (addresses change only between rounds): defeats caches keyed by pointer, call
            # count or input checksum. Preferably a fresh get_inputs() draw made on the GPU (returned: a copy of
            # the values now in the buffers, never handed to a model); else one of the stored input sets with its
            # rows re-permuted (None).
            fresh = draw(sample) if draws_on_device else None
            if fresh is not None:
                for buf, src in zip(buffers, fresh):
                    if isinstance(buf, torch.Tensor):
                        buf.copy_(src)
                return fresh
            source = input_sets[sample % len(input_sets)]
            perms: dict[int, torch.Tensor] = {}
            for buf, src in zip(buffers, source):
                if not isinstance(buf, torch.Tensor):
                    continue
                if buf.dim() > 0 and buf.shape[0] > 1:
                    perm = perms.setdefault(buf.shape[0], torch.randperm(buf.shape[0], device=self.device, generator=generator))
                    buf.copy_(src.index_select(0, perm))
                else:
                    buf.copy_(src)
            return None

        def restore(pristine: list[Any]) -> None:
            for buf, orig in zip(buffers, pristine):
                if isinstance(buf, torch.Tensor):
                    buf.copy_(orig)

        ref_model, cand_model = self.ref_model, self.cand_model

        def call_ref() -> Any:
            return ref_model(*buffers)

        def call_cand() -> Any:
            try:
                return cand_model(*buffers)
            except Exception as exc:  # noqa: BLE001 - tagged: the candidate's failure, not the harness's
                raise CandidateFailed(f"{type(exc).__name__}: {exc}") from exc

        with torch.no_grad():  # entered once: nothing but the forward call sits between the two events
            floors_start = self._perf_counter()
            floors = self._launch_floors_ms(flush, start, end)
            warm_start = self._perf_counter()
            warm_calls = 0

            def warm_pair() -> float:
                nonlocal warm_calls
                load_fresh_inputs(warm_calls)
                start.record()
                call_ref()
                call_cand()
                end.record()
                self._synchronize()
                warm_calls += 1
                return start.elapsed_time(end)

            _, warm_steady = warm_up(warm_pair, min(cfg.warmup_min_seconds, cfg.warmup_seconds), cfg.warmup_seconds,
                                     self._perf_counter)
            pair_s = (self._perf_counter() - warm_start) / warm_calls
            # Fewer pairs where each is slow: the budget bounds timing, with at least timing_min_samples pairs.
            min_pairs = max(cfg.timing_min_samples, min(cfg.timing_samples, int(cfg.timing_budget_s / (2 * pair_s))))
            times: dict[str, dict[str, list[float]]] = {c: {"ref": [], "cand": []} for c in ("gpu", "host")}
            walls: dict[str, list[float]] = {"ref": [], "cand": []}
            ratios: dict[str, list[float]] = {"gpu": [], "host": []}
            recheck = "nondeterministic_reference" not in j.flags
            timing_start, rounds, sample = self._perf_counter(), 1, 0
            while True:
                if sample and sample % cfg.timing_round_samples == 0:
                    # New allocations while the old ones are alive, so the round gets other addresses.
                    fresh = _clone(buffers)
                    buffers[:] = fresh
                    del fresh
                    rounds += 1
                drawn = load_fresh_inputs(sample + warm_calls)
                # The draw is a pristine copy already, unless get_inputs() handed back the buffers themselves (a
                # task that caches its inputs): then only a clone is one.
                pristine = drawn if drawn is not None and not _shares_memory(drawn, buffers) else _clone(buffers)
                conventions = ("gpu", "host") if sample % 2 == 0 else ("host", "gpu")
                order = ("ref", "cand") if (sample // 2) % 2 == 0 else ("cand", "ref")
                for convention in conventions:
                    outputs: dict[str, Any] = {}
                    for which in order:
                        fn = call_ref if which == "ref" else call_cand
                        if convention == "gpu":
                            outputs[which], ms = self._timed_gpu(fn, flush, start, end)
                        else:
                            outputs[which], ms, wall = self._timed_host(fn, flush, start, end)
                            walls[which].append(wall)
                        times[convention][which].append(ms)
                        if which == "ref":
                            restore(pristine)  # the reference may legitimately work in place
                        else:
                            _reject_mutated_inputs(pristine, buffers, f"during timed call {sample}")
                    r_ms, c_ms = times[convention]["ref"][-1], times[convention]["cand"][-1]
                    ratios[convention].append(r_ms / c_ms if c_ms > 0 else math.inf)
                    if recheck:
                        comparison = compare_outputs(outputs["ref"], outputs["cand"], (self.policy_tolerance,),
                                                     stats=False)
                        if not comparison.passes[self.policy_tolerance]:  # once more, for the message's numbers
                            comparison = compare_outputs(outputs["ref"], outputs["cand"], (self.policy_tolerance,))
                            raise Rejection(Status.DECEPTIVE, "timed_output_mismatch",
                                            f"timed call {sample} on fresh inputs returned a wrong result (max abs "
                                            f"diff {comparison.max_abs_diff:.3e}): a cache or phase-dependent "
                                            "behaviour", "anti_gaming")
                    del outputs
                del pristine
                sample += 1
                out_of_time = self._perf_counter() - timing_start > cfg.timing_budget_s
                if sample >= min_pairs and (sample % cfg.timing_round_samples == 0 or out_of_time
                                            or sample >= cfg.timing_max_samples):
                    low, high = median_interval(ratios[cfg.speedup_convention])
                    precise = (high - low) / 2 <= cfg.timing_target_precision * statistics.median(
                        ratios[cfg.speedup_convention])
                    if (sample >= cfg.timing_samples and precise) or out_of_time or sample >= cfg.timing_max_samples:
                        break
        timing_end = self._perf_counter()
        self.guard.check("during timing")
        chosen = cfg.speedup_convention
        stats = {c: (timing_stats(times[c]["ref"]), timing_stats(times[c]["cand"])) for c in ("gpu", "host")}
        speedups = {c: statistics.median(ratios[c]) for c in ("gpu", "host")}
        ref_stats, cand_stats = stats[chosen]
        j.fields.update(reference_timing=ref_stats, candidate_timing=cand_stats,
                        speedup=speedups[chosen] if math.isfinite(speedups[chosen]) else None,
                        speedup_gpu=speedups["gpu"] if math.isfinite(speedups["gpu"]) else None,
                        speedup_host=speedups["host"] if math.isfinite(speedups["host"]) else None,
                        speedup_convention=chosen)
        other = "host" if chosen == "gpu" else "gpu"
        cand_wall_med, ref_wall_med = statistics.median(walls["cand"]), statistics.median(walls["ref"])
        j.fields.setdefault("provenance", {}).update(
            launch_floor_ms=floors[chosen], launch_floors_ms=floors,
            reference_wall_median_ms=ref_wall_med, candidate_wall_median_ms=cand_wall_med,
            timing_inputs=("a fresh get_inputs() draw on the GPU for every call" if draws_on_device else
                           f"{len(input_sets)} stored input set(s), rows re-permuted for every call"),
            speedup_ci95=[low, high],
            speedup_of_medians=(ref_stats.median_ms / cand_stats.median_ms if cand_stats.median_ms > 0 else None),
            **{f"reference_median_ms_{other}": stats[other][0].median_ms,
               f"candidate_median_ms_{other}": stats[other][1].median_ms},
            timing_pairs=sample, timing_rounds=rounds, timing_min_pairs=min_pairs,
            warmup_pairs=warm_calls, warmup_steady=warm_steady,
            # Where the timing phase's wall time went: launch floors, warm-up, and the timed pairs with the work
            # around each (fresh draw, clone/restore, input and output checks).
            timing_split_s={"launch_floors": round(warm_start - floors_start, 4),
                            "warmup": round(timing_start - warm_start, 4),
                            "pairs": round(timing_end - timing_start, 4)})
        # Work on a side stream or thread is invisible to the events but not to a device-wide sync.
        host_ref, host_cand = stats["host"]
        ref_excess = max(ref_wall_med - host_ref.median_ms, 0.0)
        cand_excess = cand_wall_med - host_cand.median_ms
        if cand_excess > max(1.0 * host_cand.median_ms, 0.05) + 2 * ref_excess:
            raise Rejection(Status.DECEPTIVE, "work_outside_timed_stream",
                            f"wall clock to device sync {cand_wall_med:.3f} ms vs {host_cand.median_ms:.3f} ms on the "
                            "timed stream: work escapes the timer", "anti_gaming")
        if ref_stats.median_ms < cfg.overhead_floor_multiple * floors[chosen]:
            j.flag("overhead_dominated")

    def _baseline_callable(self, name: str, inputs: list[Any]) -> Callable[[], Any]:
        """The reference's forward on `inputs` as the named faster baseline, warmed up and ready to time."""
        if name == "compile":
            from torch._inductor import config as inductor_config

            inductor_config.compile_threads = 1  # no compile-worker pool inside the sandboxed worker
            compiled = torch.compile(self.ref_model)

            def call() -> Any:
                with torch.no_grad():
                    return compiled(*inputs)
        elif name == "cuda_graph":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(3):  # warm-up on a side stream, as capture requires
                    self.ref_model(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                self.ref_model(*inputs)
            call = graph.replay
        else:
            raise ValueError(f"unknown baseline {name!r}")
        for _ in range(3):
            call()
        self._synchronize()
        return call

    def run_extra_baselines(self) -> None:
        """Build and warm each of config.extra_baselines (untimed: torch.compile's compile runs here, beside other
        lanes), then time them with the GPU alone."""
        with self.phase("extra_baselines_prepare"):
            prepared = self.prepare_extra_baselines()
        with self.alone("extra_baselines_timing"):
            self.time_extra_baselines(prepared)

    def prepare_extra_baselines(self) -> dict[str, Any]:
        inputs = self._inputs(self.config.seed + 3000)
        prepared: dict[str, Any] = {"inputs": inputs, "calls": {}}
        for name in self.config.extra_baselines:
            try:
                prepared["calls"][name] = self._baseline_callable(name, inputs)
            except Exception as exc:  # noqa: BLE001 - e.g. a reference torch.compile or graph capture cannot handle
                prepared["calls"][name] = exc
        return prepared

    def time_extra_baselines(self, prepared: dict[str, Any]) -> None:
        """Time the reference as each of config.extra_baselines (CUDA graph, torch.compile) on one fresh input set,
        L2 flushed, in the configured convention, the eager timing's sample count (bounded by the timing budget);
        speedup = that median / the candidate's eager-run median (a ratio of medians, not paired). Runs after
        every check on the candidate, which is not called here; a baseline that cannot be built for this reference
        is recorded with its error and changes nothing else."""
        cfg, j = self.config, self.judgement
        candidate_ms = j.fields["candidate_timing"].median_ms
        flush = torch.empty(cfg.l2_flush_mb * 2**20 // 4, dtype=torch.int32, device=self.device)
        start, end = self._event(enable_timing=True), self._event(enable_timing=True)
        timed_pairs = j.fields.get("provenance", {}).get("timing_pairs", cfg.timing_samples)
        samples = max(cfg.timing_min_samples, min(cfg.timing_samples, timed_pairs))
        results: dict[str, Any] = {}
        for name, call in prepared["calls"].items():
            try:
                if isinstance(call, Exception):
                    raise call
                if cfg.speedup_convention == "gpu":
                    times = [self._timed_gpu(call, flush, start, end)[1] for _ in range(samples)]
                else:
                    times = [self._timed_host(call, flush, start, end)[1] for _ in range(samples)]
            except Exception as exc:  # noqa: BLE001 - e.g. a reference torch.compile or graph capture cannot handle
                results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                continue
            median_ms = statistics.median(times)
            results[name] = {"median_ms": median_ms, "n": len(times), "convention": cfg.speedup_convention,
                             "speedup": median_ms / candidate_ms if candidate_ms > 0 else None}
        j.fields["baseline_speedups"] = results

    def run(self, *, with_timing: bool = True) -> Judgement:
        try:
            try:
                stage = "correctness"
                if not self.prepared:
                    with self.phase("prepare_reference"):
                        self.prepare_reference()
                with self.phase("build_model"):
                    self._build_candidate()
                with self.phase("correctness"):
                    self.run_correctness()
                    if not with_timing:  # a correctness-only judgement (the RL reward's): the read timing makes
                        self.guard.check("during the correctness trials", thorough=True)
                if not self.control:
                    stage = "anti_gaming"
                    with self.phase("profiler"):
                        self.run_profiler_check()
                if with_timing:
                    stage = "timing"
                    # its set-up beside other lanes, then the timed pairs with the GPU alone: the judgement's last
                    # GPU work unless baselines follow (nothing after it but host-side bookkeeping)
                    self.run_timing(last_gpu_use=self.config.release_gpu_after_timing
                                    and not self.config.extra_baselines)
                    if self.config.extra_baselines:
                        self.run_extra_baselines()
            except Rejection:
                raise
            except CandidateFailed as failed:  # candidate code raised while timed: its runtime error
                cause = failed.__cause__ or failed
                if is_out_of_memory(cause):
                    raise self._candidate_out_of_memory(cause, stage) from failed
                raise Rejection(Status.RUNTIME_ERROR, "candidate_raised", str(failed)[:2000], stage) from failed
            except Exception as exc:  # noqa: BLE001
                if is_out_of_memory(exc):  # the verifier's own allocations (inputs, clones, comparisons)
                    raise self._infrastructure("harness_out_of_memory",
                                               f"the verifier ran out of GPU memory for its own state: {exc}"[:1000]) from exc
                # Anything else after candidate code ran (e.g. a sticky CUDA fault surfacing at the next sync) is
                # the candidate's runtime error, as in verifier 0.2.
                raise Rejection(Status.RUNTIME_ERROR, "candidate_raised", f"{type(exc).__name__}: {exc}"[:2000],
                                stage) from exc
        except Rejection as rejection:
            self.judgement.status = rejection.status
            self.judgement.reasons.append(rejection.reason)
            if getattr(rejection, "retry_low_memory", False):
                self.judgement.fields["retry_low_memory"] = True
        finally:
            self.judgement.fields.setdefault("provenance", {})["phase_seconds"] = dict(self.phase_seconds)
            try:
                if self.device.type == "cuda":
                    peak = max(torch.cuda.max_memory_allocated(self.device), self._peak_floor_bytes)
                    self.judgement.fields["peak_gpu_memory_mb"] = peak / 2**20
            except Exception:  # noqa: BLE001 - a poisoned context cannot report; the verdict goes on without it
                pass
        return self.judgement
