"""Candidates built together (batched_build): reading load_inline calls statically, which extensions may share a
build, the merged sources, and real group builds (g++ with CPU torch; nvcc compile-only through verify_batch)."""

from __future__ import annotations

import pytest
import torch
from verify_cases import HONEST, HONEST_KERNEL, REFERENCE, candidate

from dice_pipeline.verify import Status, VerifyConfig, VerifyJob, gpu_inventory, verify_batch
from dice_pipeline.verify.batched_build import (
    group_binding_source,
    group_signature,
    groupable,
    members_named,
    merged_unit,
    plan_build_groups,
    read_inline_extensions,
)
from dice_pipeline.verify.build_cache import BuildInterceptor, ExtensionCompileError, GroupMemberExtension

CPP_ONLY = '''
import torch
from torch.utils.cpp_extension import load_inline

header = "#include <torch/extension.h>\\n"
cpp_src = header + """
#define FACTOR FACTOR_VALUE
torch::Tensor scale(torch::Tensor x) { return x * FACTOR; }
"""
ext = load_inline(name="scale_ext", cpp_sources=cpp_src, functions=["scale"], verbose=True)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.scale(x)
'''


def cpp_only(factor: str) -> str:
    return CPP_ONLY.replace("FACTOR_VALUE", factor)


# --- reading load_inline calls -------------------------------------------------------------------------------------
def test_a_candidates_load_inline_arguments_are_read_without_running_it():
    [call] = read_inline_extensions(HONEST)
    assert call["name"] == "relu2_ext" and call["functions"] == ["relu2"]
    assert call["cpp_sources"] == "torch::Tensor relu2(torch::Tensor x);"
    assert "relu2_kernel" in call["cuda_sources"] and call["extra_cuda_cflags"] == ["-DSCALE=2.0f"]
    assert "verbose" not in call  # arguments that do not change the build are left out
    [joined] = read_inline_extensions(cpp_only("3"))  # a name bound to a sum of strings resolves
    assert joined["cpp_sources"].startswith("#include <torch/extension.h>\n\n#define FACTOR 3")


@pytest.mark.parametrize("change", [
    ('name="relu2_ext"', 'name=f"relu2_{1}"'),  # computed
    ('functions=["relu2"]', "**{'functions': ['relu2']}"),  # unpacked
    ("cpp_src = ", "cpp_src = str(1) + "),  # not a constant
    ("relu2_ext = load_inline(", "cpp_src = cpp_src + ' '\nrelu2_ext = load_inline("),  # bound twice
])
def test_a_call_that_cannot_be_read_statically_leaves_the_candidate_to_build_alone(change):
    assert read_inline_extensions(HONEST.replace(*change)) is None


def test_no_load_inline_or_no_python_is_not_read():
    assert read_inline_extensions("import torch\n") is None
    assert read_inline_extensions("def broken(:\n") is None


@pytest.mark.parametrize("cuda_source, ok", [
    (HONEST_KERNEL, True),
    (HONEST_KERNEL + "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}", False),
    (HONEST_KERNEL + "\n}  // closes the namespace it would be put in\nnamespace other {", False),
    (HONEST_KERNEL.replace("__global__", 'extern "C" __global__'), False),
    ('#line 1 "dice_member_0"\n' + HONEST_KERNEL, False),
    ("#ifdef USE_HALF\n#include <cuda_fp16.h>\n#endif\n" + HONEST_KERNEL, False),
    ('// a "}" in a comment and a string "}" do not count\n' + HONEST_KERNEL + '\nconst char* s = "}";', True),
])
def test_only_code_that_stays_inside_its_namespace_is_grouped(cuda_source, ok):
    [call] = read_inline_extensions(candidate(cuda_source=cuda_source))
    assert groupable(call) is ok


def test_own_bindings_or_a_library_without_python_module_are_not_grouped():
    [call] = read_inline_extensions(HONEST)
    assert not groupable({**call, "functions": None}) and not groupable({**call, "is_python_module": False})
    assert not groupable({**call, "no_implicit_headers": True})


# --- planning groups -----------------------------------------------------------------------------------------------
def test_identical_extensions_are_planned_once_and_shared_by_their_candidates():
    same = [candidate(forward=f"return relu2_ext.relu2(x) * {n}") for n in range(5)]
    other = candidate(cuda_source=HONEST_KERNEL.replace("256", "128"))
    [group] = plan_build_groups(list(enumerate([*same, other])), size=8)
    assert group.indices == [0, 1, 2, 3, 4, 5]
    assert len(group.extensions) == 2  # one build for the five identical extensions, one for the other
    assert {group.members[i][0] for i in range(5)} == {0} and group.members[5] == [1]


