"""Build cache keys, header trimming and the generated files of the load_inline interceptor."""

from __future__ import annotations

import pytest

from dice_pipeline.verify.build_cache import (
    CompiledOnlyExtension,
    ExtensionSources,
    binding_source,
    build_key,
    cuda_file_source,
    light_cuda_sources,
    trim_cuda_headers,
)

TOOLCHAIN = {"torch": "2.11.0", "cuda": "13.0", "arch": "9.0", "mode": "torch", "profile": "fast"}


def _sources(**overrides) -> ExtensionSources:
    args = dict(name="ext", cpp_sources="torch::Tensor f(torch::Tensor x);", cuda_sources="__global__ void k() {}",
                functions=["f"])
    args.update(overrides)
    return ExtensionSources.from_load_inline(**args)


def test_same_inputs_give_the_same_key():
    assert build_key(_sources(), TOOLCHAIN) == build_key(_sources(), dict(TOOLCHAIN))


@pytest.mark.parametrize("change", [
    {"cuda_sources": "__global__ void k2() {}"},
    {"extra_cuda_cflags": ["-O3"]},
    {"extra_cflags": ["-DX"]},
    {"functions": ["g"]},
    {"name": "other"},
])
def test_key_changes_with_any_source_or_flag(change):
    assert build_key(_sources(**change), TOOLCHAIN) != build_key(_sources(), TOOLCHAIN)


@pytest.mark.parametrize("field", ["torch", "cuda", "arch", "profile"])
def test_key_changes_with_the_toolchain(field):
    assert build_key(_sources(), {**TOOLCHAIN, field: "other"}) != build_key(_sources(), TOOLCHAIN)


def test_functions_given_as_string_list_or_dict_normalise_alike():
    as_str = _sources(functions="f").functions
    assert as_str == _sources(functions=["f"]).functions == _sources(functions={"f": "f"}).functions == {"f": "f"}


def test_trimming_replaces_extension_header_in_cuda_sources_only_when_present():
    trimmed = trim_cuda_headers(["#include <torch/extension.h>\n__global__ void k() {}", '#include "torch/extension.h"'])
    assert trimmed == ["#include <torch/types.h>\n__global__ void k() {}", "#include <torch/types.h>"]
    assert trim_cuda_headers(["#include <cuda_runtime.h>"]) is None


def test_binding_file_matches_load_inline_layout():
    text = binding_source(_sources(functions={"f": "doc"}))
    assert text.splitlines() == ["#include <torch/extension.h>", "torch::Tensor f(torch::Tensor x);",
                                 "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
                                 'm.def("f", torch::wrap_pybind_function(f), "doc");', "}"]
    bare = binding_source(_sources(no_implicit_headers=True, with_pytorch_error_handling=False))
    assert bare.splitlines()[0] == "torch::Tensor f(torch::Tensor x);" and 'm.def("f", f, "f");' in bare


def test_cuda_file_gets_load_inline_implicit_headers():
    assert cuda_file_source(["K"], False).splitlines() == [
        "#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>", "K"]
    assert cuda_file_source(["K"], True) == "K"


def test_compiled_only_extension_refuses_to_run():
    ext = CompiledOnlyExtension("ext", ["f"])
    with pytest.raises(RuntimeError, match="compiled only"):
        ext.f(1)


