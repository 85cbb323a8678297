"""``Sm90ScaledGemm``: ``torch._scaled_mm`` on Hopper, the GEMM of ``Sm90Gemm`` with FP8
operands and the scales applied in the epilogue.

For every batch index ``l`` (``_scaled_mm`` has one)::

    C = cast( scale_a * scale_b * (A @ B^T) + bias )

A and B are FP8 (e4m3 or e5m2, either mix), both K-major: FP8 WGMMA reads no other
layout from shared memory, and ``_scaled_mm``'s operands are that (A row-major, B
column-major, the K x N matrix whose (N, K) view is K-major); the kernel raises
``ValueError`` on another one while it is traced (``GemmProblem.why_not`` says so up
front). The config must say ``fp8=True`` (``GemmConfig``: its shared-memory check
counts one-byte operands). Accumulation in fp32 in the WGMMA accumulator throughout,
as cuBLAS's ``use_fast_accum=True``: no promotion into a second accumulator every few
k-blocks (what ``use_fast_accum=False`` asks of cuBLAS), so the lowering offers this
kernel only for fast accumulation.

The scales (fp32) and the bias are ``(M, N, L)`` views broadcasting along what they do
not vary with (``views.broadcast_mnl``): a tensorwise scale strides 0 everywhere, a
rowwise one along M (A's, ``(M, 1)``) or N (B's, ``(1, N)``), the bias vector along N.
Per epilogue sub-tile they are loaded one sub-tile ahead like the bias
(``EpilogueHooks.gather_mn``; loads of one address, a tensorwise scale's, are one
load to the compiler), then ``acc * scale_a * scale_b`` and the default epilogue's
``+ bias``.

The scales travel as the first element of ``epi_args``, ``((scale_a, scale_b),
rest)``: the hooks here take them out and hand ``rest`` on, so a subclass that fuses
more (the template's) calls these hooks for the scaled value and reads its own inputs
from ``epi_args[1]``. Swap-AB (C^T = B A^T) needs nothing here: the views are made in the
kernel's (M, N), the caller's swapped.
"""

# No ``from __future__ import annotations``: CuTe DSL reads the hooks' signatures.
import cutlass
import cutlass.cute as cute

from .sm90_gemm import Sm90Gemm

__all__ = ["Sm90ScaledGemm"]


class Sm90ScaledGemm(Sm90Gemm):
    """``Sm90Gemm`` with FP8 operands and per-tensor or per-row/column fp32 scales."""

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor,
                 mScaleA: cute.Tensor, mScaleB: cute.Tensor, mBias, stream):
        """Launch ``C = scale_a * scale_b * (A @ B^T) + bias``: A (M, K, L), B (N, K, L),
        C (M, N, L), the scales and the bias (or None) (M, N, L) views (see the module
        docstring). With the TVM-FFI ABI and an environment stream the compiled function is
        called as ``f(A, B, C, scale_a, scale_b, Bias_or_None)``."""
        self.launch(mA, mB, mC, mBias, 1, 1, stream, epi_args=((mScaleA, mScaleB), None))

    @cute.jit
    def epilogue_prefetch(self, coords, l_idx, prob_m, prob_n, mBias, epi_args):
        """The scales' values at ``coords`` and the default prefetch (the bias)."""
        scale_a, scale_b = epi_args[0]
        return (self.gather_mn(scale_a, coords, l_idx, prob_m, prob_n),
                self.gather_mn(scale_b, coords, l_idx, prob_m, prob_n),
                Sm90Gemm.epilogue_prefetch(self, coords, l_idx, prob_m, prob_n, mBias, None))

    @cute.jit
    def epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta, epi_args,
                    prefetched):
        """``acc * scale_a * scale_b``, then the default epilogue (``+ bias``)."""
        scale_a, scale_b, bias = prefetched
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            acc[i] = acc[i] * (scale_a[i] * scale_b[i])
        Sm90Gemm.epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta,
                             None, bias)
