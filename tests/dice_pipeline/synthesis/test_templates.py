"""Built-in kernel templates: complete KernelBench candidates for every catalogue family that pass the verifier's
static policy, compile with nvcc, and (on a GPU) match their references. A CPU emulation of the attention and RoPE
kernels' index arithmetic checks the algorithms where no GPU is present.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch

from dice_pipeline.synthesis.candidates import UnsupportedTaskError
from dice_pipeline.synthesis.catalogue import FAMILIES, make_structure_task, structure_catalogue
from dice_pipeline.synthesis.templates import (
    FAMILY_TEMPLATES,
    PIECES,
    VARIANTS,
    TemplateGenerator,
    cuda_file,
    render_candidate,
    render_cuda_source,
)
from dice_pipeline.verify.static_checks import check_candidate_source

from .test_catalogue import build, small_task

CUDA_DIR = Path(__file__).resolve().parents[3] / "dice_pipeline" / "synthesis" / "cuda"


def candidate_parts(code: str) -> dict[str, object]:
    """The module-level string assignments and the load_inline keyword arguments of a candidate file."""
    tree = ast.parse(code)
    parts: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            parts[node.targets[0].id] = node.value.value
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            parts["load_inline"] = {kw.arg: ast.literal_eval(kw.value) for kw in node.value.keywords
                                    if isinstance(kw.value, (ast.Constant, ast.List))}
    return parts


def test_every_catalogue_family_has_a_template():
    assert set(FAMILIES) <= set(FAMILY_TEMPLATES)


@pytest.mark.parametrize("family", sorted(FAMILY_TEMPLATES))
def test_candidate_has_kernelbench_layout_and_exports_every_declared_function(family):
    code = render_candidate(family)
    parts = candidate_parts(code)
    assert {"source", "cpp_src", "load_inline"} <= set(parts)
    assert re.search(r"^class ModelNew\(nn\.Module\):", code, re.MULTILINE)
    source, prototypes = parts["source"], parts["cpp_src"]
    functions = parts["load_inline"]["functions"]
    assert functions and all(f" {name}(" in prototypes and f" {name}(" in source for name in functions)
    # ModelNew calls only functions the extension exports.
    called = set(re.findall(r"fused_ops\.(\w+)\(", code))
    assert called and called <= set(functions)


def test_prototypes_match_host_definitions_exactly():
    for piece in PIECES.values():
        if not piece.prototypes:
            continue
        host = " ".join(cuda_file(f"{piece.name}_host.cu").split())
        for prototype in piece.prototypes:
            assert " ".join(prototype.rstrip(";").split()) + " {" in host, prototype


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_template_candidate_passes_the_verifiers_static_policy(family):
    task = small_task(family)
    [candidate] = TemplateGenerator().generate(task.pytorch_code, 1, seed=0)
    report = check_candidate_source(task.pytorch_code, candidate.code)
    assert report.status is None, [r.code for r in report.reasons]
    assert report.extension_calls_on_forward >= 1
    # Kernel names are parsed correctly (launch bounds before the return type), so the profiler can find them.
    assert "__launch_bounds__" not in report.kernel_names and report.kernel_names


def test_generator_returns_distinct_variants_and_records_the_prompt():
    task = small_task("rmsnorm_residual")
    candidates = TemplateGenerator().generate(task.pytorch_code, 5, seed=1)
    assert len(candidates) == len(VARIANTS)  # no duplicate code
    assert len({c.code for c in candidates}) == len(VARIANTS)
    assert candidates[0].variant["variant_index"] == 1  # the seed rotates the starting variant
    for c in candidates:
        assert c.backend == "template" and c.finish_reason == "template"
        assert task.pytorch_code in c.prompt_messages[-1]["content"]


def test_generator_refuses_code_that_is_not_a_catalogue_task():
    with pytest.raises(UnsupportedTaskError, match="not a structure-catalogue task"):
        TemplateGenerator().generate("import torch\nclass Model: pass\n", 1, seed=0)
    with pytest.raises(ValueError):
        TemplateGenerator().generate(small_task("rope").pytorch_code, 0, seed=0)


# --- CPU emulation of the kernels' index arithmetic ------------------------------------------------------------
BLOCK_Q = BLOCK_K = 32


def emulate_causal_attention(q, k, v):
    """causal_attention_kernel step by step: 32-query blocks (latest first), 32-key tiles up to the diagonal,
    online softmax with the same masking and rescaling; q (B,H,S,D), k/v (B,KV,S,D) -> (B,S,H*D)."""
    batch, heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    out = torch.full((batch, seq, heads * head_dim), float("nan"))
    scale = 1.0 / head_dim**0.5
    grid_x = (seq + BLOCK_Q - 1) // BLOCK_Q
    for batch_head in range(batch * heads):
        b, h = divmod(batch_head, heads)
        kv_h = h // (heads // kv_heads)
        for block_x in range(grid_x):
            q_start = (grid_x - 1 - block_x) * BLOCK_Q
            rows = torch.arange(BLOCK_Q) + q_start
            q_tile = torch.zeros(BLOCK_Q, head_dim)
            valid_rows = rows < seq
            q_tile[valid_rows] = q[b, h, rows[valid_rows]]
            row_max = torch.full((BLOCK_Q,), float("-inf"))
            row_sum = torch.zeros(BLOCK_Q)
            acc = torch.zeros(BLOCK_Q, head_dim)
            last_key = min(q_start + BLOCK_Q, seq) - 1
            for tile in range(last_key // BLOCK_K + 1):
                k_start = tile * BLOCK_K
                cols = torch.arange(BLOCK_K) + k_start
                kv_tile = torch.zeros(BLOCK_K, head_dim)
                valid_cols = cols < seq
                kv_tile[valid_cols] = k[b, kv_h, cols[valid_cols]]
                score = q_tile @ kv_tile.T
                visible = (cols[None, :] <= rows[:, None]) & (cols[None, :] < seq)
                score = torch.where(visible, score * scale, torch.tensor(float("-inf")))
                new_max = torch.maximum(row_max, score.max(dim=1).values)
                assert torch.isfinite(new_max).all()  # the kernel relies on key 0 being visible to every row
                correction = torch.exp(row_max - new_max)
                p = torch.exp(score - new_max[:, None])
                row_sum = row_sum * correction + p.sum(dim=1)
                row_max = new_max
                acc = acc * correction[:, None]
                kv_tile = torch.zeros(BLOCK_K, head_dim)
                kv_tile[valid_cols] = v[b, kv_h, cols[valid_cols]]
                acc = acc + p @ kv_tile
            for i in range(BLOCK_Q):
                if rows[i] < seq:
                    out[b, rows[i], h * head_dim : (h + 1) * head_dim] = acc[i] / row_sum[i]
    return out


def emulate_rope_transpose(x_flat, row_stride, bias, inv_freq, batch, seq, heads, head_dim):
    """rope_transpose_kernel's flat pair loop over a flat input buffer with token rows row_stride apart."""
    half = head_dim // 2
    out = torch.full((batch * heads * seq * head_dim,), float("nan"))
    for p in range(batch * seq * heads * half):
        j = p % half
        rest = p // half
        head = rest % heads
        rest //= heads
        pos = rest % seq
        b = rest // seq
        base = (b * seq + pos) * row_stride + head * head_dim
        dst = ((b * heads + head) * seq + pos) * head_dim
        x1, x2 = float(x_flat[base + j]), float(x_flat[base + j + half])
        if bias is not None:
            x1 += float(bias[head * head_dim + j])
            x2 += float(bias[head * head_dim + j + half])
        if inv_freq is not None:
            angle = torch.tensor(pos, dtype=torch.float32) * inv_freq[j]
            c, s = float(torch.cos(angle)), float(torch.sin(angle))
            out[dst + j], out[dst + j + half] = x1 * c - x2 * s, x2 * c + x1 * s
        else:
            out[dst + j], out[dst + j + half] = x1, x2
    return out.view(batch, heads, seq, head_dim)


