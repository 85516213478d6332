"""Build a candidate's CUDA extension fast and once: intercepts `torch.utils.cpp_extension.load_inline`/`load`
inside the worker, keys each build by a content hash (sources, flags, torch/CUDA versions, arch, recipe), builds for
the local arch only, compiles CUDA sources and the C++ binding file with lighter torch headers than they ask for
(ATen's core and the operators they call, plus pybind11 and torch's Tensor casters for the binding; else
`torch/types.h` for `torch/extension.h` in the CUDA file; else the sources as written) and precompiles
`torch/extension.h` for the binding file.

Two modes: "torch" builds and loads the extension through torch's own cpp_extension (GPU host, CUDA torch);
"compile_only" runs g++/nvcc -c directly on the same generated files with the installed torch's headers (a CPU
torch wheel ships ATen/cuda and c10/cuda headers but refuses CUDA sources), so a machine with nvcc and no GPU can
reject candidates that do not compile. Module level is standard library only; torch is imported inside the worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import subprocess
import sysconfig
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from dice_pipeline.verify.build_environment import cuda_home, library_header_dirs

# Bump when the generated files or flags change: old cache entries must not be reused.
BUILD_RECIPE_VERSION = "1"
FULL_HEADER_INCLUDE = re.compile(r'#\s*include\s*[<"]torch/extension\.h[>"]')
# torch/types.h is what load_inline itself puts first in every CUDA file; extension.h adds pybind11 and the whole
# C++ frontend on top (about half the preprocessing time), which a .cu file never needs since the bindings live
# in main.cpp.
TRIMMED_HEADER_INCLUDE = "#include <torch/types.h>"
PCH_HEADER_NAME = "dice_torch_extension_pch.h"
# Defined by that header: a main.cpp compiled with the PCH has all of torch/extension.h already.
PCH_MARKER = "DICE_TORCH_EXTENSION_PCH"
PCH_HEADER_TEXT = f"#define {PCH_MARKER} 1\n#include <torch/extension.h>\n"
# The "light" variant goes further: torch/types.h pulls in all of ATen's operators and the autograd frontend (about
# 35 s of nvcc front-end work for an otherwise empty CUDA file on the 2-core dev machine), while a kernel file's host
# code needs the Tensor class, TORCH_CHECK, the dispatch macros and the few at::/torch:: functions it calls (about
# 17 s with their per-operator headers). Where a source includes some other torch header, ATen/ATen.h or
# ATen/Functions.h, lightening gains nothing (and could collide with torch/types.h), so it is not tried.
LIGHTENED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]torch/(?:extension|types)\.h[>"][^\n]*$', re.M)
HEAVY_INCLUDE = re.compile(r'#[ \t]*include[ \t]*[<"](?:torch/(?!extension\.h|types\.h)|ATen/ATen\.h|ATen/Functions\.h)')
# A call of an ATen function, qualified as torch:: or at:: (optionally with template arguments).
OP_CALL = re.compile(r'\b(?:torch|at)::(\w+)\s*(?:<[^<>;(){}]*>\s*)?\(')
# Tensor's arithmetic and comparison operators (x * 2, a + b) with only the one operator header they need: without
# AT_PER_OPERATOR_HEADERS, ATen/TensorOperators.h would pull in every operator (ATen/Functions.h).
_TENSOR_OPERATORS = """#ifndef AT_PER_OPERATOR_HEADERS
#define AT_PER_OPERATOR_HEADERS
#define DICE_PER_OPERATOR_HEADERS_SET
#endif
#include <ATen/TensorOperators.h>
#ifdef DICE_PER_OPERATOR_HEADERS_SET
#undef AT_PER_OPERATOR_HEADERS
#undef DICE_PER_OPERATOR_HEADERS_SET
#endif"""
# What torch/types.h adds to namespace torch on top of ATen (torch 2.x), so torch:: spellings keep working.
_TORCH_NAMESPACE = """namespace torch {
using namespace at;  // NOLINT
using std::nullopt;
using std::optional;
using Dtype = at::ScalarType;
constexpr auto kUInt8 = at::kByte;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kFloat64 = at::kDouble;
constexpr auto kU8 = kUInt8;
constexpr auto kI8 = kInt8;
constexpr auto kI16 = kInt16;
constexpr auto kI32 = kInt32;
constexpr auto kI64 = kInt64;
constexpr auto kF16 = kFloat16;
constexpr auto kF32 = kFloat32;
constexpr auto kF64 = kFloat64;
}  // namespace torch
"""


