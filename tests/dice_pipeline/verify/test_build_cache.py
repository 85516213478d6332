"""Build cache keys, header trimming and the generated files of the load_inline interceptor."""

from __future__ import annotations

import pytest

from dice_pipeline.verify.build_cache import (
    CompiledOnlyExtension,
    ExtensionSources,
    binding_source,
    build_key,
    cuda_file_source,
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
