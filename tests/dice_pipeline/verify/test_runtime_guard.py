"""CPU tests of the runtime guard (judge.guard.RuntimeGuard) against candidates that change what they are compared with
rather than compute it: PyTorch's operators given the candidate's kernels (the dispatcher check,
judge.guard.DispatcherSnapshot), op calls re-routed (modes, autocast), methods added to torch's classes or replaced in
torch.nn's, nn.Module's global hooks, and the reference's own module and model. Changes made here are undone in
each test (Library._destroy, delattr, hook handles); ones that cannot be undone run in a subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
import uuid
import warnings

import pytest
import torch

from dice_pipeline.verify.config import VerifyConfig
from dice_pipeline.verify.judge import CandidateJudge, DispatcherSnapshot, Rejection, RuntimeGuard, compare_outputs
from dice_pipeline.verify.verdict import Status

CPU = torch.device("cpu")


@pytest.fixture
def aten_library():
    """A `torch.library.Library("aten", "IMPL")`, destroyed after the test (its kernels go with it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": the point of the test
        library = torch.library.Library("aten", "IMPL")
        yield library
        library._destroy()


def _rejection(guard: RuntimeGuard, **kwargs) -> Rejection:
    with pytest.raises(Rejection) as caught:
        guard.check("in the test", **kwargs)
    return caught.value


def test_a_replaced_kernel_of_an_existing_operator_is_a_dispatcher_override(aten_library):
    guard = RuntimeGuard()
    aten_library.impl("relu", lambda x: torch.zeros_like(x), "CPU")
    assert torch.relu(torch.tensor([3.0])).item() == 0.0  # the reference's relu would now be the candidate's
    guard.check("between calls")  # the cheap check (no dispatcher read) does not look
    rejection = _rejection(guard, thorough=True)
    assert rejection.status == Status.DECEPTIVE and rejection.reason.code == "dispatcher_override"
    assert "aten::relu [CPU]: kernel replaced" in rejection.reason.message


def test_a_new_kernel_for_an_existing_operator_is_a_dispatcher_override(aten_library):
    guard = RuntimeGuard()
    aten_library.impl("linear", lambda x, w, b=None: x, "CPU")  # linear had no CPU kernel (composite): now it has
    rejection = _rejection(guard, thorough=True)
    assert "aten::linear [CPU]: a kernel registered at" in rejection.reason.message and __file__ in rejection.reason.message


def test_a_backend_fallback_is_a_dispatcher_override():
    guard = RuntimeGuard()
    library = torch.library.Library("_", "IMPL")
    try:
        library.fallback(lambda *args, **kwargs: None, dispatch_key="CPU")
        assert "backend fallback added for DispatchKey.CPU" in _rejection(guard, thorough=True).reason.message
    finally:
        library._destroy()
    guard.check("after the fallback went", thorough=True)


def test_the_dispatcher_back_as_it_was_passes(aten_library):
    guard = RuntimeGuard()
    other = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other.impl("relu", lambda x: x, "CPU")
    other._destroy()
    guard.check("after the override was undone", thorough=True)


def test_the_candidates_own_operators_are_not_overrides():
    guard = RuntimeGuard()
    namespace = f"dice_test_{uuid.uuid4().hex[:8]}"
    library = torch.library.Library(namespace, "DEF")
    try:
        library.define("scale(Tensor x) -> Tensor")
        library.impl("scale", lambda x: x * 2, "CPU")
        assert getattr(torch.ops, namespace).scale(torch.ones(2)).tolist() == [2.0, 2.0]
        guard.check("after registering its own operator", thorough=True)
        guard.check("and again (the new state is the snapshot now)", thorough=True)
    finally:
        library._destroy()


def test_register_kernel_on_a_pytorch_operator_is_caught_and_pytorchs_own_lazy_registrations_are_not():
    # torch.library.register_kernel cannot be undone in-process, and the lazy imports must be first imports: a
    # fresh interpreter. Its kernel is recorded as registered inside torch/library.py: caught as a replacement.
    script = textwrap.dedent("""
        import warnings
        warnings.simplefilter("ignore")
        import torch
        from dice_pipeline.verify.judge import DispatcherSnapshot
        snapshot = DispatcherSnapshot()
        import torch._dynamo  # noqa: F401 - registers kernels for c10d_functional, streams, onnx_symbolic ops
        import torch.distributed._functional_collectives  # noqa: F401
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]):
            torch.relu(torch.randn(8)).sum()
        with torch.device("meta"):
            torch.rand(64, 64) @ torch.rand(64, 64)
        assert snapshot.overrides() == [], snapshot.overrides()
        torch.library.register_kernel("aten::relu", "cpu", lambda x: x)
        found = snapshot.overrides()
        assert len(found) == 1 and found[0].startswith("aten::relu [CPU]: kernel replaced"), found
        snapshot = DispatcherSnapshot()
        torch.library.register_kernel("aten::linear", "cpu", lambda x, w, b=None: x)  # a key linear had not
        found = snapshot.overrides()
        assert len(found) == 1 and found[0].startswith("aten::linear [CPU]: a kernel registered at"), found
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_a_python_mode_left_on_the_stack_is_caught_by_every_check():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    guard = RuntimeGuard()
    mode = Passthrough()
    mode.__enter__()
    try:
        rejection = _rejection(guard)  # no dispatcher read needed: the mode stacks are read on every check
        assert rejection.reason.code == "dispatcher_override" and "torch_dispatch_modes" in rejection.reason.message
    finally:
        mode.__exit__(None, None, None)
    guard.check("after the mode left")


def test_autocast_left_on_is_caught():
    guard = RuntimeGuard()
    autocast = torch.autocast("cpu")
    autocast.__enter__()
    try:
        assert "dispatch_keys_excluded" in _rejection(guard).reason.message
    finally:
        autocast.__exit__(None, None, None)
    guard.check("after autocast ended")


def test_the_snapshot_reads_every_operator():
    snapshot = DispatcherSnapshot()
    assert len(snapshot.dumps) > 1000 and ("aten::relu", "CPU") in snapshot.entries
    assert snapshot.overrides() == []


# --- the judge on the CPU: an override reached past the static checks ----------------------------------------------
REFERENCE = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0
def get_inputs():
    return [torch.rand(64, 32)]
def get_init_inputs():
    return []
"""

# The reference's `x * 2.0` becomes zeros, and so does the candidate's answer: every output check passes.
OVERRIDING_CANDIDATE = """
import warnings
import torch
warnings.simplefilter("ignore")
_lib = getattr(torch.library, "Lib" + "rary")("at" + "en", "IMPL")  # a name the static checks cannot read
_lib.impl("mul.Tensor", lambda a, b: torch.zeros_like(a), "CPU")
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)
"""


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)  # trusted test code
    return module


def test_a_candidate_that_overrides_the_references_operator_is_deceptive_not_correct():
    reference = _module("reference_module", REFERENCE)
    guard = RuntimeGuard()  # as in the worker: before the candidate is imported
    candidate = _module("candidate_module", OVERRIDING_CANDIDATE)
    try:
        judge = CandidateJudge(reference, candidate, VerifyConfig(), guard, ["k"], device=CPU)
        judge.run_profiler_check = lambda: None  # needs CUDA kernels; the GPU tests cover it
        judgement = judge.run(with_timing=False)
    finally:
        candidate._lib._destroy()
    assert judgement.status == Status.DECEPTIVE, judgement.reasons
    assert judgement.reasons[-1].code == "dispatcher_override"
    assert "aten::mul.Tensor [CPU]" in judgement.reasons[-1].message


# --- torch's classes, nn.Module's global hooks, the reference's module and model -----------------------------------
def test_a_method_added_to_torch_tensor_shadows_the_inherited_one_and_is_caught():
    guard = RuntimeGuard()
    tensor_class = torch.Tensor  # an alias: the static checks see no assignment to torch
    setattr(tensor_class, "softmax", lambda self, dim=None, **kwargs: self)
    try:
        assert torch.tensor([1.0, 2.0]).softmax(0).tolist() == [1.0, 2.0]  # every softmax is the candidate's now
        rejection = _rejection(guard)
        assert rejection.reason.code == "runtime_monkeypatch"
        assert "torch.Tensor.softmax was added" in rejection.reason.message
    finally:
        delattr(tensor_class, "softmax")
    guard.check("after it was removed")


def test_a_torch_nn_layers_forward_replaced_is_caught():
    guard = RuntimeGuard()
    layer = torch.nn.Linear
    original = layer.forward
    setattr(layer, "forward", lambda self, x: x)
    try:
        assert "torch.nn.Linear.forward was replaced" in _rejection(guard).reason.message
    finally:
        layer.forward = original
    guard.check("after restoring")


def test_a_global_module_hook_is_caught():
    guard = RuntimeGuard()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: output * 0)
    try:
        assert "global nn.Module hook" in _rejection(guard).reason.message
    finally:
        handle.remove()
    guard.check("after the hook was removed")


