"""The embedded seed corpus: manifest, KernelBench-format references that run on CPU, candidate file layout,
ConCuR-schema rows, the measurement recorder, and (with nvcc) that the CUDA sources really compile."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dice_pipeline.seed_corpus import (
    BAD_OUTCOMES,
    CONCUR_COLUMNS,
    CORPUS_DIR,
    EXTRA_COLUMNS,
    GOOD_OUTCOMES,
    MANIFEST_PATH,
    NOT_MEASURED,
    SEED_UUID_NAMESPACE,
    STALE_MEASUREMENT,
    SeedCorpusError,
    load_manifest,
    load_seed_pairs,
    seed_uuid,
)
from dice_pipeline.seed_corpus.layout import (
    CandidateLayoutError,
    declared_functions,
    merged_cuda_unit,
    split_candidate,
)
from dice_pipeline.seed_corpus.record_measurements import build_measurements, main as record_main, record

SPECS = load_manifest()
SPEC_IDS = [Path(spec.directory).name for spec in SPECS]
GOOD_SPECS = [spec for spec in SPECS if spec.intended_outcome != "no_compile"]


def _exec_module(code: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(code, name, "exec"), module.__dict__)
    return module


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name]
    assert found, f"no top-level class {name}"
    return found[0]


def _method_args(cls: ast.ClassDef, method: str) -> list[str]:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == method:
            return [arg.arg for arg in node.args.args]
    raise AssertionError(f"{cls.name} has no {method}()")


# ---------------------------------------------------------------------------------------------- manifest


def test_manifest_has_enough_pairs_with_unique_stable_uuids():
    assert len(SPECS) >= 36
    assert len({spec.uuid for spec in SPECS}) == len(SPECS)
    assert all(spec.uuid == seed_uuid(spec.problem_name) for spec in SPECS)
    assert json.loads(MANIFEST_PATH.read_text())["uuid_namespace"] == str(SEED_UUID_NAMESPACE)


def test_every_pair_directory_is_in_the_manifest():
    on_disk = sorted(p.name for p in (CORPUS_DIR / "pairs").iterdir() if p.is_dir())
    assert on_disk == sorted(SPEC_IDS)


def test_corpus_covers_the_required_op_families_and_a_spread_of_outcomes():
    families = {spec.op_family for spec in SPECS}
    for family in ("elementwise", "fused_elementwise", "reduction", "softmax", "normalization", "matmul",
                   "convolution", "llm_block"):
        assert family in families
    outcomes = [spec.intended_outcome for spec in SPECS]
    assert outcomes.count("faster") >= 5 and outcomes.count("slower") >= 2
    # Every rejection path: wrong, PyTorch-only, does not compile, and a deceptive one of another kind.
    for outcome in ("wrong", "pytorch_only", "no_compile"):
        assert outcome in outcomes
    assert {"fallback_to_torch", "partial_output"} & set(outcomes)
    assert set(outcomes) <= GOOD_OUTCOMES | BAD_OUTCOMES


def test_manifest_rejects_a_uuid_that_is_not_derived_from_the_name(tmp_path):
    data = json.loads(MANIFEST_PATH.read_text())
    data["pairs"][0]["uuid"] = seed_uuid("something else")
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(SeedCorpusError, match="uuid5"):
        load_manifest(bad)


# --------------------------------------------------------------------------------------------- references


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_reference_is_a_kernelbench_task(spec):
    code = spec.read("reference.py")
    tree = ast.parse(code)
    imports = {ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))}
    assert {"import torch", "import torch.nn as nn"} <= imports
    model = _class(tree, "Model")
    assert [ast.unparse(base) for base in model.bases] == ["nn.Module"]
    _method_args(model, "__init__")
    _method_args(model, "forward")
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {"get_inputs", "get_init_inputs"} <= set(functions)
    # Inputs come from torch.rand / torch.randn only (KernelBench's harness re-draws them per trial).
    random_calls = {
        node.func.attr
        for node in ast.walk(functions["get_inputs"])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and ast.unparse(node.func.value) == "torch"
    }
    assert random_calls & {"rand", "randn"} and random_calls <= {"rand", "randn", "cos", "sin"}


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_reference_builds_and_runs_on_cpu_at_smoke_sizes(spec):
    import torch

    module = _exec_module(spec.read("reference.py"), f"{spec.problem_name}_reference")
    assert spec.cpu_smoke_sizes, "each pair lists smaller sizes for the CPU smoke run"
    for name, small in spec.cpu_smoke_sizes.items():
        full = getattr(module, name)  # a module-level size constant, read by get_inputs at call time
        assert isinstance(full, int) and 0 < small < full, f"{name}: smoke size {small} vs full {full}"
        setattr(module, name, small)
    torch.manual_seed(0)
    inputs = module.get_inputs()
    assert inputs and all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in inputs)
    model = module.Model(*module.get_init_inputs())
    with torch.no_grad():
        out = model(*inputs)
    assert isinstance(out, torch.Tensor) and out.numel() > 0
    assert torch.isfinite(out).all()


# --------------------------------------------------------------------------------------------- candidates


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_candidate_follows_the_infilling_layout(spec):
    code = spec.read("candidate.py")
    tree = ast.parse(code)
    parts = split_candidate(code)
    # prefix = imports only; then the CUDA `source`, `cpp_src`, the load_inline call, and ModelNew, in that order.
    kinds = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            kinds.append("import")
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
            kinds.append(target if target in ("source", "cpp_src") else "load_inline")
        elif isinstance(node, ast.ClassDef):
            kinds.append(node.name)
    first_non_import = kinds.index("source")
    assert set(kinds[:first_non_import]) == {"import"}
    assert kinds[first_non_import:] == ["source", "cpp_src", "load_inline", "ModelNew"]
    assert "#include <torch/extension.h>" in parts.source and "__global__" in parts.source
    declared = declared_functions(parts.cpp_src)
    assert parts.functions and set(parts.functions) == set(declared)
    for function in parts.functions:
        assert re.search(rf"\b{function}\s*\(", parts.source), f"{function} is declared but not defined"
    assert ast.unparse(_class(tree, "ModelNew").bases[0]) == "nn.Module"


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_candidate_has_the_reference_constructor_and_forward_signature(spec):
    reference = _class(ast.parse(spec.read("reference.py")), "Model")
    candidate = _class(ast.parse(spec.read("candidate.py")), "ModelNew")
    for method in ("__init__", "forward"):
        assert _method_args(candidate, method) == _method_args(reference, method)


def test_extension_names_are_unique_across_the_corpus():
    names = [split_candidate(spec.read("candidate.py")).extension_name for spec in SPECS]
    assert len(set(names)) == len(names)


def test_split_candidate_refuses_a_file_without_the_layout():
    with pytest.raises(CandidateLayoutError, match="source"):
        split_candidate("import torch\nclass ModelNew: pass\n")
    with pytest.raises(CandidateLayoutError, match="load_inline"):
        split_candidate('source = """x"""\ncpp_src = """y"""\n')


def test_pytorch_only_candidates_really_do_not_launch_their_kernel():
    # The labelled-bad pairs must stay bad: guard against someone "fixing" them.
    by_outcome = {}
    for spec in SPECS:
        by_outcome.setdefault(spec.intended_outcome, []).append(spec)
    for spec in by_outcome["pytorch_only"]:
        code = spec.read("candidate.py")
        parts = split_candidate(code)
        forward = next(
            node for node in ast.walk(_class(ast.parse(code), "ModelNew"))
            if isinstance(node, ast.FunctionDef) and node.name == "forward"
        )
        calls_extension = parts.extension_variable in ast.unparse(forward)
        host_launches = "<<<" in parts.source
        assert not (calls_extension and host_launches), spec.problem_name
    for spec in by_outcome["fallback_to_torch"]:
        assert any(isinstance(n, ast.Try) for n in ast.walk(ast.parse(spec.read("candidate.py"))))


# ------------------------------------------------------------------------------------------------ loader


def test_rows_have_the_concur_schema_and_no_invented_speedup(tmp_path):
    rows = load_seed_pairs(measurements_path=tmp_path / "absent.json")
    assert len(rows) == len(SPECS)
    for row in rows:
        assert tuple(row) == CONCUR_COLUMNS + EXTRA_COLUMNS
        assert row["pytorch_code"].strip() and row["generated_code"].strip() and row["generated_think"]
        assert row["speedup_over_eager"] is None
        assert row["measurement_status"] == NOT_MEASURED and row["speedup_measurement"] is None


def test_shipped_measurements_are_consistent_with_the_corpus():
    rows = load_seed_pairs()
    for row in rows:
        if row["speedup_over_eager"] is not None:
            method = json.loads(row["speedup_measurement"])
            assert row["measurement_status"] == "correct"
            assert method["gpu"] and method["torch"] and method["date"]


def _verdict(status: str, speedup: float | None = None, gpu: str | None = "NVIDIA H200") -> dict:
    timing = {"median_ms": 1.0, "iqr_ms": 0.01, "mean_ms": 1.0, "n": 100, "cv": 0.01}
    provenance = {"torch": "2.11.0+cu130", "cuda": "13.0", "driver": "580.159.03", "verifier_version": "0.1.0",
                  "time": "2026-11-05T10:00:00+00:00"}
    if gpu:
        provenance["gpu"] = gpu
    return {
        "status": status,
        "reasons": [] if status == "correct" else [{"code": f"{status}_reason", "message": "x", "stage": "s"}],
        "speedup": speedup,
        "reference_timing": timing,
        "candidate_timing": dict(timing, median_ms=1.0 / speedup) if speedup else None,
        "provenance": provenance,
    }


def test_recorded_measurements_flow_into_the_rows(tmp_path):
    fast, wrong, broken = SPECS[1], SPECS[2], SPECS[3]
    entries = [
        {"job_id": fast.uuid, "verdict": _verdict("correct", 2.5)},
        {"job_id": wrong.uuid, "verdict": _verdict("incorrect")},
        {"job_id": broken.uuid, "verdict": _verdict("compile_error")},
    ]
    verdicts = tmp_path / "seed_verdicts.json"
    verdicts.write_text(json.dumps(entries))
    output = tmp_path / "measurements.json"
    record(verdicts, output)
    rows = {row["uuid"]: row for row in load_seed_pairs(measurements_path=output)}
    assert rows[fast.uuid]["speedup_over_eager"] == 2.5
    method = json.loads(rows[fast.uuid]["speedup_measurement"])
    assert method["gpu"] == "NVIDIA H200" and method["cuda"] == "13.0" and method["candidate_median_ms"] == 0.4
    for rejected, status in ((wrong, "incorrect"), (broken, "compile_error")):
        assert rows[rejected.uuid]["speedup_over_eager"] is None
        assert rows[rejected.uuid]["measurement_status"] == status
    assert rows[SPECS[0].uuid]["measurement_status"] == NOT_MEASURED


def test_a_measurement_of_older_code_is_marked_stale(tmp_path):
    spec = SPECS[1]
    measurements = build_measurements([{"job_id": spec.uuid, "verdict": _verdict("correct", 3.0)}], SPECS)
    measurements[spec.uuid]["code_sha256"] = "0" * 64
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps({"measurements": measurements}))
    row = next(r for r in load_seed_pairs(measurements_path=path) if r["uuid"] == spec.uuid)
    assert row["speedup_over_eager"] is None and row["measurement_status"] == STALE_MEASUREMENT


@pytest.mark.parametrize(
    "entries, message",
    [
        ([{"job_id": "not-a-seed-uuid", "verdict": _verdict("correct", 2.0)}], "not a seed pair"),
        ([{"job_id": SPECS[0].uuid, "verdict": _verdict("correct", 2.0, gpu=None)}], "GPU"),
        ([{"job_id": SPECS[0].uuid, "verdict": _verdict("correct", None)}], "no positive speedup"),
        ([{"job_id": SPECS[0].uuid, "verdict": _verdict("incorrect")}] * 2, "second verdict"),
    ],
)
def test_recorder_refuses_verdicts_it_cannot_trust(entries, message):
    with pytest.raises(SeedCorpusError, match=message):
        build_measurements(entries, SPECS)


def test_recorder_cli_reports_bad_input_with_exit_code_1(tmp_path, capsys):
    verdicts = tmp_path / "v.json"
    verdicts.write_text(json.dumps({"not": "a list"}))
    assert record_main([str(verdicts), "--output", str(tmp_path / "m.json")]) == 1
    assert "expected a JSON list" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_loader_refuses_measurements_for_unknown_pairs(tmp_path):
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps({"measurements": {"00000000-0000-0000-0000-000000000000": {}}}))
    with pytest.raises(SeedCorpusError, match="not in the manifest"):
        load_seed_pairs(measurements_path=path)


# ------------------------------------------------------------------------------------------ nvcc compile


def _nvcc_command(unit: Path) -> list[str]:
    """nvcc as torch's cpp_extension would call it for sm_90, against the installed torch's headers.

    The CPU wheel of torch lacks one generated CUDA header (c10/cuda/impl/cuda_cmake_macros.h); a one-line shim
    stands in for it. Host optimisation is off: this checks that the code compiles, not how fast it runs."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    shim = unit.parent / "shim"
    (shim / "c10/cuda/impl").mkdir(parents=True, exist_ok=True)
    (shim / "c10/cuda/impl/cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    includes = [f"-I{shim}"] + [f"-I{path}" for path in include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    return [
        shutil.which("nvcc") or "nvcc", "-c", str(unit), "-o", str(unit.with_suffix(".o")), "-arch=sm_90",
        "-std=c++20", *includes, "-DTORCH_EXTENSION_NAME=seed_check", "-DTORCH_API_INCLUDE_EXTENSION_H",
        "-D_GLIBCXX_USE_CXX11_ABI=1", "--expt-relaxed-constexpr", "-D__CUDA_NO_HALF_OPERATORS__",
        "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
        "-Xcompiler", "-fPIC", "-Xcompiler", "-O0", "-w",
    ]


