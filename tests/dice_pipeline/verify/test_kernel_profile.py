"""The kernel profile's rules (judge/profile.py): kernel families, the baseline-kernel rule and its policy, and which
kernels a compiler generated from PyTorch code. The profiler pass itself needs CUDA: test_gpu_verifier.py."""

from __future__ import annotations

import pytest

from dice_pipeline.verify.config import VerifyConfig
from dice_pipeline.verify.judge.profile import baseline_kernel_finding, kernel_family


GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32"

RELU = "void at::native::vectorized_elementwise_kernel<4, at::native::clamp_min_kernel_functor<float> >(int, ...)"

DIV = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, at::native::DivFunctor<float> > >(int, ...)"

def _families(*names):
    return {kernel_family(name) for name in names}

def test_kernel_families_ignore_launch_variants():
    assert kernel_family(GEMM) == kernel_family("ampere_sgemm_128x64_nn") == "gemm"
    assert kernel_family("void cudnn::engines_precompiled::implicit_convolve_sgemm<float>(int)") == "conv"
    unrolled = "void at::native::unrolled_elementwise_kernel<at::native::clamp_min_kernel_functor<float>, L, S>(int)"
    assert kernel_family(RELU) == kernel_family(unrolled) != kernel_family(DIV)
    assert kernel_family("relu2_kernel(float const*, float*, long)") == "relu2_kernel"

def test_a_trivial_kernel_beside_a_pytorch_gemm_is_a_baseline_kernel():
    # torch.matmul (4,000 us of cuBLAS) plus a copy kernel (25 us): the reference's only kernel kind, a GEMM, ran.
    finding = baseline_kernel_finding(custom_us=25.0, total_us=4025.0, custom_ran=True,
                                      candidate_other_families=_families(GEMM), reference_families=_families(GEMM),
                                      max_share=0.5)
    assert finding is not None and "0.6%" in finding and "gemm" in finding
    # At small sizes the copy kernel's share is larger; the reference's work is still all PyTorch's.
    assert baseline_kernel_finding(3.0, 11.0, True, _families(GEMM), _families(GEMM), 0.5) is not None

def test_a_cublas_gemm_with_a_fused_custom_epilogue_is_not():
    # GEMM 12 us + a fused bias/ReLU/divide epilogue 1.2 us: 9% custom, but the reference's ReLU and divide kernels
    # are not in the candidate's PyTorch work: its kernel replaced them. At full size (0.3%) the same holds.
    for custom_us, total_us in ((1.2, 13.2), (10.0, 3000.0)):
        assert baseline_kernel_finding(custom_us, total_us, True, _families(GEMM), _families(GEMM, RELU, DIV),
                                       0.5) is None
    # The whole reference redone in PyTorch, then a copy kernel: a baseline kernel again.
    assert baseline_kernel_finding(1.2, 14.0, True, _families(GEMM, RELU, DIV), _families(GEMM, RELU, DIV),
                                   0.5) is not None
    # Custom kernels doing most of the time, or none having run, or an unknown reference: no finding.
    assert baseline_kernel_finding(50.0, 60.0, True, _families(GEMM), _families(GEMM), 0.5) is None
    assert baseline_kernel_finding(0.0, 50.0, False, _families(GEMM), _families(GEMM), 0.5) is None
    assert baseline_kernel_finding(1.0, 50.0, True, _families(GEMM), set(), 0.5) is None

def test_baseline_kernel_policy_is_validated():
    assert VerifyConfig().baseline_kernel_policy == "reject"
    VerifyConfig(baseline_kernel_policy="report")
    with pytest.raises(ValueError, match="baseline_kernel_policy"):
        VerifyConfig(baseline_kernel_policy="ignore")
    with pytest.raises(ValueError, match="speedup_convention"):
        VerifyConfig(speedup_convention="wall")

def test_generated_kernel_names_are_the_compilers_not_aten_cublas_or_the_candidates():
    from dice_pipeline.verify.verdict import generated_kernel_names

    seen = ["triton_poi_fused_mul_relu_0", "triton_red_fused_sum_1", "triton_tem_fused_addmm_2",
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >(int, ...)",
            "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "relu2_kernel(float const*, float*, long)",
            "nvfuser_pointwise_f0_c1_r0_g0", "triton_poi_mine(float*)"]
    assert generated_kernel_names(seen, own_kernel_names=["relu2_kernel", "triton_poi_mine"]) == [
        "nvfuser_pointwise_f0_c1_r0_g0", "triton_poi_fused_mul_relu_0", "triton_red_fused_sum_1",
        "triton_tem_fused_addmm_2"]
