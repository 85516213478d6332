"""Local source-code corpora for continued block-diffusion training (SDAR's conversion step), read from files
already on the machine: no hub, no download.

`read_code_corpus` reads files of the given suffixes under some folders, deduplicated, in a seeded order.
`kernel_code_roots` names the CUDA/C++ sources every GPU host of this project has: the CUDA toolkit's headers (CCCL's
CUB, Thrust and libcu++ among them) and PyTorch's hand-written C++/CUDA headers (ATen's kernels and their helpers).
Training a converted model on them before SFT teaches it the language of the kernel files it must write, where CuKe
alone is a few dozen files it learns by heart (benchmarks/RESULTS.md, 2026-12-06 decoding on the 245 s SFT checkpoint).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from collections.abc import Iterable
from pathlib import Path

PYTHON_SUFFIXES = (".py",)
KERNEL_CODE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".inl")


def read_code_corpus(roots: Iterable[Path], max_bytes: int, seed: int = 0, min_chars: int = 2000,
                     suffixes: Iterable[str] = PYTHON_SUFFIXES) -> list[str]:
    """Up to `max_bytes` of files with one of `suffixes` under `roots`, in a seeded random order; files under
    `min_chars` and files identical to one already read are skipped (so no held-out file is a copy of a trained
    one). A root that does not exist raises FileNotFoundError (a mistyped folder must not silently train on
    nothing)."""
    roots, suffixes = [Path(r).resolve() for r in roots], tuple(suffixes)  # a linked root is read too
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        raise FileNotFoundError(f"no such corpus folder: {', '.join(missing)}")
    files = sorted({path for root in roots for path in root.rglob("*")
                    if path.suffix in suffixes and path.is_file()})
    random.Random(seed).shuffle(files)
    texts, seen, total = [], set(), 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        digest = hashlib.sha1(text.encode()).hexdigest()
        if len(text) < min_chars or digest in seen:  # tiny files (__init__ stubs, forwarding headers) carry little
            continue
        seen.add(digest)
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def cuda_toolkit_root() -> Path | None:
    """The CUDA toolkit: the first of $CUDA_HOME, $CUDA_PATH, /usr/local/cuda and the folder above the `nvcc` on
    PATH whose include folder holds cuda_runtime.h (nvcc on PATH may be a wrapper outside the toolkit)."""
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
                  str(Path(nvcc).resolve().parent.parent) if nvcc else None]
    for candidate in candidates:
        if candidate and (Path(candidate) / "include" / "cuda_runtime.h").is_file():
            return Path(candidate).resolve()
    return None


# PyTorch's hand-written C++/CUDA: kernels and their helpers (not ATen/ops, thousands of generated declarations).
TORCH_KERNEL_FOLDERS = ("ATen/native", "ATen/cuda", "ATen/core", "c10/cuda", "c10/util", "c10/core")


def kernel_code_roots() -> list[Path]:
    """Folders of CUDA/C++ source on this machine: the CUDA toolkit's include folder (CCCL, cooperative groups,
    the fp16/bf16/fp8 intrinsics) and PyTorch's kernel folders (TORCH_KERNEL_FOLDERS), those that exist."""
    import torch

    roots = []
    toolkit = cuda_toolkit_root()
    if toolkit is not None:
        roots.append(toolkit / "include")
    torch_include = Path(torch.__file__).parent / "include"
    roots += [torch_include / folder for folder in TORCH_KERNEL_FOLDERS if (torch_include / folder).is_dir()]
    return roots