@pytest.mark.parametrize("family", ["gqa_rope_causal", "mqa_rope_causal"])
def test_emulated_attention_template_matches_the_reference(family):
    """The template's data flow (GEMMs, bias + RoPE + transpose pre-pass, tiled attention) emulated on CPU
    reproduces Model's output, on a sequence that is not a multiple of the tile size and spans 3 tiles."""
    shape = {"b": 1, "s": 70, "h": 32, "q": 4, "kv": 2 if family == "gqa_rope_causal" else 1}
    task = make_structure_task(family, shape, {"rope_theta": 10000.0, "qkv_bias": True}, "test")
    model, (x,) = build(task.pytorch_code)
    with torch.no_grad():
        expected = model(x)
        heads, kv_heads, head_dim = model.num_heads, model.num_kv_heads, model.head_dim
        projected = {}
        for name, proj, n_heads, rotate in (("q", model.q_proj, heads, True), ("k", model.k_proj, kv_heads, True),
                                            ("v", model.v_proj, kv_heads, False)):
            flat = torch.matmul(x, proj.weight.t()).contiguous()
            projected[name] = emulate_rope_transpose(flat.flatten(), flat.shape[-1], proj.bias,
                                                     model.inv_freq if rotate else None, 1, shape["s"], n_heads,
                                                     head_dim)
        out = emulate_causal_attention(projected["q"], projected["k"], projected["v"])
        actual = torch.matmul(out, model.o_proj.weight.t())
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)