@pytest.mark.slow
def test_precompiled_header_is_built_once_and_used_by_the_binding_compile(tmp_path):
    import subprocess

    from dice_pipeline.verify.build_cache import BuildInterceptor

    interceptor = BuildInterceptor(tmp_path, mode="compile_only", profile="fast", arch="9.0")
    assert interceptor.ensure_precompiled_header([]) == []  # builds never wait for it
    flags = interceptor.ensure_precompiled_header([], wait=True)
    assert flags[0] == "-include" and (tmp_path / "pch").exists()
    assert interceptor.ensure_precompiled_header([]) == flags
    main_cpp = tmp_path / "main.cpp"
    main_cpp.write_text(binding_source(_sources()).replace("torch::Tensor f(torch::Tensor x);",
                                                           "torch::Tensor f(torch::Tensor x) { return x; }"))
    includes = [f for d in interceptor.torch_include_dirs() for f in ("-isystem", d)]
    result = subprocess.run(["c++", "-c", str(main_cpp), "-o", str(tmp_path / "main.o"), "-DTORCH_EXTENSION_NAME=ext",
                             "-DTORCH_API_INCLUDE_EXTENSION_H", *includes, "-fPIC", interceptor.torch_cxx_standard(),
                             "-Winvalid-pch", "-H", *flags], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    # With -H, g++ marks a used PCH with '!' and would list torch headers one by one if it parsed them instead.
    assert "! " in result.stderr and "torch/csrc/api/include/torch/all.h" not in result.stderr


def _torch_include_root():
    from dice_pipeline.verify.build_cache import BuildInterceptor

    return BuildInterceptor(".", mode="compile_only", profile="fast", arch=None).torch_include_dirs()[0]


KERNEL_FILE = """#include <torch/extension.h>
#include <cuda_fp16.h>
__global__ void scale(const float* x, float* y, int n) { int i = threadIdx.x; if (i < n) y[i] = 2.f * x[i]; }
torch::Tensor run(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be on the GPU");
    auto y = torch::empty_like(x);
    auto scratch = at::zeros({x.size(0)}, x.options().dtype(torch::kFloat32)) * 2 + 1;
    auto typed = x.data_ptr<float>();
    scale<<<1, 32>>>(typed, y.data_ptr<float>(), x.numel());
    return y;
}
"""


def test_light_sources_include_the_core_headers_and_the_operators_called_in_place_of_torch_types():
    from pathlib import Path

    root = Path(_torch_include_root())
    light = light_cuda_sources([KERNEL_FILE], False, root)
    prelude, body = light
    assert "#include <ATen/core/Tensor.h>" in prelude and "#include <ATen/Dispatch.h>" in prelude
    assert "#include <ATen/ops/empty_like.h>" in prelude and "#include <ATen/ops/zeros.h>" in prelude
    assert "constexpr auto kFloat32 = at::kFloat;" in prelude and "torch/types.h>" not in prelude.split("\n", 1)[1]
    # Tensor's operators, without every operator's header
    assert "#include <ATen/TensorOperators.h>" in prelude and "#define AT_PER_OPERATOR_HEADERS" in prelude
    # torch::Tensor, data_ptr<float> and TORCH_CHECK are not operators: no header is made up for them
    assert "ops/Tensor.h" not in prelude and "ops/data_ptr.h" not in prelude and "ops/TORCH_CHECK" not in prelude
    assert "torch/extension.h" not in body and "#include <cuda_fp16.h>" in body
    assert body.count("\n") == KERNEL_FILE.count("\n")  # the include line is emptied, not removed


def test_light_sources_are_not_tried_where_they_cannot_help():
    from pathlib import Path

    root = Path(_torch_include_root())
    assert light_cuda_sources([], False, root) is None
    assert light_cuda_sources(["#include <torch/torch.h>\n" + KERNEL_FILE], False, root) is None
    assert light_cuda_sources(["#include <ATen/ATen.h>\n__global__ void k() {}"], False, root) is None
    # no implicit header and none of its own: already light
    assert light_cuda_sources(["#include <cuda_runtime.h>\n__global__ void k() {}"], True, root) is None
    assert light_cuda_sources(['#include "torch/types.h"\n__global__ void k() {}'], True, root)[1] == \
        "\n__global__ void k() {}"
    # no torch include but load_inline's implicit torch/types.h: lightened
    assert light_cuda_sources(["__global__ void k() {}"], False, root) is not None


def test_fast_builds_try_light_then_trimmed_then_the_source_as_written(tmp_path):
    from dice_pipeline.verify.build_cache import BuildInterceptor

    sources = _sources(cuda_sources=KERNEL_FILE)
    fast = BuildInterceptor(tmp_path, mode="compile_only", profile="fast", arch=None)
    variants = fast._variants(sources)
    assert [name for name, _ in variants] == ["light", "trimmed", "full"]
    light = variants[0][1]
    assert light.no_implicit_headers and light.cpp_sources[0].startswith(
        "// dice-pipeline light prelude (in place of torch/extension.h)")
    assert light.cpp_sources[1:] == sources.cpp_sources and "PYBIND11_MODULE" in binding_source(light)
    assert light.cuda_sources[0].startswith("// dice-pipeline light prelude (in place of torch/types.h)")
    assert variants[1][1].cpp_sources == sources.cpp_sources  # trimmed and full: main.cpp as load_inline writes it
    assert variants[2][1] is sources
    assert [n for n, _ in BuildInterceptor(tmp_path, mode="compile_only", profile="fast", arch=None,
                                           light_cuda_headers=False)._variants(sources)] == ["trimmed", "full"]
    assert [n for n, _ in BuildInterceptor(tmp_path, mode="compile_only", profile="default",
                                           arch=None)._variants(sources)] == ["full"]
    own = _sources(cuda_sources=KERNEL_FILE, no_implicit_headers=True,
                   cpp_sources="#include <torch/extension.h>\ntorch::Tensor run(torch::Tensor x);")
    # its own include of torch/extension.h is emptied behind the light prelude
    assert fast._variants(own)[0][1].cpp_sources[1:] == ["\ntorch::Tensor run(torch::Tensor x);"]


def test_the_light_variant_lightens_each_half_where_it_can():
    from dice_pipeline.verify.build_cache import PCH_MARKER, BuildInterceptor, cuda_file_source

    fast = BuildInterceptor("/nonexistent", mode="compile_only", profile="fast", arch=None)
    # a C++-only extension: only main.cpp has anything to lighten
    cpp_only = _sources(cuda_sources=None)
    (name, light), *_ = fast._variants(cpp_only)
    assert name == "light" and light.cuda_sources == [] and "pybind.h>" in light.cpp_sources[0]
    # torch's namespace additions are left to torch/types.h where the PCH brought it in
    assert f"#ifndef {PCH_MARKER}" in light.cpp_sources[0]
    # a CUDA file with a heavier torch include keeps it, trimmed where it can be, load_inline's headers written out
    heavy = _sources(cuda_sources="#include <torch/extension.h>\n#include <ATen/ATen.h>\n__global__ void k() {}")
    light = fast._variants(heavy)[0][1]
    assert light.cuda_sources == [cuda_file_source([], False), "#include <torch/types.h>\n#include <ATen/ATen.h>\n"
                                  "__global__ void k() {}"]
    assert "pybind.h>" in light.cpp_sources[0]
    # a main.cpp with a heavier include of its own and a CUDA file with one: nothing to lighten
    neither = _sources(cpp_sources="#include <torch/torch.h>\ntorch::Tensor f(torch::Tensor x);",
                       cuda_sources="#include <ATen/ATen.h>\n__global__ void k() {}")
    assert [n for n, _ in fast._variants(neither)] == ["full"]


@pytest.mark.slow
def test_a_kernel_file_builds_light_and_one_calling_what_the_light_headers_lack_falls_back(tmp_path):
    """Real nvcc: the light variant compiles a usual kernel file, and a file calling a C++-frontend function the
    light headers do not declare (torch::nn::functional) fails light and builds trimmed: same status either way."""
    from dice_pipeline.verify.build_cache import BuildInterceptor

    interceptor = BuildInterceptor(tmp_path, mode="compile_only", profile="fast", arch="9.0",
                                   use_precompiled_header=False)
    interceptor.load_inline(name="light_ok", cpp_sources="torch::Tensor run(torch::Tensor x);",
                            cuda_sources=KERNEL_FILE, functions=["run"])
    frontend = KERNEL_FILE.replace("auto y = torch::empty_like(x);",
                                   "auto y = torch::empty_like(x); y = torch::autograd::Variable(y);")
    interceptor.load_inline(name="light_fails", cpp_sources="torch::Tensor run(torch::Tensor x);",
                            cuda_sources=frontend, functions=["run"])
    assert [(r.name, r.variant) for r in interceptor.records] == [("light_ok", "light"), ("light_fails", "trimmed")]
    # light_ok's main.cpp compiled from the light prelude; light_fails' light main.cpp did too, then its trimmed
    # attempt compiled main.cpp as written
    assert "light prelude" in (tmp_path / interceptor.records[0].key / "main_light.cpp").read_text()
    assert (tmp_path / interceptor.records[1].key / "main_trimmed.o").exists()


@pytest.mark.slow
def test_a_light_main_cpp_also_compiles_with_the_torch_extension_pch(tmp_path):
    """Real g++ with the PCH: the forced include brings torch/extension.h (and torch/types.h's namespace additions)
    before the light prelude, which must not define them twice."""
    from dice_pipeline.verify.build_cache import BuildInterceptor

    interceptor = BuildInterceptor(tmp_path, mode="compile_only", profile="fast", arch="9.0")
    assert interceptor.ensure_precompiled_header([], wait=True)
    interceptor.load_inline(name="light_pch", cpp_sources="torch::Tensor run(torch::Tensor x);\n"
                            "static const auto kind = torch::kFloat32;", cuda_sources=KERNEL_FILE, functions=["run"])
    assert [(r.name, r.variant) for r in interceptor.records] == [("light_pch", "light")]