@pytest.fixture(scope="module")
def nvcc_results(tmp_path_factory):
    """Compile every good candidate's source in one merged unit, and each no_compile candidate alone, two at a
    time. Returns {unit name: (returncode, output)}."""
    torch_include = Path(__import__("torch").__file__).parent / "include"
    if not (torch_include / "torch/extension.h").is_file():
        pytest.skip("the installed torch ships no C++ headers")
    workdir = tmp_path_factory.mktemp("nvcc")
    units = {"good": merged_cuda_unit({Path(s.directory).name: split_candidate(s.read("candidate.py")).source
                                       for s in GOOD_SPECS})}
    for spec in SPECS:
        if spec.intended_outcome == "no_compile":
            units[Path(spec.directory).name] = merged_cuda_unit(
                {Path(spec.directory).name: split_candidate(spec.read("candidate.py")).source}
            )

    def compile_unit(item):
        name, text = item
        unit = workdir / f"{name}.cu"
        unit.write_text(text)
        done = subprocess.run(_nvcc_command(unit), capture_output=True, text=True, env=dict(os.environ))
        return name, (done.returncode, done.stdout + done.stderr)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(compile_unit, units.items()))


@pytest.mark.nvcc
@pytest.mark.slow
def test_good_candidate_sources_compile_with_nvcc(nvcc_results):
    returncode, output = nvcc_results["good"]
    failing = sorted(set(re.findall(r'^"?(\d\d_[A-Za-z0-9_]+)"?\(\d+\): error', output, re.MULTILINE)))
    assert returncode == 0, f"nvcc failed for {failing or 'the merged unit'}:\n{output[-4000:]}"