def test_emulated_rope_reads_strided_qkv_slices():
    """GPT-2 passes q/k/v as slices of one (B, S, 3C) projection: rows 3C apart, offsets 0, C, 2C."""
    batch, seq, heads, head_dim = 2, 5, 2, 4
    hidden = heads * head_dim
    qkv = torch.randn(batch, seq, 3 * hidden)
    bias = torch.randn(3 * hidden)
    for part in range(3):
        flat = qkv.flatten()[part * hidden :]
        got = emulate_rope_transpose(flat, 3 * hidden, bias[part * hidden : (part + 1) * hidden], None, batch, seq,
                                     heads, head_dim)
        want = (qkv[..., part * hidden : (part + 1) * hidden] + bias[part * hidden : (part + 1) * hidden])
        torch.testing.assert_close(got, want.view(batch, seq, heads, head_dim).transpose(1, 2))


# --- nvcc compile checks -----------------------------------------------------------------------------------------
def nvcc() -> str:
    return shutil.which("nvcc") or "nvcc"


@pytest.mark.nvcc
def test_device_kernels_compile_with_nvcc_for_every_variant(tmp_path):
    """Every piece's device code (no torch headers) compiles with nvcc for each launch variant, with the kernel
    templates instantiated at every supported head_dim."""
    instantiations = "\n".join(
        f"template __global__ void causal_attention_kernel<{d}>(const float*, const float*, const float*, float*, "
        "int, int, int, float);" for d in (32, 64, 96, 128)
    ) + "\n" + "\n".join(
        f"template __global__ void {name}<{flag}>({sig});"
        for name, sig in (
            ("rmsnorm_residual_kernel", "const float*, const float*, const float*, float*, int, float"),
            ("layernorm_residual_kernel",
             "const float*, const float*, const float*, const float*, const float*, float*, float*, int, float"),
        )
        for flag in ("true", "false")
    )
    commands = []
    for index, variant in enumerate(VARIANTS):
        macros = "".join(f"#define {k} {v}\n" for k, v in variant.items())
        kernels = "\n".join(cuda_file(f"{name}_kernels.cu") for name in PIECES)
        unit = tmp_path / f"kernels_{index}.cu"
        unit.write_text("#include <cuda_runtime.h>\n#include <math.h>\n" + macros + kernels + "\n" + instantiations)
        commands.append([nvcc(), "-c", str(unit), "-o", str(tmp_path / f"kernels_{index}.o"), "-arch=sm_90",
                         "-Xptxas", "-warn-spills", "-Werror", "all-warnings"])
    for command in commands:
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "spill" not in result.stderr, result.stderr


