"""Inline-PTX pieces of the GEMM that the DSL has no op for, and the L2 cache-policy
encodings its TMA copies carry.

``opaque_copy`` and ``zero_after_release`` exist for ptxas's and LLVM's sake, not for the
math: they keep the epilogue's values off the WGMMA accumulator registers and after the
tile's last ring-slot release (``sm90_gemm``'s docstring says why each matters).
"""

from __future__ import annotations

from typing import Any

import cutlass
from cutlass._mlir.dialects import llvm

# The encodings of createpolicy.fractional.L2::evict_normal / evict_first with fraction
# 1, for the TMA copies' cache-policy operand; without one the DSL passes 0, which is no
# policy createpolicy makes.
EVICT_NORMAL = 0x1000000000000000
EVICT_FIRST = 0x12F0000000000000


def opaque_copy(x: Any, zero: Any = None) -> Any:
    """``x`` (fp32) through inline asm: a new value that LLVM cannot see through. With a
    plain copy LLVM would fold the copy away and, where a fusion hook writes its fragment
    in a divergent branch, coalesce the branch's result back into the WGMMA accumulator
    register -- which makes ptxas serialize the WGMMAs (C7519/C7520). With ``zero`` (a
    :func:`zero_after_release`) the copy is ``x + zero``: it, and all math on it, cannot
    start before that read."""
    if zero is None:
        return cutlass.Float32(llvm.inline_asm(
            cutlass.Float32.mlir_type, [cutlass.Float32(x).ir_value()], "mov.b32 $0, $1;",
            "=f,f", has_side_effects=False, is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT))
    return cutlass.Float32(llvm.inline_asm(
        cutlass.Float32.mlir_type,
        [cutlass.Float32(x).ir_value(), cutlass.Float32(zero).ir_value()],
        "add.f32 $0, $1, $2;", "=f,f,f", has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT))


def zero_after_release(slot_barrier: Any) -> Any:
    """+0.0, computed from a non-blocking ``mbarrier.test_wait`` on ``slot_barrier`` (the
    ring slot's empty barrier, just arrived on): 0 or 1 times 0. ptxas keeps that
    mbarrier operation after the arrive and cannot fold the product, so an epilogue value
    copied with it cannot be computed before the slot's release. Without it ptxas hoists
    a fused epilogue's register-only math (all sub-tiles of it, across the store
    barriers) above the conditional arrive that frees the tile's last ring slot, and the
    producer then waits on that slot for the whole epilogue."""
    return cutlass.Float32(llvm.inline_asm(
        cutlass.Float32.mlir_type, [slot_barrier.toint().ir_value()],
        "{ .reg .pred p; .reg .b32 t; mbarrier.test_wait.parity.shared::cta.b64 p, [$1], 0; "
        "selp.b32 t, 1, 0, p; cvt.rn.f32.u32 $0, t; mul.rn.f32 $0, $0, 0f00000000; }",
        "=f,r", has_side_effects=True, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT))
