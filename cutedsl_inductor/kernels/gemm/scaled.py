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
from ``epi_args[1]``.

SwiGLU (``swiglu``, ``silu(x @ w_gate) * (x @ w_up)`` with FP8 x and weights): three
scales, ``(scale_x, scale_gate, scale_up)``, each a view in the kernel's (M, N) as
above (x's along M, the weights' along N; swapped under swap-AB, the weights then being
A). ``epilogue_values`` scales each accumulator value by ``scale_x`` and its own
weight's scale before ``silu(gate) * up`` (``operands.SwigluOperands.value``), and
``epilogue_op`` then applies no scale. Swap-AB (C^T = B A^T) needs nothing here: the views are made in the
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
        """The scales' values at ``coords`` (A's, B's, and with SwiGLU the up weight's)
        and the default prefetch (the bias)."""
        scales = epi_args[0]
        values = (self.gather_mn(scales[0], coords, l_idx, prob_m, prob_n),
                  self.gather_mn(scales[1], coords, l_idx, prob_m, prob_n))
        if cutlass.const_expr(len(scales) == 3):
            values = (*values, self.gather_mn(scales[2], coords, l_idx, prob_m, prob_n))
        return (values,
                Sm90Gemm.epilogue_prefetch(self, coords, l_idx, prob_m, prob_n, mBias, None))

    @cute.jit
    def epilogue_values(self, frag, acc, acc_up, start, released, prefetched):
        """SwiGLU: each accumulator scaled by the activation's scale and its own weight's
        before ``silu(gate) * up``; a GEMM's values as they are (``epilogue_op`` scales)."""
        if cutlass.const_expr(self.swiglu == ""):
            Sm90Gemm.epilogue_values(self, frag, acc, acc_up, start, released, prefetched)
        else:
            x_scale, gate_scale, up_scale = prefetched[0]
            for v in cutlass.range_constexpr(cute.size(frag)):
                frag[v] = self.operands.value(
                    acc, acc_up, start + v, released,
                    (x_scale[v] * gate_scale[v], x_scale[v] * up_scale[v]))

    @cute.jit
    def epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta, epi_args,
                    prefetched):
        """``acc * scale_a * scale_b`` (SwiGLU's values come scaled), then the default
        epilogue (``+ bias``)."""
        scales, bias = prefetched
        if cutlass.const_expr(self.swiglu == ""):
            for i in cutlass.range(cute.size(acc), unroll_full=True):
                acc[i] = acc[i] * (scales[0][i] * scales[1][i])
        Sm90Gemm.epilogue_op(self, acc, coords, l_idx, prob_m, prob_n, mBias, alpha, beta,
                             None, bias)