def test_groups_hold_same_flag_same_include_extensions_up_to_the_size():
    twins = [candidate(cuda_source=HONEST_KERNEL.replace("256", str(n))) for n in (128, 256, 512)]
    other_flags = candidate(scale="3.0f")
    other_includes = candidate(cuda_source="#include <cuda_fp16.h>\n" + HONEST_KERNEL)
    unreadable = HONEST.replace('name="relu2_ext"', 'name=f"relu2_{1}"')
    sources = [*twins, other_flags, other_includes, unreadable, candidate(scale="3.0f", forward="return x")]
    groups = plan_build_groups(list(enumerate(sources)), size=2)
    assert sorted(g.indices for g in groups) == [[0, 1], [3, 6]]  # index 2 would be a group of one: alone
    # 3 and 6 differ only in Python: their extension is the same bytes, built once and shared by both.
    assert [g.members for g in sorted(groups, key=lambda g: g.indices)] == [{0: [0], 1: [1]}, {3: [0], 6: [0]}]
    assert [len(g.extensions) for g in sorted(groups, key=lambda g: g.indices)] == [2, 1]
    assert plan_build_groups(list(enumerate(sources)), size=1) == []
    assert group_signature(read_inline_extensions(twins[0])[0]) != group_signature(
        read_inline_extensions(other_includes)[0])


# --- merged sources ------------------------------------------------------------------------------------------------
def test_merged_unit_hoists_includes_namespaces_code_and_undefines_its_macros():
    unit = merged_unit([("dice_member_0", "dice_member_0", "#include <a.h>\n#define K 1\nint f() { return K; }"),
                        ("dice_member_1", "dice_member_1", "#include <a.h>\n#include <b.h>\nint f() { return 2; }")])
    lines = unit.splitlines()
    assert lines[:2] == ["#include <a.h>", "#include <b.h>"]
    assert 'namespace dice_member_0 {\n#line 1 "dice_member_0"\n\n#define K 1' in unit
    assert unit.index("#undef K") < unit.index("namespace dice_member_1")


def test_group_bindings_export_every_function_under_its_members_namespace():
    text = group_binding_source([(0, {"f": "doc"}, "torch::Tensor f(torch::Tensor x);", True),
                                 (3, {"f": "f"}, "torch::Tensor f(torch::Tensor x);", False)])
    assert 'm.def("dice_member_0___f", torch::wrap_pybind_function(dice_member_0_::f), "doc");' in text
    assert 'm.def("dice_member_3___f", dice_member_3_::f, "f");' in text
    assert 'namespace dice_member_3_ {\n#line 1 "dice_member_3_"' in text


def test_compiler_and_loader_messages_name_their_members():
    log = ('dice_member_2_(14): error: identifier "undefined_name" is undefined\n'
           "dice_member_10_:3:5: error: expected ';'\nundefined symbol: _ZN14dice_member_7_1fEN2at6TensorE\n"
           "dice_member_5 without its closing underscore is not a member's name")
    assert members_named(log) == {2, 10, 7}


# --- real group builds ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_group_builds_once_drops_the_member_that_breaks_it_and_answers_each_load_inline(tmp_path):
    # g++ with the CPU torch: the same code path as on a GPU host, without CUDA sources.
    interceptor = BuildInterceptor(tmp_path / "cache", mode="torch", profile="fast", arch=None,
                                   use_precompiled_header=False)
    sources = [cpp_only("2"), cpp_only("3"), cpp_only("undefined_name")]
    calls = [read_inline_extensions(s)[0] for s in sources]
    report = interceptor.build_group(calls)
    assert report["grouped"] == [0, 1] and report["left_to_build_alone"] == [2], report
    assert [a["built"] for a in report["attempts"]] == [False, True] and report["attempts"][0]["named_in_errors"] == [2]
    x = torch.arange(4.0)
    for call, factor in zip(calls[:2], (2, 3)):
        ext = interceptor.load_inline(**call, verbose=True)  # the candidate's own call, at run time
        assert isinstance(ext, GroupMemberExtension) and torch.equal(ext.scale(x), x * factor)
        assert interceptor.records[-1].cache_hit and interceptor.records[-1].variant == "batched"
    with pytest.raises(ExtensionCompileError) as failure:  # alone, with its own error
        interceptor.load_inline(**calls[2])
    assert "undefined_name" in failure.value.log and "dice_member" not in failure.value.log
    assert interceptor.build_group(calls)["already_built"] == 2  # nothing is built twice