def test_data_a_library_caches_on_a_class_is_not_a_patch():
    import copy

    guard = RuntimeGuard()
    copy.deepcopy(torch.nn.Linear(2, 2))  # copyreg may cache __slotnames__ (a list) on the class
    guard.check("after a deepcopy")


SIZED_REFERENCE = """
import torch
ROWS = 64
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Linear(32, 32, bias=False)
    def forward(self, x):
        return self.scale(x) * 2.0
def get_inputs():
    return [torch.rand(ROWS, 32)]
def get_init_inputs():
    return []
"""

# Each makes the reference answer what the candidate answers (zeros), by a route the static checks cannot read.
REFERENCE_REWRITES = {
    "class_method": ("M = sys.modules['reference_module'].Model\nsetattr(M, 'forward', lambda self, x: x * 0)",
                     "reference_module.Model.forward was replaced"),
    "module_size": ("ref = sys.modules['reference_module']\nsetattr(ref, 'ROWS', 1)",
                    "the reference module's ROWS was changed"),
    "instance_hook": ("found = [o for o in gc.get_objects() if type(o) is sys.modules['reference_module'].Model]\n"
                      "found[0].register_forward_hook(lambda module, args, output: output * 0)",
                      "the reference model's modules"),
    "weights_zeroed_in_place": ("found = [o for o in gc.get_objects() if type(o) is sys.modules['reference_module'].Model]\n"
                                "torch.nn.init.zeros_(found[0].scale.weight)",
                                "the reference model's parameters were changed"),
    "layer_class_swapped": ("found = [o for o in gc.get_objects() if type(o) is sys.modules['reference_module'].Model]\n"
                            "found[0].scale.__class__ = type('Zero', (torch.nn.Linear,), "
                            "{'forward': lambda self, x: x * 0})",
                            "the reference model's modules"),
}