class ExtensionCompileError(RuntimeError):
    """The candidate's extension did not build; `log` holds the compiler output."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.log = log


class BuildNotCached(RuntimeError):
    """A run stage that was told every extension of its candidate is cached (its group built them, so its own build
    stage was skipped) met one that is not: the parent runs the build stage and judges the candidate again."""


@dataclass
class ExtensionSources:
    """Arguments of one `load_inline` call, normalised (lists, dict of functions)."""

    name: str
    cpp_sources: list[str]
    cuda_sources: list[str] = field(default_factory=list)
    functions: dict[str, str] | None = None
    extra_cflags: list[str] = field(default_factory=list)
    extra_cuda_cflags: list[str] = field(default_factory=list)
    extra_ldflags: list[str] = field(default_factory=list)
    extra_include_paths: list[str] = field(default_factory=list)
    with_pytorch_error_handling: bool = True
    no_implicit_headers: bool = False
    is_python_module: bool = True

    @classmethod
    def from_load_inline(cls, name: str, cpp_sources: Any, cuda_sources: Any = None, functions: Any = None,
                         extra_cflags: Any = None, extra_cuda_cflags: Any = None, extra_ldflags: Any = None,
                         extra_include_paths: Any = None, with_pytorch_error_handling: bool = True,
                         no_implicit_headers: bool = False, is_python_module: bool = True, **_ignored: Any) -> ExtensionSources:
        def as_list(value: Any) -> list[str]:
            if value is None:
                return []
            return [value] if isinstance(value, str) else [str(v) for v in value]

        if isinstance(functions, str):
            functions = [functions]
        if isinstance(functions, (list, tuple)):
            functions = {f: f for f in functions}
        return cls(
            name=str(name), cpp_sources=as_list(cpp_sources), cuda_sources=as_list(cuda_sources),
            functions=dict(functions) if functions is not None else None, extra_cflags=as_list(extra_cflags),
            extra_cuda_cflags=as_list(extra_cuda_cflags), extra_ldflags=as_list(extra_ldflags),
            extra_include_paths=as_list(extra_include_paths),
            with_pytorch_error_handling=bool(with_pytorch_error_handling),
            no_implicit_headers=bool(no_implicit_headers), is_python_module=bool(is_python_module),
        )


def build_key(sources: ExtensionSources, toolchain: dict[str, str]) -> str:
    """Content hash of everything that changes the built binary (the extension's name is part of the symbol)."""
    payload = json.dumps({"sources": asdict(sources), "toolchain": toolchain, "recipe": BUILD_RECIPE_VERSION},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def trim_cuda_headers(cuda_sources: list[str]) -> list[str] | None:
    """CUDA sources with `torch/extension.h` replaced by `torch/types.h`, or None when there is nothing to trim."""
    trimmed = [FULL_HEADER_INCLUDE.sub(TRIMMED_HEADER_INCLUDE, s) for s in cuda_sources]
    return trimmed if trimmed != cuda_sources else None


def _lightened(sources: list[str], no_implicit_headers: bool, include_root: Path, what: str,
               headers: tuple[str, ...]) -> list[str] | None:
    """`sources` behind a prelude of `headers`, the per-operator headers of the at::/torch:: functions they call
    (those torch ships) and torch's namespace additions, with their torch/extension.h and torch/types.h lines emptied
    (line numbers kept). None where lightening cannot help: no source, a heavier torch include, or nothing heavy
    included at all (no implicit header and none of their own)."""
    text = "\n".join(sources)
    if not sources or HEAVY_INCLUDE.search(text):
        return None
    if no_implicit_headers and not LIGHTENED_INCLUDE.search(text):
        return None
    ops = sorted({name for name in OP_CALL.findall(text) if (include_root / "ATen" / "ops" / f"{name}.h").is_file()})
    prelude = "\n".join([f"// dice-pipeline light prelude (in place of {what})",
                         *(f"#include <{header}>" for header in headers), _TENSOR_OPERATORS,
                         *(f"#include <ATen/ops/{name}.h>" for name in ops), _TORCH_NAMESPACE])
    return [prelude] + [LIGHTENED_INCLUDE.sub("", source) for source in sources]


def light_cuda_sources(cuda_sources: list[str], no_implicit_headers: bool, include_root: Path) -> list[str] | None:
    """The "light" CUDA sources: ATen's core headers, the dispatch macros and the operators called in place of
    torch/types.h (see _lightened)."""
    return _lightened(cuda_sources, no_implicit_headers, include_root, "torch/types.h",
                      ("cuda.h", "cuda_runtime.h", "optional", "ATen/core/Tensor.h", "ATen/Dispatch.h"))


def light_binding_sources(cpp_sources: list[str], no_implicit_headers: bool, include_root: Path) -> list[str] | None:
    """The "light" C++ sources of main.cpp: pybind11 with torch's Tensor casters, the error-handling wrapper
    load_inline's bindings use, ATen's core and the operators called in place of torch/extension.h (about 24 s of
    g++ for an otherwise empty file on the 2-core dev machine; this prelude about 8 s). Where torch/extension.h's
    PCH exists, its forced include brings the whole header anyway (and torch's namespace additions, which the
    prelude then leaves out) and this prelude costs nothing."""
    light = _lightened(cpp_sources, no_implicit_headers, include_root, "torch/extension.h",
                       ("torch/csrc/utils/pybind.h", "torch/csrc/Exceptions.h", "ATen/core/Tensor.h",
                        "ATen/Dispatch.h"))
    if light is not None:
        light[0] = light[0].replace(_TORCH_NAMESPACE, f"#ifndef {PCH_MARKER}\n{_TORCH_NAMESPACE}#endif\n")
    return light


def binding_source(sources: ExtensionSources) -> str:
    """main.cpp exactly as load_inline writes it: implicit header, the C++ sources, pybind11 bindings."""
    lines = ([] if sources.no_implicit_headers else ["#include <torch/extension.h>"]) + list(sources.cpp_sources)
    if sources.functions is not None:
        lines.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
        for fn, doc in sources.functions.items():
            target = f"torch::wrap_pybind_function({fn})" if sources.with_pytorch_error_handling else fn
            lines.append(f'm.def("{fn}", {target}, "{doc}");')
        lines.append("}")
    return "\n".join(lines)


def cuda_file_source(cuda_sources: list[str], no_implicit_headers: bool) -> str:
    """cuda.cu exactly as load_inline writes it."""
    implicit = [] if no_implicit_headers else ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
    return "\n".join(implicit + list(cuda_sources))


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock; concurrent builders of the same key wait here instead of racing torch's baton."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _safe_identifier(name: str) -> str:
    cleaned = re.sub(r"\W", "_", name) or "ext"
    return cleaned if not cleaned[0].isdigit() else "_" + cleaned


def _run_compile_commands(commands: list[list[str]], cwd: Path) -> list[tuple[list[str], str]]:
    """Run compiler commands side by side; return (command, output) of each one that failed."""
    procs = [(cmd, subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
             for cmd in commands]
    failures = []
    for cmd, proc in procs:
        output, _ = proc.communicate()
        if proc.returncode != 0:
            failures.append((cmd, f"$ {shlex.join(cmd)}\n{output}"))
    return failures


class CompiledOnlyExtension:
    """What `load_inline` returns in compile-only mode: the sources compiled, but nothing is loadable here."""

    def __init__(self, name: str, functions: list[str]):
        self._name = name
        self._functions = functions

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)

        def not_loadable(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError(f"extension {self._name!r} was compiled only (no CUDA torch here); {attr} cannot run")

        return not_loadable


class GroupMemberExtension:
    """What `load_inline` returns for an extension built in a group (batched_build): the group's library, seen
    through this extension's own function names."""

    def __init__(self, name: str, group: Any, namespace: str, functions: list[str]):
        self.__name__ = name
        self.__file__ = getattr(group, "__file__", None)
        self._group_namespace = namespace
        for function in functions:
            setattr(self, function, getattr(group, f"{namespace}__{function}"))

    def __repr__(self) -> str:
        return f"<extension {self.__name__!r}, built in a group as {self._group_namespace}>"


@dataclass
class BuildRecord:
    """One extension build as seen by the interceptor (goes into the verdict)."""

    name: str
    key: str
    cache_hit: bool
    seconds: float
    variant: str = ""
    cuda_sources: list[str] = field(default_factory=list)
    error: str = ""


class BuildInterceptor:
    """Replaces cpp_extension.load_inline/load for the candidate module executed in this (worker) process."""

    def __init__(self, cache_dir: str | Path, *, mode: str, profile: str, arch: str | None,
                 use_precompiled_header: bool = True, light_cuda_headers: bool = True):
        if mode not in ("torch", "compile_only"):
            raise ValueError(f"unknown build mode {mode!r}")
        self.cache_dir = Path(cache_dir)
        self.mode = mode
        self.profile = profile
        self.arch = arch
        self.use_precompiled_header = use_precompiled_header
        self.light_cuda_headers = light_cuda_headers
        self.records: list[BuildRecord] = []
        self._original_load_inline: Callable[..., Any] | None = None
        self._original_load: Callable[..., Any] | None = None
        # Cached builds only (a run stage whose build stage was skipped): a miss raises BuildNotCached and is
        # remembered in `missed_cache` (a candidate that catches the exception cannot hide it).
        self.cached_only = False
        self.missed_cache: list[str] = []
        self._library_include_dirs: list[str] | None = None

    # --- toolchain facts -------------------------------------------------------------------------------------
    def toolchain(self) -> dict[str, str]:
        import torch

        toolchain = {"torch": torch.__version__, "cuda": str(torch.version.cuda), "arch": self.arch or "",
                     "mode": self.mode, "profile": self.profile, "python": sysconfig.get_python_version(),
                     "cxx": os.environ.get("CXX", "c++")}
        if self.library_include_dirs():  # headers from other folders than the toolkit's: another build
            toolchain["library_headers"] = ",".join(self.library_include_dirs())
        return toolchain

    def library_include_dirs(self) -> list[str]:
        """The nvidia-* wheels' include folders for the library headers this host's toolkit lacks (empty where it
        has them, as on a GPU host with a full toolkit): a CPU host builds what a GPU host builds."""
        if self._library_include_dirs is None:
            self._library_include_dirs = library_header_dirs(self.toolkit_include())
        return self._library_include_dirs

    def toolkit_include(self) -> Path:
        """The toolkit's include folder the build uses: torch's CUDA_HOME in torch mode, else cuda_home()."""
        if self.mode == "torch":
            from torch.utils import cpp_extension

            if cpp_extension.CUDA_HOME:
                return Path(cpp_extension.CUDA_HOME) / "include"
        return cuda_home() / "include"

    def torch_include_dirs(self) -> list[str]:
        import torch

        root = Path(torch.__file__).parent / "include"
        dirs = [str(root), str(root / "torch" / "csrc" / "api" / "include")]
        dirs.append(str(cuda_home() / "include"))
        dirs.append(sysconfig.get_path("include"))
        return dirs

    def cpu_wheel_shim_dirs(self) -> list[str]:
        """The CPU wheel omits one CMake-generated CUDA header that c10/cuda headers include; supply it (its
        content in CUDA builds is exactly this define) so compile-only builds can include c10/cuda and ATen/cuda."""
        if (Path(self.torch_include_dirs()[0]) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists():
            return []
        shim = self.cache_dir / "cpu_wheel_shim"
        header = shim / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
        if not header.exists():
            header.parent.mkdir(parents=True, exist_ok=True)
            tmp = header.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
            tmp.replace(header)
        return [str(shim)]

    @staticmethod
    def torch_cxx_standard() -> str:
        """The -std torch passes to the C++ compiler (c++17 on older torch, c++20 on newer)."""
        from torch.utils import cpp_extension

        source = Path(cpp_extension.__file__).read_text()
        match = re.search(r"'-fPIC', '-std=(c\+\+\d+)'", source)
        return f"-std={match.group(1)}" if match else "-std=c++17"

    def arch_flags(self) -> list[str]:
        if not self.arch:
            return []
        code = self.arch.replace(".", "")
        return [f"-gencode=arch=compute_{code},code=sm_{code}"]

    # --- precompiled torch/extension.h ---------------------------------------------------------------------------
    def ensure_precompiled_header(self, extra_cflags: list[str], *, wait: bool = False) -> list[str]:
        """Flags that make g++ use a PCH of torch/extension.h built with these exact flags, or none.

        Builds never wait for the PCH (`wait=False`): main.cpp compiles beside the CUDA file, which takes longer,
        so the PCH saves CPU time under parallel load, not latency. verify_batch builds it once up front
        (`wait=True`, the "pch" worker stage) while the first candidates build without it."""
        if self.profile != "fast" or not self.use_precompiled_header:
            return []
        base_flags = ["-DTORCH_API_INCLUDE_EXTENSION_H", *[f for d in self.torch_include_dirs() for f in ("-isystem", d)],
                      "-fPIC", self.torch_cxx_standard(), *extra_cflags]
        compiler = os.environ.get("CXX", "c++")
        digest = hashlib.sha256(json.dumps([compiler, base_flags, self.toolchain(), PCH_HEADER_TEXT]).encode()
                                ).hexdigest()[:16]
        pch_dir = self.cache_dir / "pch" / digest
        header = pch_dir / PCH_HEADER_NAME
        gch = pch_dir / (PCH_HEADER_NAME + ".gch")
        if gch.exists():
            return ["-include", str(header)]
        if not wait:
            return []
        with file_lock(pch_dir / ".lock"):
            if not gch.exists():
                header.write_text(PCH_HEADER_TEXT)
                tmp = pch_dir / f"{gch.name}.{os.getpid()}.tmp"
                cmd = [compiler, "-x", "c++-header", str(header), "-o", str(tmp), *base_flags]
                result = subprocess.run(cmd, capture_output=True, text=True)
                if result.returncode != 0:
                    return []  # no PCH: the build still works, only slower
                tmp.replace(gch)
        return ["-include", str(header)]

    # --- the interception ----------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.utils import cpp_extension

        self._original_load_inline = cpp_extension.load_inline
        self._original_load = cpp_extension.load
        cpp_extension.load_inline = self.load_inline
        cpp_extension.load = self.load

    def load_inline(self, name: str, cpp_sources: Any, cuda_sources: Any = None, **kwargs: Any) -> Any:
        sources = ExtensionSources.from_load_inline(name, cpp_sources, cuda_sources, **kwargs)
        key = build_key(sources, self.toolchain())
        record = BuildRecord(name=sources.name, key=key, cache_hit=False, seconds=0.0, cuda_sources=sources.cuda_sources)
        self.records.append(record)
        start = time.perf_counter()
        try:
            if self.mode == "torch":
                return self._build_with_torch(sources, key, record, kwargs)
            return self._compile_only(sources, key, record)
        except ExtensionCompileError as exc:
            record.error = exc.log[-4000:] or str(exc)
            raise
        finally:
            record.seconds = time.perf_counter() - start

    def load(self, name: str, sources: Any, **kwargs: Any) -> Any:
        """File-based `load`: the file contents join the key; the build is torch's (or compile-only)."""
        paths = [sources] if isinstance(sources, str) else list(sources)
        cuda = [Path(p).read_text() for p in paths if str(p).endswith((".cu", ".cuh"))]
        cpp = [Path(p).read_text() for p in paths if not str(p).endswith((".cu", ".cuh"))]
        normalised = ExtensionSources.from_load_inline(name, cpp, cuda, None, no_implicit_headers=True, **{
            k: v for k, v in kwargs.items() if k in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags",
                                                     "extra_include_paths", "is_python_module")})
        key = build_key(normalised, self.toolchain())
        record = BuildRecord(name=str(name), key=key, cache_hit=False, seconds=0.0, cuda_sources=cuda)
        self.records.append(record)
        start = time.perf_counter()
        try:
            if self.mode == "compile_only":
                return self._compile_only(normalised, key, record)
            build_dir = self.cache_dir / key
            if not (build_dir / "BUILD_OK.json").exists():
                self._not_cached(str(name))
            build_dir.mkdir(parents=True, exist_ok=True)
            kwargs.update(build_directory=str(build_dir), verbose=False)
            with file_lock(build_dir / ".dice_lock"):
                record.cache_hit = (build_dir / "BUILD_OK.json").exists()
                module = self._original_load(f"{_safe_identifier(str(name))}_{key[:12]}", paths, **kwargs)
                (build_dir / "BUILD_OK.json").write_text(json.dumps({"variant": "load"}))
            return module
        except BuildNotCached:
            raise
        except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError/subprocess errors for build failures
            record.error = str(exc)[-4000:]
            raise ExtensionCompileError("extension failed to build", str(exc)) from exc
        finally:
            record.seconds = time.perf_counter() - start

    def build_group(self, extensions: list[dict[str, Any]]) -> dict[str, Any]:
        """Build the extensions of several candidates (their `load_inline` keyword arguments, as
        batched_build.plan_build_groups read them) as one library, and enter each one in the cache under its
        own key, so that its candidate's `load_inline` is a cache hit. A failed build drops the members its
        output names and tries again with the rest; members left out build alone later. Returns what happened."""
        from dice_pipeline.verify.batched_build import group_binding_source, member_namespace, members_named, merged_unit

        toolchain = self.toolchain()
        marker_name = "BUILD_OK.json" if self.mode == "torch" else "COMPILE_OK.json"
        members = [(n, s, build_key(s, toolchain)) for n, s in
                   enumerate(ExtensionSources.from_load_inline(**kwargs) for kwargs in extensions)]
        pending = [m for m in members if not (self.cache_dir / m[2] / marker_name).exists()]
        already = {n for n, _, _ in members} - {n for n, _, _ in pending}
        report: dict[str, Any] = {"extensions": len(members), "already_built": len(already),
                                  "grouped": [], "left_to_build_alone": [], "attempts": []}
        while len(pending) >= 2:
            first = pending[0][1]
            cuda_parts = [(member_namespace(n), member_namespace(n), "\n".join(s.cuda_sources))
                          for n, s, _ in pending if s.cuda_sources]
            group = ExtensionSources(
                name="dice_group", cpp_sources=[group_binding_source(
                    [(n, dict(s.functions or {}), "\n".join(s.cpp_sources), s.with_pytorch_error_handling)
                     for n, s, _ in pending])],
                cuda_sources=[merged_unit(cuda_parts)] if cuda_parts else [], functions=None,
                extra_cflags=list(first.extra_cflags), extra_cuda_cflags=list(first.extra_cuda_cflags),
                extra_ldflags=list(first.extra_ldflags), extra_include_paths=list(first.extra_include_paths))
            group_key = build_key(group, toolchain)
            record = BuildRecord(name=group.name, key=group_key, cache_hit=False, seconds=0.0)
            start = time.perf_counter()
            try:
                if self.mode == "torch":
                    self._build_with_torch(group, group_key, record, {}, first_variant_only=True)
                else:
                    self._compile_only(group, group_key, record, first_variant_only=True)
            except ExtensionCompileError as exc:
                blamed = members_named(exc.log) & {n for n, _, _ in pending}
                report["attempts"].append({"members": len(pending), "seconds": round(time.perf_counter() - start, 2),
                                           "built": False, "named_in_errors": sorted(blamed)})
                if not blamed:
                    break  # nobody to drop: every member builds alone
                pending = [m for m in pending if m[0] not in blamed]
                continue
            report["attempts"].append({"members": len(pending), "seconds": round(time.perf_counter() - start, 2),
                                       "built": True, "variant": record.variant, "cache_hit": record.cache_hit})
            group_marker = json.loads((self.cache_dir / group_key / marker_name).read_text())
            for number, _, key in pending:
                build_dir = self.cache_dir / key
                build_dir.mkdir(parents=True, exist_ok=True)
                with file_lock(build_dir / ".dice_lock"):
                    if not (build_dir / marker_name).exists():
                        (build_dir / marker_name).write_text(json.dumps({
                            "variant": "batched", "namespace": member_namespace(number),
                            "module_name": group_marker.get("module_name"), "module_dir": str(self.cache_dir / group_key),
                            "group": group_key[:16]}))
                report["grouped"].append(number)
            pending = []
        report["left_to_build_alone"] = sorted({n for n, _, _ in members} - set(report["grouped"]) - already)
        return report

    def _variants(self, sources: ExtensionSources) -> list[tuple[str, ExtensionSources]]:
        """(variant name, the sources to build) in the order to try them; the source as written is always the last
        resort. "fast": "light" (light_cuda_sources for the CUDA file, light_binding_sources for main.cpp, each
        where it applies), then "trimmed" (torch/types.h for torch/extension.h in the CUDA file), then "full"."""
        variants: list[tuple[str, ExtensionSources]] = []
        if self.profile == "fast" and self.light_cuda_headers:
            root = Path(self.torch_include_dirs()[0])
            cuda = light_cuda_sources(sources.cuda_sources, sources.no_implicit_headers, root)
            cpp = light_binding_sources(list(sources.cpp_sources) or [""], sources.no_implicit_headers, root)
            if cuda is not None or cpp is not None:
                # What load_inline would have put first, written out where that half is not lightened (a CUDA
                # file that cannot be lightened is at least trimmed).
                implicit = not sources.no_implicit_headers
                if cuda is None:
                    cuda = trim_cuda_headers(sources.cuda_sources) or list(sources.cuda_sources)
                    cuda = ([cuda_file_source([], False)] if implicit and cuda else []) + cuda
                if cpp is None:
                    cpp = (["#include <torch/extension.h>"] if implicit else []) + list(sources.cpp_sources)
                variants.append(("light", replace(sources, cpp_sources=cpp, cuda_sources=cuda,
                                                  no_implicit_headers=True)))
        trimmed = trim_cuda_headers(sources.cuda_sources) if self.profile == "fast" else None
        if trimmed is not None:
            variants.append(("trimmed", replace(sources, cuda_sources=trimmed)))
        return variants + [("full", sources)]

    def _not_cached(self, name: str) -> None:
        if self.cached_only:
            self.missed_cache.append(name)
            raise BuildNotCached(f"extension {name!r} is not in the build cache")

    def _build_with_torch(self, sources: ExtensionSources, key: str, record: BuildRecord, kwargs: dict[str, Any],
                          *, first_variant_only: bool = False) -> Any:
        from torch.utils import cpp_extension
        from torch.utils.cpp_extension import _import_module_from_library

        build_dir = self.cache_dir / key
        marker = build_dir / "BUILD_OK.json"
        if not marker.exists():
            self._not_cached(sources.name)  # before the lock: nothing is created in the cache
        with file_lock(build_dir / ".dice_lock"):
            if marker.exists():
                built = json.loads(marker.read_text())
                if "namespace" not in built:
                    record.cache_hit, record.variant = True, built["variant"]
                    return _import_module_from_library(built["module_name"], str(build_dir), sources.is_python_module)
                if (Path(built["module_dir"]) / f"{built['module_name']}.so").exists():
                    record.cache_hit, record.variant = True, built["variant"]
                    group = _import_module_from_library(built["module_name"], built["module_dir"], True)
                    return GroupMemberExtension(sources.name, group, built["namespace"], list(sources.functions or {}))
                self._not_cached(sources.name)
                marker.unlink()  # the group's library is gone from the cache: build this one alone
            pch_flags = self.ensure_precompiled_header(sources.extra_cflags)
            library_flags = [f for d in self.library_include_dirs() for f in ("-isystem", d)]
            errors = []
            load_inline = self._original_load_inline or cpp_extension.load_inline
            for variant, built in self._variants(sources)[:1 if first_variant_only else None]:
                module_name = f"{_safe_identifier(sources.name)}_{key[:12]}_{variant}"
                try:
                    module = load_inline(
                        name=module_name, cpp_sources=list(built.cpp_sources), cuda_sources=list(built.cuda_sources) or None,
                        functions=sources.functions, extra_cflags=sources.extra_cflags + pch_flags + library_flags,
                        extra_cuda_cflags=list(sources.extra_cuda_cflags) + library_flags,
                        extra_ldflags=list(sources.extra_ldflags),
                        extra_include_paths=list(sources.extra_include_paths), build_directory=str(build_dir),
                        verbose=False, is_python_module=sources.is_python_module,
                        with_pytorch_error_handling=sources.with_pytorch_error_handling,
                        no_implicit_headers=built.no_implicit_headers,
                        **{k: v for k, v in kwargs.items() if k in ("with_cuda",)},
                    )
                except Exception as exc:  # noqa: BLE001 - torch reports build failures as RuntimeError et al.
                    errors.append(f"[{variant}] {exc}")
                    continue
                marker.write_text(json.dumps({"module_name": module_name, "variant": variant}))
                record.variant = variant
                return module
        raise ExtensionCompileError("extension failed to build", "\n".join(errors))

    def _compile_only(self, sources: ExtensionSources, key: str, record: BuildRecord, *,
                      first_variant_only: bool = False) -> CompiledOnlyExtension:
        build_dir = self.cache_dir / key
        marker = build_dir / "COMPILE_OK.json"
        functions = list(sources.functions or {})
        if not marker.exists():
            self._not_cached(sources.name)
        with file_lock(build_dir / ".dice_lock"):
            if marker.exists():
                record.cache_hit, record.variant = True, json.loads(marker.read_text())["variant"]
                return CompiledOnlyExtension(sources.name, functions)
            from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

            include_flags = [f for d in sources.extra_include_paths for f in ("-I", d)] + [
                f for d in self.torch_include_dirs() + self.cpu_wheel_shim_dirs() + self.library_include_dirs()
                for f in ("-isystem", d)]
            defines = [f"-DTORCH_EXTENSION_NAME={_safe_identifier(sources.name)}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
            cxx_std = self.torch_cxx_standard()
            pch_flags = self.ensure_precompiled_header(sources.extra_cflags)
            as_written = binding_source(sources)
            compiled_binding = None  # the main.cpp that compiled: a later variant with the same one skips it
            errors = []
            for variant, built in self._variants(sources)[:1 if first_variant_only else None]:
                commands, binding, cxx = [], binding_source(built), None
                if binding != compiled_binding:
                    main_cpp = build_dir / f"main_{variant}.cpp"
                    main_cpp.write_text(binding)
                    cxx = [os.environ.get("CXX", "c++"), "-c", str(main_cpp), "-o", str(build_dir / f"main_{variant}.o"),
                           *defines, *include_flags, "-fPIC", cxx_std, *sources.extra_cflags, *pch_flags]
                    commands.append(cxx)
                if built.cuda_sources:
                    cuda_cu = build_dir / f"cuda_{variant}.cu"
                    cuda_cu.write_text(cuda_file_source(built.cuda_sources, built.no_implicit_headers))
                    commands.append(["nvcc", "-c", str(cuda_cu), "-o", str(build_dir / f"cuda_{variant}.o"), *defines,
                                     *include_flags, *COMMON_NVCC_FLAGS, *self.arch_flags(),
                                     "--compiler-options", "-fPIC", cxx_std, *sources.extra_cuda_cflags])
                failures = _run_compile_commands(commands, build_dir)
                binding_failed = cxx is not None and any(cmd is cxx for cmd, _ in failures)
                if cxx is not None and not binding_failed:
                    compiled_binding = binding
                if not failures:
                    marker.write_text(json.dumps({"variant": variant}))
                    record.variant = variant
                    return CompiledOnlyExtension(sources.name, functions)
                errors.extend(f"[{variant}] {log}" for _, log in failures)
                if binding_failed and binding == as_written:
                    break  # the binding file as written is broken: no CUDA variant can fix that
        raise ExtensionCompileError("extension failed to compile", "\n".join(errors))

