"""What the GEMM's mainloop multiplies: one weight (``GemmOperands``) or SwiGLU's two
(``SwigluOperands``: ``silu(A @ B^T) * (A @ B_up^T)``, or with the weights in A's place
``silu(A @ B^T) * (A_up @ B^T)``, the swap-AB form).

``Sm90Gemm`` asks its operands object, at each step where the two differ, for the TMA
atoms of the extra weight, the copies of one pipeline stage, the fragments and
accumulators, the WGMMAs of one k-block and the value an accumulator pair becomes.
The second weight's tile of ring stage s sits in its operand's slot ``stages + s``;
where the two weight tiles of a stage, side by side (slots 2s and 2s + 1), are the smem
layout of one tile twice as wide (``SwigluOperands.wide``, decided when the kernel is
traced), one WGMMA of that width computes both accumulators, as the two halves of one,
and A's tile is read once per k-block instead of twice.

Every method runs while the kernel is traced; none holds state between two traces
except ``wide`` and the layouts ``setup`` derives, which the trace of ``launch`` sets.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import cpasync, warpgroup

from .ptx import opaque_copy

_FP8 = (cutlass.Float8E4M3FN, cutlass.Float8E5M2)


class Loads:
    """The producer's TMA copies: atoms, smem destinations (all slots), gmem sources
    (the partitions, or one tile's k-tiles: ``tile_loads``), multicast masks and L2 policies
    of A and B. A plain holder of loop-invariant values: inside the DSL's loops and
    branches it is only read, never called (a called plain object would be carried)."""

    def __init__(self, tma_a, tma_b, tma_up, sA, sB, src_a, src_b, src_up, mask_a, mask_b,
                 policy_a, policy_b):
        self.tma_a, self.tma_b, self.tma_up, self.sA, self.sB = tma_a, tma_b, tma_up, sA, sB
        self.src_a, self.src_b, self.src_up = src_a, src_b, src_up
        self.mask_a, self.mask_b, self.policy_a, self.policy_b = mask_a, mask_b, policy_a, policy_b



class Fragments:
    """A consumer warpgroup's WGMMA operands and accumulators (``wide_*``: those of the
    one WGMMA twice as wide, where SwiGLU's two weight tiles make one; ``a_smem``,
    ``a_coords``: a transformed A's smem elements and coordinates, ``transform_a.py``)."""

    def __init__(self, a, b, acc, acc_up, wide_a=None, wide_b=None, acc_both=None,
                 a_smem=None, a_coords=None):
        self.a, self.b, self.acc, self.acc_up = a, b, acc, acc_up
        self.wide_a, self.wide_b, self.acc_both = wide_a, wide_b, acc_both
        self.a_smem, self.a_coords = a_smem, a_coords


class GemmOperands:
    """A GEMM: one A tile and one B tile per stage, one accumulator."""

    a_tiles, b_tiles = 1, 1
    side = ""  # which operand holds two weights
    wide = False
    combines = False  # math between the accumulators and the epilogue (SwiGLU's)

    def __init__(self, gemm: Any) -> None:
        self.gemm = gemm

    def check_dtypes(self, a_dtype: Any, b_dtype: Any) -> None:
        sixteen = a_dtype in (cutlass.BFloat16, cutlass.Float16) and a_dtype == b_dtype
        if not (sixteen or (a_dtype in _FP8 and b_dtype in _FP8)):
            raise ValueError(f"Sm90Gemm: A/B must both be bf16 or fp16, or both FP8 (e4m3, "
                             f"e5m2), got {a_dtype}/{b_dtype}")

    def make_tiled_mma(self, a_layout: Any, b_layout: Any) -> Any:
        """The GEMM's WGMMAs (``gemm.tiled_mma``), both operands from shared memory (FP8
        ones K-major: the only layout FP8 WGMMA reads there)."""
        gemm = self.gemm
        if gemm.a_dtype in _FP8 and not (a_layout.is_k_major_a() and b_layout.is_k_major_b()):
            raise ValueError("Sm90Gemm: FP8 WGMMA reads K-major A and B only (torch's A "
                             "row-major, B column-major)")
        return sm90_utils.make_trivial_tiled_mma(
            gemm.a_dtype, gemm.b_dtype, a_layout.sm90_mma_major_mode(),
            b_layout.sm90_mma_major_mode(), gemm.acc_dtype, gemm.mma_atom_layout,
            tiler_mn=(64, gemm.tile_n))

    def setup(self, a_layout: Any, b_layout: Any, a_dtype: Any, b_dtype: Any) -> None:
        """Trace-time layouts beyond the GEMM's own (``gemm.tiled_mma``, ``gemm.sB_layout``)."""
        self.tiled_mma_up = self.gemm.tiled_mma
        self.sB_up_layout = self.gemm.sB_layout

    def bind(self, prob_m: Any, prob_k: Any, pro_args: Any) -> None:
        """The kernel's values a transformed A reads (none here)."""

    def check_weights(self, mA_up: Any, mB_up: Any) -> None:
        given = ("a" if mA_up is not None else "") + ("b" if mB_up is not None else "")
        if given != self.side:
            raise ValueError(f"Sm90Gemm: swiglu={self.side!r} was given the second "
                             f"weight(s) of {given!r}")

    def up_tma(self, a_op: Any, b_op: Any, mA_up: Any, mB_up: Any) -> tuple[Any, Any]:
        """The second weight's TMA atom and tensor, or (None, None)."""
        return None, None

    def prefetch_descriptors(self, tma_up: Any) -> None:
        pass

    def partition_up(self, tma_up: Any, t_up: Any, sA: Any, sB: Any, cta_crd: Any) -> Any:
        """The second weight's gmem partition (its k-tiles per tile), or None."""
        return None

    def tile_loads(self, loads: Loads, m_t: Any, n_t: Any, l_t: Any) -> Loads:
        """``loads`` with the k-tiles of output tile (m_t, n_t, l_t) as sources."""
        return Loads(loads.tma_a, loads.tma_b, loads.tma_up, loads.sA, loads.sB,
                     loads.src_a[(None, m_t, None, l_t)], loads.src_b[(None, n_t, None, l_t)],
                     self.tile_up(loads.src_up, m_t, n_t, l_t), loads.mask_a, loads.mask_b,
                     loads.policy_a, loads.policy_b)

    def tile_up(self, tUg: Any, m_t: Any, n_t: Any, l_t: Any) -> Any:
        """The second weight's k-tiles of output tile (m_t, n_t, l_t), or None."""
        return None

    def b_slot(self, index: Any) -> Any:
        """B's smem slot of ring stage ``index``."""
        return index

    def load_stage(self, loads: Loads, k_idx: Any, index: Any, bar: Any) -> None:
        """The TMA copies of k-tile ``k_idx`` into ring stage ``index`` (barrier ``bar``)."""
        cute.copy(loads.tma_a, loads.src_a[(None, k_idx)], loads.sA[(None, index)],
                  tma_bar_ptr=bar, mcast_mask=loads.mask_a, cache_policy=loads.policy_a)
        cute.copy(loads.tma_b, loads.src_b[(None, k_idx)], loads.sB[(None, self.b_slot(index))],
                  tma_bar_ptr=bar, mcast_mask=loads.mask_b, cache_policy=loads.policy_b)

    def mainloop_mma(self, tiled_mma: Any, tiled_mma_up: Any) -> Any:
        """The tiled MMA whose ACCUMULATE flag the mainloop drives."""
        return tiled_mma

    def fragments(self, tiled_mma: Any, tiled_mma_up: Any, wg_thread: Any, sA: Any,
                  sB: Any, sB_up: Any, ctid: Any = None) -> Fragments:
        """The WGMMA fragments of the slice of consumer warpgroup thread ``wg_thread`` and
        its accumulators (``sB_up()``: the smem view of the wide B tiles; ``ctid``: the
        thread in the tile's consumers)."""
        a, b = self.operand_fragments(tiled_mma, wg_thread, sA, sB)
        return Fragments(a, b, self.accumulator(tiled_mma), None)

    def operand_fragments(self, tiled_mma: Any, wg_thread: Any, sA: Any, sB: Any) -> Any:
        wg_mma = tiled_mma.get_slice(wg_thread)
        tCsA, tCsB = wg_mma.partition_A(sA), wg_mma.partition_B(sB)
        return tiled_mma.make_fragment_A(tCsA), tiled_mma.make_fragment_B(tCsB)

    def accumulator(self, tiled_mma: Any) -> Any:
        return cute.make_rmem_tensor(self.acc_shape(tiled_mma), self.gemm.acc_dtype)

    def acc_shape(self, tiled_mma: Any) -> Any:
        return tiled_mma.partition_shape_C((self.gemm.tile_m, self.gemm.tile_n))

    def begin_stage(self) -> None:
        """Before a ring stage's WGMMAs: the fence, once per stage (per k-block the
        compiler would inject its own: ptxas C7519)."""
        warpgroup.fence()

    def end_stage(self) -> None:
        """After a ring stage's WGMMAs: one commit group, of which the one before (the
        previous stage's) has then completed."""
        warpgroup.commit_group()
        warpgroup.wait_group(1)

    def k_blocks(self, frags: Fragments) -> int:
        return cute.size(frags.a, mode=[2])

    def gemm_k_block(self, mma: Any, frags: Fragments, kb: int, index: Any, k_idx: Any,
                     tile: Any) -> None:
        """The WGMMAs of k-block ``kb`` of ring stage ``index`` (k-tile ``k_idx`` of output
        tile ``tile``)."""
        cute.gemm(mma, frags.acc, frags.a[(None, None, kb, index)],
                  frags.b[(None, None, kb, index)], frags.acc)

    def value(self, acc: Any, acc_up: Any, i: Any, released: Any) -> Any:
        """Value ``i`` of the tile's result before the epilogue, read through an opaque
        copy (``ptx.opaque_copy``); ``released``: the zero read after the tile's
        last ring slot is released, or None."""
        return opaque_copy(acc[i], released)


class SwigluOperands(GemmOperands):
    """Two weights of one shape and layout, in A's place (``side="a"``) or B's (``"b"``):
    two tiles of that operand per stage, an accumulator per weight (same layout, so
    value i of one pairs with value i of the other)."""

    combines = True

    def __init__(self, gemm: Any, side: str) -> None:
        super().__init__(gemm)
        self.side = side
        self.a_tiles, self.b_tiles = gemm.config.operand_tiles

    def setup(self, a_layout: Any, b_layout: Any, a_dtype: Any, b_dtype: Any) -> None:
        super().setup(a_layout, b_layout, a_dtype, b_dtype)
        gemm = self.gemm
        self.wide = self.side == "b" and self._wide_tile(b_layout, b_dtype)
        if self.wide:
            self.tiled_mma_up = sm90_utils.make_trivial_tiled_mma(
                a_dtype, b_dtype, a_layout.sm90_mma_major_mode(),
                b_layout.sm90_mma_major_mode(), gemm.acc_dtype, gemm.mma_atom_layout,
                tiler_mn=(64, 2 * gemm.tile_n),
            )
            self.sB_up_layout = sm90_utils.make_smem_layout_b(
                b_layout, (gemm.tile_m, 2 * gemm.tile_n, gemm.tile_k), b_dtype, gemm.stages)

    def _wide_tile(self, b_layout: Any, b_dtype: Any) -> bool:
        """Whether two (tile_n, tile_k) weight tiles in consecutive slots of the B
        layout are, element for element, one (2 tile_n, tile_k) tile of the same kind of
        layout, which one WGMMA of N = 2 tile_n (at most 256) can read. K-major: the
        swizzle atom spans the whole tile_k (atoms tile N first, so a slot is tile_n
        rows in a row). N-major: atoms tile K first, so a slot is whole 64-element
        column blocks; tile_n must fill the 128-byte swizzle atom at both widths."""
        row_bytes = b_dtype.width // 8
        if 2 * self.gemm.tile_n > 256:
            return False
        if b_layout.is_k_major_b():
            return self.gemm.tile_k * row_bytes <= 128
        return self.gemm.tile_n * row_bytes % 128 == 0

    def up_tma(self, a_op: Any, b_op: Any, mA_up: Any, mB_up: Any) -> tuple[Any, Any]:
        gemm = self.gemm
        if self.side == "a":
            return cpasync.make_tiled_tma_atom(
                a_op, mA_up, cute.slice_(gemm.sA_layout, (None, None, 0)),
                (gemm.tile_m, gemm.tile_k), num_multicast=gemm.cluster_n)
        return cpasync.make_tiled_tma_atom(
            b_op, mB_up, cute.slice_(gemm.sB_layout, (None, None, 0)),
            (gemm.tile_n, gemm.tile_k), num_multicast=gemm.cluster_m)

    def prefetch_descriptors(self, tma_up: Any) -> None:
        cpasync.prefetch_descriptor(tma_up)

    def partition_up(self, tma_up: Any, t_up: Any, sA: Any, sB: Any, cta_crd: Any) -> Any:
        # the smem side partitions as its operand's (same box), the gmem side is the up
        # weight's
        gemm = self.gemm
        if self.side == "a":
            _, tUg = cpasync.tma_partition(
                tma_up, cta_crd[1], cute.make_layout(gemm.cluster_n),
                cute.group_modes(sA, 0, 2), cute.group_modes(
                    cute.local_tile(t_up, (gemm.tile_m, gemm.tile_k), (None, None, None)), 0, 2))
        else:
            _, tUg = cpasync.tma_partition(
                tma_up, cta_crd[0], cute.make_layout(gemm.cluster_m),
                cute.group_modes(sB, 0, 2), cute.group_modes(
                    cute.local_tile(t_up, (gemm.tile_n, gemm.tile_k), (None, None, None)), 0, 2))
        return tUg

    def tile_up(self, tUg: Any, m_t: Any, n_t: Any, l_t: Any) -> Any:
        return tUg[(None, m_t if self.side == "a" else n_t, None, l_t)]

    def b_slot(self, index: Any) -> Any:
        return 2 * index if self.wide else index

    def load_stage(self, loads: Loads, k_idx: Any, index: Any, bar: Any) -> None:
        GemmOperands.load_stage(self, loads, k_idx, index, bar)
        stages = self.gemm.stages
        if self.side == "a":
            cute.copy(loads.tma_up, loads.src_up[(None, k_idx)], loads.sA[(None, stages + index)],
                      tma_bar_ptr=bar, mcast_mask=loads.mask_a, cache_policy=loads.policy_a)
        else:
            slot = 2 * index + 1 if self.wide else stages + index
            cute.copy(loads.tma_up, loads.src_up[(None, k_idx)], loads.sB[(None, slot)],
                      tma_bar_ptr=bar, mcast_mask=loads.mask_b, cache_policy=loads.policy_b)

    def mainloop_mma(self, tiled_mma: Any, tiled_mma_up: Any) -> Any:
        return tiled_mma_up if self.wide else tiled_mma

    def fragments(self, tiled_mma: Any, tiled_mma_up: Any, wg_thread: Any, sA: Any,
                  sB: Any, sB_up: Any, ctid: Any = None) -> Fragments:
        a, b = self.operand_fragments(tiled_mma, wg_thread, sA, sB)
        if not self.wide:
            return Fragments(a, b, self.accumulator(tiled_mma), self.accumulator(tiled_mma))
        # One accumulator (tm, 2 tn): the gate's columns, then the up projection's; acc
        # and acc_up are its two halves, value for value in the layout of a (tm, tn)
        # accumulator (value mode (2, 2, columns / 8)).
        tm, tn = self.gemm.tile_m, self.gemm.tile_n
        wg_mma_up = tiled_mma_up.get_slice(wg_thread)
        sB_up = sB_up()
        wide_a = tiled_mma_up.make_fragment_A(wg_mma_up.partition_A(sA))
        wide_b = tiled_mma_up.make_fragment_B(wg_mma_up.partition_B(sB_up))
        acc_both = cute.make_rmem_tensor(tiled_mma_up.partition_shape_C((tm, 2 * tn)),
                                         self.gemm.acc_dtype)
        acc_shape = self.acc_shape(tiled_mma)
        half = cute.make_layout(
            acc_shape, stride=((1, 2, 4), tn, tn * cute.size(acc_shape, mode=[1])))
        return Fragments(a, b, cute.make_tensor(acc_both.iterator, half),
                         cute.make_tensor(acc_both.iterator + tn // 2, half),
                         wide_a, wide_b, acc_both)

    def gemm_k_block(self, mma: Any, frags: Fragments, kb: int, index: Any, k_idx: Any,
                     tile: Any) -> None:
        if self.wide:
            # both weights' tiles of this stage, as one tile 2 tn wide
            cute.gemm(mma, frags.acc_both, frags.wide_a[(None, None, kb, index)],
                      frags.wide_b[(None, None, kb, index)], frags.acc_both)
        else:
            GemmOperands.gemm_k_block(self, mma, frags, kb, index, k_idx, tile)
            # the up projection's tile: the doubled operand's slot stages + s, the other
            # operand's tile shared
            up_a = self.gemm.stages * (self.side == "a") + index
            up_b = self.gemm.stages * (self.side == "b") + index
            cute.gemm(mma, frags.acc_up, frags.a[(None, None, kb, up_a)],
                      frags.b[(None, None, kb, up_b)], frags.acc_up)

    def value(self, acc: Any, acc_up: Any, i: Any, released: Any,
              scales: Any = None) -> Any:
        """``silu(gate) * up`` (``g * 1 / (1 + exp(-g))`` with the hardware exp and
        reciprocal, as Inductor's own kernels compute silu); with ``scales``, the (gate's,
        up's) factors of FP8 operands, each accumulator scaled by its own first."""
        gate = opaque_copy(acc[i], released)
        if scales is not None:
            gate = gate * scales[0]
        silu = gate * cute.arch.rcp_approx(1.0 + cute.math.exp(-gate, fastmath=True))
        up = opaque_copy(acc_up[i], released)
        return silu * (up if scales is None else up * scales[1])


def make_operands(gemm: Any, swiglu: str) -> GemmOperands:
    return SwigluOperands(gemm, swiglu) if swiglu else GemmOperands(gemm)