def _prepared_judge(reference_src: str, candidate_src: str) -> CandidateJudge:
    """As the worker runs it: the guard, then the reference's trusted set-up, then the candidate's import."""
    reference = sys.modules["reference_module"] = _module("reference_module", reference_src)
    judge = CandidateJudge(reference, None, VerifyConfig(), RuntimeGuard(), ["k"], device=CPU)
    judge.run_profiler_check = lambda: None  # needs CUDA kernels (the GPU tests cover it); set before the guard sees it
    judge.prepare_reference()
    judge.candidate = _module("candidate_module", candidate_src)
    return judge


@pytest.mark.parametrize("route", sorted(REFERENCE_REWRITES))
def test_a_candidate_that_rewrites_the_reference_is_deceptive(route, monkeypatch):
    code, expected = REFERENCE_REWRITES[route]
    monkeypatch.setitem(sys.modules, "reference_module", None)  # restored after the test
    judge = _prepared_judge(SIZED_REFERENCE, "import gc, sys, torch\n" + code + "\n"
                            "class ModelNew(torch.nn.Module):\n"
                            "    def forward(self, x):\n"
                            "        return torch.zeros(x.shape[0], 32)\n")
    judgement = judge.run(with_timing=False)
    assert judgement.status == Status.DECEPTIVE, judgement.reasons
    assert judgement.reasons[-1].code == "runtime_monkeypatch" and expected in judgement.reasons[-1].message