def torch_compile_flags(tmp_path: Path) -> list[str]:
    """Flags that compile a load_inline CUDA source against the installed torch's headers. The CPU wheel lacks
    c10/cuda/impl/cuda_cmake_macros.h (generated by a CUDA build), so a one-line shim stands in for it."""
    shim = tmp_path / "shim" / "c10" / "cuda" / "impl"
    shim.mkdir(parents=True)
    (shim / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    include = Path(torch.__file__).parent / "include"
    return ["-std=c++20", "-arch=sm_90", "-w", f"-I{tmp_path / 'shim'}", f"-I{include}",
            f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", f"-I{sysconfig.get_paths()['include']}",
            "-DTORCH_EXTENSION_NAME=dice_templates", "-D_GLIBCXX_USE_CXX11_ABI=1"]


@pytest.mark.nvcc
@pytest.mark.slow
def test_every_family_source_compiles_against_torch_headers(tmp_path):
    """All family sources in one translation unit (each in its own namespace; the shared headers come first, so
    the sources' own #includes are no-ops): one ~2-3 minute nvcc run covers every host launcher."""
    families = sorted(FAMILY_TEMPLATES)
    unit = ["#include <torch/extension.h>", "#include <c10/cuda/CUDAGuard.h>", "#include <c10/cuda/CUDAStream.h>",
            "#include <algorithm>", "#include <optional>", "#include <vector>"]
    for index, family in enumerate(families):
        variant = VARIANTS[index % len(VARIANTS)]
        source = render_cuda_source(family, variant)
        # Variant macros are per source: undefine them so the next source's defaults apply.
        unit += [f"namespace family_{family} {{", source, "}"] + [f"#undef {name}" for name in variant]
    path = tmp_path / "all_families.cu"
    path.write_text("\n".join(unit))
    result = subprocess.run([nvcc(), "-c", str(path), "-o", str(tmp_path / "all.o"), *torch_compile_flags(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]


# --- on a GPU: build through load_inline and compare with the reference --------------------------------------------
def randomise_norm_parameters(model: torch.nn.Module) -> None:
    """Norm weights start at 1 and biases at 0, which would hide indexing bugs in the kernels' use of them."""
    generator = torch.Generator().manual_seed(123)
    for name, parameter in model.named_parameters():
        if name.endswith("weight") and parameter.dim() == 1:
            parameter.data = torch.rand(parameter.shape, generator=generator) + 0.5
        elif name.endswith("bias") and ("ln_" in name or "norm" in name):
            parameter.data = torch.randn(parameter.shape, generator=generator) * 0.1


GPU_SHAPES = {
    "mha_rope_causal": ({"b": 2, "s": 100, "h": 256, "q": 4, "kv": 4}, {"rope_theta": 10000.0, "qkv_bias": False}),
    "gqa_rope_causal": ({"b": 2, "s": 257, "h": 512, "q": 4, "kv": 2}, {"rope_theta": 1000000.0, "qkv_bias": True}),
    "mqa_rope_causal": ({"b": 1, "s": 300, "h": 512, "q": 8, "kv": 1}, {"rope_theta": 10000.0, "qkv_bias": False}),
    "rope": ({"b": 2, "s": 333, "q": 3, "d": 128}, {"rope_theta": 10000.0}),
    "swiglu_mlp": ({"b": 2, "s": 65, "h": 256, "i": 688}, {}),
    "gelu_mlp": ({"b": 2, "s": 65, "h": 256, "i": 1024}, {"gelu_approximate": "none"}),
    "rmsnorm_residual": ({"b": 2, "s": 33, "h": 16384}, {"eps": 1e-6}),  # too wide for the shared-memory row cache
    "layernorm_residual": ({"b": 2, "s": 33, "h": 1000}, {"eps": 1e-5}),
    "gpt2_block": ({"b": 2, "s": 129, "h": 384, "q": 6}, {}),
}


# Every family at variant 0; the other variants only change thread counts, so they are built (~1 min each) for
# the kernels those counts reach: row norms and element-wise epilogues.
GPU_CASES = [(family, 0) for family in sorted(GPU_SHAPES)] + [
    ("rmsnorm_residual", 2), ("layernorm_residual", 1), ("gelu_mlp", 1), ("gpt2_block", 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("family, variant_index", GPU_CASES)
def test_template_matches_reference_on_gpu(family, variant_index):
    shape, config = GPU_SHAPES[family]
    task = make_structure_task(family, shape, config, "test")
    reference_ns: dict = {}
    exec(compile(task.pytorch_code, "<reference>", "exec"), reference_ns)
    candidate_ns: dict = {}
    exec(compile(render_candidate(family, variant_index), "<candidate>", "exec"), candidate_ns)
    init = reference_ns["get_init_inputs"]()
    torch.manual_seed(0)
    reference = reference_ns["Model"](*init)
    torch.manual_seed(0)
    candidate = candidate_ns["ModelNew"](*init)
    randomise_norm_parameters(reference)
    candidate.load_state_dict(reference.state_dict())
    reference, candidate = reference.cuda(), candidate.cuda()
    for trial in range(3):
        torch.manual_seed(trial)
        inputs = [t.cuda() for t in reference_ns["get_inputs"]()]
        originals = [t.clone() for t in inputs]
        with torch.no_grad():
            expected = reference(*inputs)
            actual = candidate(*inputs)
        torch.cuda.synchronize()
        for before, after in zip(originals, inputs):
            assert torch.equal(before, after), "the candidate modified its inputs"
        assert actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_full_size_catalogue_templates_match_on_gpu():
    """One full-size task per family (the shapes the verifier will time)."""
    seen = set()
    for task in structure_catalogue():
        if task.family in seen:
            continue
        seen.add(task.family)
        reference_ns: dict = {}
        exec(compile(task.pytorch_code, "<reference>", "exec"), reference_ns)
        candidate_ns: dict = {}
        exec(compile(render_candidate(task.family), "<candidate>", "exec"), candidate_ns)
        init = reference_ns["get_init_inputs"]()
        torch.manual_seed(0)
        reference = reference_ns["Model"](*init).cuda()
        torch.manual_seed(0)
        candidate = candidate_ns["ModelNew"](*init).cuda()
        inputs = [t.cuda() for t in reference_ns["get_inputs"]()]
        with torch.no_grad():
            torch.testing.assert_close(candidate(*inputs), reference(*inputs), atol=1e-3, rtol=1e-3,
                                       msg=lambda m, task=task: f"{task.task_id}: {m}")
        del reference, candidate, inputs
        torch.cuda.empty_cache()