@pytest.mark.nvcc
@pytest.mark.slow
def test_no_compile_candidate_fails_in_its_own_source(nvcc_results):
    bad = [Path(s.directory).name for s in SPECS if s.intended_outcome == "no_compile"]
    assert bad
    for name in bad:
        returncode, output = nvcc_results[name]
        assert returncode != 0
        # The error is in the candidate's own code (diagnostics carry its name), not in the toolchain or headers.
        assert re.search(rf"{re.escape(name)}\(\d+\): error", output), output[-3000:]



# ------------------------------------------------------------------------- GPU smoke check, CPU-side part


def test_gpu_check_answers_each_candidates_load_inline_from_the_merged_module():
    """check_on_gpu replaces every candidate's load_inline with functions of one merged build; exercise that
    wiring on CPU with stand-in functions so the one GPU run cannot fail on it."""
    import torch

    from dice_pipeline.seed_corpus import check_on_gpu
    from dice_pipeline.seed_corpus.layout import namespace_for

    parts = check_on_gpu.buildable_parts(SPECS)
    assert len(parts) == len(GOOD_SPECS)
    calls: list[str] = []
    merged = types.SimpleNamespace()
    for tag, candidate in parts.items():
        for function in candidate.functions:
            def stand_in(*args, _name=f"{tag}.{function}", **kwargs):
                calls.append(_name)
                return torch.zeros(1)
            setattr(merged, f"{namespace_for(tag)}__{function}", stand_in)
    for spec in GOOD_SPECS:
        tag = Path(spec.directory).name
        reference = _exec_module(spec.read("reference.py"), f"{tag}_reference")
        for name, small in spec.cpu_smoke_sizes.items():
            setattr(reference, name, small)
        proxies = []
        with check_on_gpu._answer_load_inline(merged, tag, parts[tag], proxies):
            candidate = _exec_module(spec.read("candidate.py"), f"{tag}_candidate")
        model = candidate.ModelNew(*reference.get_init_inputs())
        model(*reference.get_inputs())
        expected_calls = 0 if spec.intended_outcome == "pytorch_only" and "<<<" in parts[tag].source else 1
        assert sum(p.calls for p in proxies) == expected_calls, tag
    import torch.utils.cpp_extension as cpp_extension

    assert cpp_extension.load_inline.__module__ == "torch.utils.cpp_extension"  # restored afterwards
