"""``bench gemm --dtypes fp8``'s parts that run without a GPU: the operands' quantization
as ``_scaled_mm`` takes it, the options, the summary of the issue's goals."""

import argparse
import math

import pytest
import torch

from cutedsl_inductor.bench import gemm
from cutedsl_inductor.bench.gemm_fp8 import FP8, parse_scales, quantize, reference, summarize


@pytest.mark.parametrize("recipe,scale_shape", [("tensorwise", ()), ("rowwise", (64, 1))])
def test_quantized_operands_dequantize_close_to_the_values(recipe, scale_shape):
    x = torch.randn(64, 128) * torch.logspace(-2, 2, 64)[:, None]
    q, scale = quantize(x, recipe)
    assert q.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == scale_shape
    error = ((q.float() * scale - x).norm() / x.norm()).item()
    assert error < 0.05  # e4m3 has 3 mantissa bits: about 2^-4 per value
    assert q.float().abs().max() <= torch.finfo(FP8).max


def test_the_reference_multiplies_the_dequantized_operands():
    a, scale_a = quantize(torch.randn(8, 32), "rowwise")
    w, scale_w = quantize(torch.randn(16, 32), "rowwise")
    bias = torch.randn(16)
    expected = (a.double() * scale_a.double()) @ (w.double() * scale_w.double()).t()
    assert torch.allclose(reference(a, w.t(), scale_a, scale_w.t(), bias),
                          expected + bias.double())


def test_the_options_take_fp8_and_the_scale_recipes():
    parser = argparse.ArgumentParser()
    gemm.add_arguments(parser)
    args = parser.parse_args(["--dtypes", "bf16,fp8", "--scales", "rowwise"])
    assert args.dtypes == ["bf16", "fp8"] and args.scales == ["rowwise"]
    assert parser.parse_args([]).scales == ["tensorwise", "rowwise"]
    with pytest.raises(argparse.ArgumentTypeError, match="blockwise"):
        parse_scales("blockwise")


def test_the_summary_gives_each_recipes_geomeans_and_worst_row():
    rows = [dict(m=16, n=4096, k=4096, scales="rowwise", vs_aten=0.8, vs_triton=1.5),
            dict(m=4096, n=4096, k=4096, scales="rowwise", vs_aten=1.25, vs_triton=math.nan),
            dict(m=4096, n=4096, k=4096, scales="tensorwise", vs_aten=1.0, vs_triton=1.2)]
    assert summarize(rows).splitlines() == [
        "rowwise: geomean vs ATen 1.000 over 2 shapes, worst 0.80 at 16x4096x4096; "
        "geomean vs Triton 1.500",
        "tensorwise: geomean vs ATen 1.000 over 1 shapes, worst 1.00 at 4096x4096x4096; "
        "geomean vs Triton 1.200"]
