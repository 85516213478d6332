"""The structure catalogue renders valid KernelBench tasks whose references compute what they claim."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from dice_pipeline.kernelbench import task_format_problems
from dice_pipeline.synthesis.catalogue import (
    FAMILIES,
    MIN_REFERENCE_MS,
    family_of_code,
    make_structure_task,
    structure_catalogue,
)

# Reduced shapes (fast on CPU) per family, with the config each needs.
SMALL = {
    "mha_rope_causal": ({"b": 2, "s": 19, "h": 32, "q": 4, "kv": 4}, {"rope_theta": 10000.0, "qkv_bias": False}),
    "gqa_rope_causal": ({"b": 2, "s": 19, "h": 32, "q": 4, "kv": 2}, {"rope_theta": 500000.0, "qkv_bias": True}),
    "mqa_rope_causal": ({"b": 1, "s": 17, "h": 64, "q": 4, "kv": 1}, {"rope_theta": 10000.0, "qkv_bias": False}),
    "rope": ({"b": 2, "s": 9, "q": 3, "d": 8}, {"rope_theta": 10000.0}),
    "swiglu_mlp": ({"b": 2, "s": 5, "h": 16, "i": 24}, {}),
    "gelu_mlp": ({"b": 2, "s": 5, "h": 16, "i": 24}, {"gelu_approximate": "tanh"}),
    "rmsnorm_residual": ({"b": 2, "s": 5, "h": 16}, {"eps": 1e-6}),
    "layernorm_residual": ({"b": 2, "s": 5, "h": 16}, {"eps": 1e-5}),
    "gpt2_block": ({"b": 2, "s": 11, "h": 32, "q": 4}, {}),
}


def build(code: str):
    """Exec a task file as KernelBench does, returning (model, inputs)."""
    namespace: dict = {}
    exec(compile(code, "<task>", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    return model, namespace["get_inputs"]()


def small_task(family: str):
    shape, config = SMALL[family]
    return make_structure_task(family, shape, config, "test")


def test_every_family_has_a_small_shape_here():
    assert set(SMALL) == set(FAMILIES)


def test_catalogue_ids_are_unique_stable_and_name_family_and_shape():
    tasks = structure_catalogue()
    assert len({t.task_id for t in tasks}) == len(tasks)
    for task in tasks:
        assert re.fullmatch(rf"{task.family}__(?:[a-z]+\d+_)*[a-z]+\d+", task.task_id), task.task_id
        assert family_of_code(task.pytorch_code) == task.family
    assert "gqa_rope_causal__b2_s1024_h2048_q16_kv4" in {t.task_id for t in tasks}
    assert [t.task_id for t in structure_catalogue()] == [t.task_id for t in tasks]  # deterministic order


def test_catalogue_covers_every_family_at_several_shapes_and_model_families():
    tasks = structure_catalogue()
    for family in FAMILIES:
        assert sum(t.family == family for t in tasks) >= 2, family
    assert {"llama", "qwen", "gpt2", "falcon"} <= {t.model_family for t in tasks}


def test_catalogue_shapes_are_estimated_long_enough_to_time():
    for task in structure_catalogue():
        assert task.estimated_reference_ms >= MIN_REFERENCE_MS, task.task_id


def test_catalogue_tasks_are_kernelbench_format():
    for task in structure_catalogue():
        assert task_format_problems(task.pytorch_code) == [], task.task_id
        # Sizes are module-level names, and the code is shape-free apart from them.
        assert "batch_size = " in task.pytorch_code


def test_family_filter_and_unknown_family():
    assert {t.family for t in structure_catalogue(["rope"])} == {"rope"}
    with pytest.raises(ValueError, match="unknown structure families"):
        structure_catalogue(["nope"])


@pytest.mark.parametrize(
    "family, shape, config, message",
    [
        ("gqa_rope_causal", {"b": 1, "s": 8, "h": 32, "q": 4, "kv": 3}, {"rope_theta": 1.0, "qkv_bias": False}, "groups"),
        ("gqa_rope_causal", {"b": 1, "s": 8, "h": 32, "q": 4, "kv": 4}, {"rope_theta": 1.0, "qkv_bias": False}, "is mha"),
        ("rope", {"b": 1, "s": 8, "q": 2}, {"rope_theta": 1.0}, "missing"),
        ("rmsnorm_residual", {"b": 1, "s": 8, "h": 0}, {"eps": 1e-6}, "positive"),
        ("rmsnorm_residual", {"b": 1, "s": 8, "h": 8}, {}, "config needs"),
    ],
)
def test_bad_shapes_are_rejected_with_a_clear_error(family, shape, config, message):
    with pytest.raises(ValueError, match=message):
        make_structure_task(family, shape, config, "test")


@pytest.mark.parametrize("family", sorted(SMALL))
def test_reduced_task_builds_and_runs_on_cpu(family):
    task = small_task(family)
    model, inputs = build(task.pytorch_code)
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in inputs)
    with torch.no_grad():
        out = model(*inputs)
    assert torch.isfinite(out).all()
    assert out.abs().sum() > 0


def independent_attention(model, x):
    """The same attention through F.scaled_dot_product_attention (is_causal, enable_gqa) and HF-style RoPE."""
    batch, seq, _ = x.shape
    heads, kv_heads, head_dim = model.num_heads, model.num_kv_heads, model.head_dim
    q = model.q_proj(x).view(batch, seq, heads, head_dim).transpose(1, 2)
    k = model.k_proj(x).view(batch, seq, kv_heads, head_dim).transpose(1, 2)
    v = model.v_proj(x).view(batch, seq, kv_heads, head_dim).transpose(1, 2)
    angles = torch.arange(seq, dtype=torch.float32)[:, None] * model.inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()

    def rotate(t):
        a, b = t[..., : head_dim // 2], t[..., head_dim // 2 :]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

    out = F.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True, enable_gqa=True)
    return model.o_proj(out.transpose(1, 2).reshape(batch, seq, heads * head_dim))


@pytest.mark.parametrize("family", ["mha_rope_causal", "gqa_rope_causal", "mqa_rope_causal"])
def test_attention_reference_matches_sdpa_with_gqa_and_causal_mask(family):
    model, (x,) = build(small_task(family).pytorch_code)
    with torch.no_grad():
        torch.testing.assert_close(model(x), independent_attention(model, x), atol=1e-5, rtol=1e-5)


def test_norm_references_match_torch_functional():
    model, (x, residual) = build(small_task("rmsnorm_residual").pytorch_code)
    with torch.no_grad():
        model.weight.uniform_(0.5, 1.5)
        expected = F.rms_norm(x + residual, (x.shape[-1],), model.weight, eps=1e-6)
        torch.testing.assert_close(model(x, residual), expected, atol=1e-5, rtol=1e-5)
    model, (x, residual) = build(small_task("layernorm_residual").pytorch_code)
    with torch.no_grad():
        expected = F.layer_norm(x + residual, (x.shape[-1],), eps=1e-5)
        torch.testing.assert_close(model(x, residual), expected, atol=1e-5, rtol=1e-5)


def test_gpt2_block_reference_matches_sdpa_composition():
    model, (x,) = build(small_task("gpt2_block").pytorch_code)
    batch, seq, hidden = x.shape
    heads = model.num_heads
    with torch.no_grad():
        q, k, v = model.c_attn(model.ln_1(x)).split(hidden, dim=2)
        split = lambda t: t.view(batch, seq, heads, hidden // heads).transpose(1, 2)  # noqa: E731
        y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
        h = x + model.c_proj(y.transpose(1, 2).reshape(batch, seq, hidden))
        expected = h + model.mlp_proj(F.gelu(model.c_fc(model.ln_2(h)), approximate="tanh"))
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


def test_rope_reference_rotates_pairs_by_position():
    model, (x,) = build(small_task("rope").pytorch_code)
    out = model(x)
    assert out.shape == (x.shape[0], x.shape[2], x.shape[1], x.shape[3])
    torch.testing.assert_close(out[:, :, 0], x[:, 0])  # position 0: no rotation
    # A rotation keeps the norm of each (d, d + D/2) pair.
    half = x.shape[-1] // 2
    pair_norm = lambda t: t[..., :half] ** 2 + t[..., half:] ** 2  # noqa: E731
    torch.testing.assert_close(pair_norm(out), pair_norm(x.transpose(1, 2)), atol=1e-5, rtol=1e-5)
    assert not math.isclose(float(out[:, :, 3].sum()), float(x[:, 3].sum()), rel_tol=1e-3)