def test_the_reference_left_alone_is_judged_as_before(monkeypatch):
    monkeypatch.setitem(sys.modules, "reference_module", None)
    judge = _prepared_judge(SIZED_REFERENCE, "import torch\n"
                            "class ModelNew(torch.nn.Module):\n"
                            "    def __init__(self):\n"
                            "        super().__init__()\n"
                            "        self.scale = torch.nn.Linear(32, 32, bias=False)\n"
                            "    def forward(self, x):\n"
                            "        return self.scale(x) * 2.0\n")
    judgement = judge.run(with_timing=False)
    assert judgement.status == Status.CORRECT, judgement.reasons


# The judge found through the garbage collector: what it compares with, how, and its own timer.
JUDGE_REWRITES = {
    "reference_model_swapped": ("judge.ref_model = judge.ref_model.__class__()", "the harness's own ref_model"),
    "tolerance_loosened": ("judge.tolerances = (1e9, 1e9)", "the harness's own tolerances"),
    "config_changed": ("judge.config.correctness_trials = 1", "the judgement's config was changed"),
    "timer_replaced": ("judge._perf_counter = lambda: 0.0", "the harness's own _perf_counter"),
    "profiler_pass_skipped": ("judge.run_profiler_check = lambda: None", "the harness's own run_profiler_check"),
    "method_shadowed": ("judge._call_reference = lambda inputs, seed: judge.cand_model(*inputs)",
                        "_call_reference (set on the judge)"),
}


@pytest.mark.parametrize("route", sorted(JUDGE_REWRITES))
def test_a_candidate_that_rewrites_the_judge_is_deceptive(route, monkeypatch):
    code, expected = JUDGE_REWRITES[route]
    monkeypatch.setitem(sys.modules, "reference_module", None)
    judge = _prepared_judge(SIZED_REFERENCE, "import gc, torch\n"
                            "class ModelNew(torch.nn.Module):\n"
                            "    def __init__(self):\n"
                            "        super().__init__()\n"
                            "        self.scale = torch.nn.Linear(32, 32, bias=False)\n"
                            "    def forward(self, x):\n"
                            "        judge = next(o for o in gc.get_objects() if type(o).__name__ == 'CandidateJudge'\n"
                            "                     and getattr(o, 'cand_model', None) is self)\n"
                            f"        {code}\n"
                            "        return self.scale(x) * 2.0\n")
    judgement = judge.run(with_timing=False)
    assert judgement.status == Status.DECEPTIVE, judgement.reasons
    assert judgement.reasons[-1].code == "runtime_monkeypatch" and expected in judgement.reasons[-1].message


def test_the_candidates_kernel_names_set_by_the_worker_after_its_build_are_not_a_change():
    reference = _module("reference_module", SIZED_REFERENCE)
    guard = RuntimeGuard()
    judge = CandidateJudge(reference, None, VerifyConfig(), guard, ["static_kernel"], device=CPU)
    judge.prepare_reference()
    judge.custom_kernel_names = ("built_kernel", "static_kernel")  # as worker.run_judge_stage does
    with pytest.raises(Rejection):
        guard.check("before the worker says so")
    guard.watch_judge(judge, fields=("custom_kernel_names",))
    guard.check("after")
    judge.config = VerifyConfig()  # and the other fields stay as first taken
    with pytest.raises(Rejection):
        guard.check("after the config object was swapped")


def test_a_guard_disarmed_in_place_is_caught_and_its_methods_cannot_be_shadowed():
    guard = RuntimeGuard()
    saved = dict(guard.identities)
    guard.identities.clear()  # nothing left to compare: every patch would pass
    try:
        assert "the runtime guard's own state was changed" in _rejection(guard).reason.message
    finally:
        guard.identities.update(saved)
    guard.check("after restoring")
    with pytest.raises(AttributeError):
        guard.check = lambda *args, **kwargs: None  # slots: no instance attribute can stand in for the method
    with pytest.raises(AttributeError):
        guard.dispatcher.overrides = lambda: []


def test_the_reference_built_again_by_the_trusted_set_up_is_not_a_swap():
    # worker.run_judge_stage releases the prepared reference before it waits for the whole GPU, then prepares it
    # again: a new model object, taken anew by the guard.
    reference = _module("reference_module", SIZED_REFERENCE)
    guard = RuntimeGuard()
    judge = CandidateJudge(reference, None, VerifyConfig(), guard, ["k"], device=CPU)
    judge.prepare_reference()
    judge.release_prepared()
    judge.prepare_reference()
    guard.check("after the second set-up")