@pytest.mark.skipif(bool(gpu_inventory()), reason="checks the compile-only path of a host without a GPU")
@pytest.mark.nvcc
@pytest.mark.slow
def test_verify_batch_builds_candidates_in_groups_with_nvcc(tmp_path):
    twin = candidate(cuda_source=HONEST_KERNEL.replace("256", "128"))
    config = VerifyConfig(build_cache_dir=str(tmp_path / "cache"), compile_timeout_s=900, execute=False,
                          use_precompiled_header=False, max_parallel_builds=2, build_batch_size=4,
                          verdict_store_dir=None)
    verdicts = verify_batch([VerifyJob("a", REFERENCE, HONEST), VerifyJob("b", REFERENCE, twin)], config)
    for verdict in verdicts:
        assert verdict.status == Status.NOT_EXECUTED, verdict.to_json()
        assert verdict.provenance["builds"][0]["variant"] == "batched"
        group = verdict.provenance["build_group"]
        assert group["candidates"] == 2 and group["grouped"] == [0, 1] and group["attempts"][0]["built"]
        # built now, in its group: a cold build with its share of the group's compile time, not a cache hit
        assert not verdict.build_cache_hit and verdict.compile_seconds == pytest.approx(
            group["attempts"][0]["seconds"] / 2, abs=1e-3)
    assert [v.provenance["build_group"]["members"] for v in verdicts] == [[0], [1]]


def test_an_interceptor_told_to_find_every_build_cached_refuses_to_build(tmp_path):
    from dice_pipeline.verify.build_cache import BuildInterceptor, BuildNotCached, ExtensionSources, build_key

    interceptor = BuildInterceptor(tmp_path, mode="compile_only", profile="fast", arch="9.0",
                                   use_precompiled_header=False)
    interceptor.cached_only = True
    kwargs = {"name": "ext", "cpp_sources": "torch::Tensor f(torch::Tensor x);", "cuda_sources": HONEST_KERNEL,
              "functions": ["f"]}
    with pytest.raises(BuildNotCached):
        interceptor.load_inline(**kwargs)
    assert interceptor.missed_cache == ["ext"] and not any(tmp_path.iterdir())  # nothing compiled or created
    key = build_key(ExtensionSources.from_load_inline(**kwargs), interceptor.toolchain())
    (tmp_path / key).mkdir()
    (tmp_path / key / "COMPILE_OK.json").write_text('{"variant": "light"}')  # as its group build leaves it
    module = interceptor.load_inline(**kwargs)
    assert interceptor.records[-1].cache_hit and callable(module.f)
    assert interceptor.missed_cache == ["ext"]


def test_the_run_stage_of_a_skipped_member_reports_an_uncached_build_whatever_the_candidate_did(tmp_path, monkeypatch):
    """worker.main with builds_expected_cached: the interceptor finds cached builds only, and a miss, even one the
    candidate caught, turns the run stage's result into needs_build (the parent then runs the build stage)."""
    import json

    from dice_pipeline.verify import worker
    from dice_pipeline.verify.build_cache import BuildNotCached

    def candidate_that_swallows_the_miss(request, interceptor, scratch, share=None, cuda_started_before_go=None,
                                         dispatcher=None):
        try:
            interceptor.load_inline(name="late_ext", cpp_sources="int f();", functions=["f"])
        except BuildNotCached:
            pass  # e.g. a try/except fallback around load_inline in the candidate's module
        return {"status": "correct", "reasons": [], "flags": []}

    monkeypatch.setattr(worker, "run_judge_stage", candidate_that_swallows_the_miss)
    monkeypatch.chdir(tmp_path)
    request = {"stage": "run", "cache_dir": str(tmp_path / "cache"), "build_profile": "fast", "arch": "9.0",
               "config": VerifyConfig(use_precompiled_header=False).to_dict(), "builds_expected_cached": True,
               "result_path": str(tmp_path / "result.json")}
    (tmp_path / "request.json").write_text(json.dumps(request))
    assert worker.main([str(tmp_path / "request.json")]) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "needs_build" and result["missed_cache"] == ["late_ext"]
    request["builds_expected_cached"] = False  # a member that ran its own build stage: the judgement stands
    (tmp_path / "request.json").write_text(json.dumps(request))
    monkeypatch.setattr(worker, "run_judge_stage", lambda *a, **k: {"status": "correct", "reasons": [], "flags": []})
    assert worker.main([str(tmp_path / "request.json")]) == 0
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "correct"
