"""The runtime guard: identities of everything a cheat would patch (torch's callables, torch.nn's classes, the judge's
own modules, the reference's module and model, the judge's state), the global math flags, what routes PyTorch's op
calls and the dispatcher's kernels, captured before the candidate is imported and compared after every candidate
call (`RuntimeGuard.check`); any change is deceptive."""

from __future__ import annotations

import importlib
import math
import os
import statistics
import sys
import threading
import time
from types import ModuleType
from typing import Any

import torch

from dice_pipeline.verify.gpu_share import GpuShareClient
from dice_pipeline.verify.judge.compare import VECTOR_NORM
from dice_pipeline.verify.judge.judgement import Rejection
from dice_pipeline.verify.verdict import Status

# Every module of the judge (dice_pipeline/verify/judge): the guard watches each one's functions and classes. A
# test keeps this list equal to the package's files, so a new module cannot escape the guard.
JUDGE_MODULES = ("judgement", "tensors", "compare", "guard", "inputs", "profile", "timing", "baselines", "flow")


def judge_namespaces() -> dict[str, Any]:
    """The judge's modules and the classes defined in them, by name (imported by now: the package imports them)."""
    namespaces: dict[str, Any] = {}
    for name in JUDGE_MODULES:
        module = importlib.import_module(f"{__package__}.{name}")
        namespaces[f"judge.{name}"] = module
        namespaces.update({f"judge.{name}.{value.__name__}": value for value in vars(module).values()
                           if isinstance(value, type) and value.__module__ == module.__name__})
    return namespaces


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
                 float(VECTOR_NORM(p, 2, dtype=torch.float64)).hex()) for name, p in model.named_parameters()]


def _torch_nn_classes() -> dict[str, type]:
    """torch.nn's module classes (Linear, Conv2d, ...): the reference's layers call their `forward`."""
    return {f"torch.nn.{name}": value for name, value in vars(torch.nn).items()
            if isinstance(value, type) and issubclass(value, torch.nn.Module)}


_MISSING = object()
# CandidateJudge attributes that hold the same object from the trusted set-up on: what it compares against and how
# (the reference, its model, the config, the tolerances and, once the correctness trials set them, the policy
# tolerance and the null-output bound the timed calls are held to, the candidate's kernel names, the GPU's gate). The
# harness's own timer, events and device sync are callables set on the instance: watched as those (watch_judge).
JUDGE_FIXED_ATTRIBUTES = ("reference", "ref_model", "config", "guard", "device", "tolerances", "control",
                          "custom_kernel_names", "gpu_share", "policy_tolerance", "null_output_bound")


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
            # The judge itself: every module's functions and the methods of its classes, however a candidate
            # reached them.
            **judge_namespaces(),
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
        self.judge: tuple[Any, dict[str, int], dict[str, int], dict[str, Any]] | None = None
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

    def watch_judge(self, judge: Any, *, fields: tuple[str, ...] = ()) -> None:
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