def test_a_reference_with_uninitialised_parameters_is_not_a_change():
    reference = _module("reference_module", SIZED_REFERENCE.replace(
        "self.scale = torch.nn.Linear(32, 32, bias=False)",
        "self.scale = torch.nn.Linear(32, 32, bias=False)\n"
        "        self.extra = torch.nn.Parameter(torch.full((4,), float('nan')))"))
    guard = RuntimeGuard()
    judge = CandidateJudge(reference, None, VerifyConfig(), guard, ["k"], device=CPU)
    judge.prepare_reference()
    guard.check("with a NaN parameter", thorough=True)


def test_runtime_guard_catches_a_patched_harness_function():
    import sys

    from dice_pipeline.verify.judge import compare, flow, guard as guard_module

    for module in (flow, compare):  # where the judge calls it, and where it is defined
        guard = guard_module.RuntimeGuard()
        original = module.compare_outputs
        sys.modules[module.__name__].compare_outputs = lambda *a, **k: None
        try:
            with pytest.raises(Rejection) as caught:
                guard.check("in the test")
            assert caught.value.reason.code == "runtime_monkeypatch" and "compare_outputs" in str(caught.value)
        finally:
            module.compare_outputs = original
    guard.check("after restoring")  # and an untouched state passes

def test_the_output_checks_linear_algebra_is_guarded_and_taken_before_any_candidate():
    from dice_pipeline.verify.judge import RuntimeGuard

    guard = RuntimeGuard()
    original = torch.linalg.vector_norm
    torch.linalg.vector_norm = lambda *a, **k: torch.zeros(())  # would make every timed output "close"
    try:
        ref = torch.zeros(8)
        assert not compare_outputs(ref, ref + 1.0, (1e-2,), stats=False).passes[1e-2]  # the harness's own copy
        with pytest.raises(Rejection) as caught:
            guard.check("in the test")
        assert caught.value.reason.code == "runtime_monkeypatch" and "vector_norm" in str(caught.value)
    finally:
        torch.linalg.vector_norm = original
    guard.check("after restoring")

def test_runtime_guard_catches_a_patched_harness_method_and_builtin():
    import builtins

    from dice_pipeline.verify.judge import CandidateJudge, RuntimeGuard

    for owner, name in ((CandidateJudge, "_timed_gpu"), (CandidateJudge, "run_correctness"), (builtins, "max")):
        guard = RuntimeGuard()
        original = getattr(owner, name)
        setattr(owner, name, lambda *a, **k: None)
        try:
            with pytest.raises(Rejection):
                guard.check("in the test")
        finally:
            setattr(owner, name, original)


def test_the_guard_watches_every_module_of_the_judge():
    from pathlib import Path

    from dice_pipeline.verify import judge
    from dice_pipeline.verify.judge.guard import JUDGE_MODULES

    files = {path.stem for path in Path(judge.__file__).parent.glob("*.py") if path.stem != "__init__"}
    assert set(JUDGE_MODULES) == files  # a new module of the judge must be watched too
    guard = RuntimeGuard()
    for name in JUDGE_MODULES:
        module = sys.modules[f"dice_pipeline.verify.judge.{name}"]
        own = [value for value in vars(module).values() if getattr(value, "__module__", None) == module.__name__]
        # a function of the module, else a method of a class it defines
        owner, function = next(((module, f.__name__) for f in own if callable(f) and not isinstance(f, type)), (None, None))
        if owner is None:
            owner = next(cls for cls in own if isinstance(cls, type))
            function = next(key for key, value in vars(owner).items() if callable(value) and not key.startswith("__"))
        original = vars(owner)[function]
        setattr(owner, function, lambda *a, **k: None)
        try:
            with pytest.raises(Rejection) as caught:
                guard.check("in the test")
            assert caught.value.reason.code == "runtime_monkeypatch" and function in str(caught.value), name
        finally:
            setattr(owner, function, original)
    guard.check("after restoring")
