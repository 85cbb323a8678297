"""The GEMM with a transformed A (``GemmConfig.transform_a``): a fused prologue applied
in the load path, the way a Hopper "mixed input" GEMM or FlashAttention-3's P @ V feed
WGMMA from registers.

The producer loads A by TMA into the ring in A's own dtype (fp32, bf16 or fp16; B is
bf16 or fp16). Per k-block of a stage each consumer thread reads its WGMMA A elements
from shared memory into registers (the register-A partition of the tiled MMA), calls
``prologue_op(value, m, k, l, pro_args)`` on each (fp32 in, fp32 out; the coordinates
clamped into the problem, so the hook's reads of other tensors stay in bounds), zeroes
elements past K (TMA zero-fills them, but a prologue such as ``x + 1`` would not keep
them zero and B's zeros would not cancel an inf), converts to B's dtype and issues the
k-block's WGMMA with A from registers.

Register reuse: each k-block of a stage has its own A registers and its own WGMMA
commit group, and a k-block's registers are rewritten (next stage) only once the WGMMA
that read them has completed: ``wait_group(k_blocks - 1)`` before the rewrite, which
leaves the other k-blocks' WGMMAs in flight while the threads transform the next one.
When a stage's k-blocks are issued, every WGMMA of the stage before has completed, so
the mainloop releases it as for the plain GEMM.

``PrologueHooks.prologue_op`` is the hook (identity by default); the template's fused
prologue overrides it. Everything here runs while the kernel is traced.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import warpgroup

from .operands import Fragments, GemmOperands

_SOURCE_DTYPES = (cutlass.Float32, cutlass.BFloat16, cutlass.Float16)


class PrologueHooks:
    """The fusion hook of ``transform_a``: override it in a subclass (``@cute.jit``)."""

    @cute.jit
    def prologue_op(self, value, m, k, l_idx, pro_args):
        """A's element (m, k) of batch ``l_idx`` as the WGMMA multiplies it: ``value`` is
        the element as loaded (fp32), the result is fp32 (converted to B's dtype by the
        kernel). ``m`` and ``k`` are clamped into the problem; ``pro_args`` is
        ``launch``'s pass-through value. Default: the value."""
        return value


class TransformedAOperands(GemmOperands):
    """One A tile (in A's dtype) and one B tile per stage; A transformed in registers."""

    def check_dtypes(self, a_dtype: Any, b_dtype: Any) -> None:
        if a_dtype not in _SOURCE_DTYPES or b_dtype not in (cutlass.BFloat16, cutlass.Float16):
            raise ValueError(f"Sm90Gemm: transform_a needs an fp32/bf16/fp16 A and a bf16 or "
                             f"fp16 B, got {a_dtype}/{b_dtype}")

    def make_tiled_mma(self, a_layout: Any, b_layout: Any) -> Any:
        """WGMMAs in B's dtype that read A from registers (K-major there)."""
        gemm = self.gemm
        return sm90_utils.make_trivial_tiled_mma(
            gemm.b_dtype, gemm.b_dtype, cute.nvgpu.OperandMajorMode.K,
            b_layout.sm90_mma_major_mode(), gemm.acc_dtype, gemm.mma_atom_layout,
            tiler_mn=(64, gemm.tile_n), a_source=warpgroup.OperandSource.RMEM)

    def bind(self, prob_m: Any, prob_k: Any, pro_args: Any) -> None:
        """The kernel's values the transform reads (trace-time state, as ``gemm.walk``)."""
        self.prob_m, self.prob_k, self.pro_args = prob_m, prob_k, pro_args

    def fragments(self, tiled_mma: Any, tiled_mma_up: Any, wg_thread: Any, sA: Any,
                  sB: Any, sB_up: Any, ctid: Any = None) -> Fragments:
        """B's smem fragment (the warpgroup's), A's registers and this thread's view of
        A's smem and of the tile's (m, k) coordinates, both in the registers' layout."""
        gemm = self.gemm
        thr_mma = tiled_mma.get_slice(ctid)
        b = tiled_mma.make_fragment_B(tiled_mma.get_slice(wg_thread).partition_B(sB))
        a = thr_mma.make_fragment_A(thr_mma.partition_shape_A((gemm.tile_m, gemm.tile_k)))
        coords = cute.make_identity_tensor((gemm.tile_m, gemm.tile_k))
        return Fragments(a, b, self.accumulator(tiled_mma), None,
                         a_smem=thr_mma.partition_A(sA), a_coords=thr_mma.partition_A(coords))

    def begin_stage(self) -> None:
        pass  # each k-block fences its own registers

    def end_stage(self) -> None:
        pass  # each k-block is a commit group

    def k_blocks(self, frags: Fragments) -> int:
        return self.gemm.tile_k // 16  # WGMMA's K for 16-bit types

    @cute.jit
    def gemm_k_block(self, mma, frags, kb, index, k_idx, tile):
        """Wait for the WGMMA that last read k-block ``kb``'s registers, transform, issue
        (one commit group)."""
        warpgroup.wait_group(self.k_blocks(frags) - 1)
        self.transform_block(frags, kb, index, k_idx, tile)
        warpgroup.fence()
        cute.gemm(mma, frags.acc, frags.a[(None, None, kb)], frags.b[(None, None, kb, index)],
                  frags.acc)
        warpgroup.commit_group()

    @cute.jit
    def transform_block(self, frags: Fragments, kb: int, index: Any, k_idx: Any,
                        tile: Any) -> None:
        """A's registers of k-block ``kb``: loaded from stage ``index``, transformed,
        zero past K, converted to B's dtype."""
        gemm = self.gemm
        src = frags.a_smem[(None, None, kb, index)]
        coords = frags.a_coords[(None, None, kb)]
        raw = cute.make_rmem_tensor(src.shape, gemm.a_dtype)
        for i in cutlass.range_constexpr(cute.size(raw)):
            raw[i] = src[i]
        values = cute.make_rmem_tensor(src.shape, cutlass.Float32)
        m0 = tile[0] * gemm.tile_m
        k0 = k_idx * gemm.tile_k
        for i in cutlass.range_constexpr(cute.size(raw)):
            mk = coords[i]
            m = m0 + mk[0]
            k = k0 + mk[1]
            value = gemm.prologue_op(raw[i].to(cutlass.Float32), min(m, self.prob_m - 1),
                                     min(k, self.prob_k - 1), tile[2], self.pro_args)
            values[i] = cutlass.select_(k < self.prob_k, value, cutlass.Float32(0.0))
        frags.a[(None, None, kb)].store(values.load().to(gemm.b_dtype))
