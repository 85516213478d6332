"""Local code corpora for the conversion step: which files are read, in what order, and where the CUDA/C++ ones are."""

from __future__ import annotations

from pathlib import Path

import pytest

from training import corpus
from training.corpus import KERNEL_CODE_SUFFIXES, cuda_toolkit_root, kernel_code_roots, read_code_corpus


def _tree(root: Path) -> Path:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "kernel.cuh").write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n" * 40)
    (root / "a" / "b" / "ops.cu").write_text("template <typename T> __device__ T twice(T v) { return v + v; }\n" * 40)
    (root / "a" / "b" / "copy.cuh").write_text((root / "a" / "kernel.cuh").read_text())  # a duplicate
    (root / "a" / "tiny.h").write_text("#pragma once\n")  # under min_chars
    (root / "a" / "helper.py").write_text("def f(x):\n    return x * 2\n" * 80)
    return root


def test_only_the_asked_suffixes_are_read_once_each_and_small_files_are_skipped(tmp_path):
    root = _tree(tmp_path)
    texts = read_code_corpus([root], 2**20, min_chars=200, suffixes=KERNEL_CODE_SUFFIXES)
    assert len(texts) == 2 and any("__global__" in t for t in texts) and any("__device__" in t for t in texts)
    python = read_code_corpus([root], 2**20, min_chars=200)  # the default: .py files
    assert len(python) == 1 and python[0].startswith("def f")


def test_the_order_is_seeded_and_the_byte_budget_stops_reading(tmp_path):
    root = tmp_path / "many"
    root.mkdir()
    for i in range(20):
        (root / f"k{i}.cuh").write_text(f"// file {i:02d}\n" + "__global__ void k() {}\n" * 50)
    first = read_code_corpus([root], 2**20, seed=1, min_chars=10, suffixes=(".cuh",))
    assert first == read_code_corpus([root], 2**20, seed=1, min_chars=10, suffixes=(".cuh",))
    assert first != read_code_corpus([root], 2**20, seed=2, min_chars=10, suffixes=(".cuh",))
    budget = 3 * len(first[0])
    assert len(read_code_corpus([root], budget, seed=1, min_chars=10, suffixes=(".cuh",))) == 3


def test_a_missing_folder_is_an_error_not_an_empty_corpus(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such corpus folder"):
        read_code_corpus([tmp_path / "nope"], 2**20)


def test_the_toolkit_is_where_cuda_runtime_h_is(tmp_path, monkeypatch):
    fake = tmp_path / "cuda"
    (fake / "include").mkdir(parents=True)
    monkeypatch.setenv("CUDA_HOME", str(fake))
    assert cuda_toolkit_root() != fake  # no cuda_runtime.h: not a toolkit
    (fake / "include" / "cuda_runtime.h").write_text("// runtime\n")
    assert cuda_toolkit_root() == fake.resolve()
    assert kernel_code_roots()[0] == fake.resolve() / "include"


def test_the_default_roots_are_pytorchs_kernel_folders_and_the_toolkits_headers():
    import torch

    roots = kernel_code_roots()
    torch_include = Path(torch.__file__).parent / "include"
    assert torch_include / "ATen" / "native" in roots and torch_include / "c10" / "util" in roots
    assert not any(root.name == "ops" for root in roots)  # ATen/ops: generated declarations
    assert set(corpus.TORCH_KERNEL_FOLDERS) >= {"ATen/native", "ATen/cuda"}
    if cuda_toolkit_root() is not None:  # nvcc 13 on the project's machines
        assert (roots[0] / "cuda_runtime.h").is_file()
    texts = read_code_corpus(roots, 2 * 2**20, min_chars=1000, suffixes=KERNEL_CODE_SUFFIXES)
    assert texts and sum(map(len, texts)) >= 2 * 2**20
