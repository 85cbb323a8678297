"""``GemmConfig``: one configuration of the Hopper GEMM, the one home of its defaults and
validation, and the resource arithmetic that decides whether a config fits an SM.

A config is frozen and valid by construction: ``GemmConfig(...)`` raises ``ValueError``
with the first rule it breaks (``config_error`` returns that message instead). Its
fields are the kernel's compile-time constants (``Sm90Gemm``'s constructor takes them)
plus ``swap_ab``, which is the caller's: a swap-AB config computes ``C^T = B A^T``, the
template passing the kernel (B, A, C^T). The dtype helpers accept torch dtypes, CuTe DSL
numeric types and the short names "bf16", "fp16", "fp32", "e4m3", "e5m2" (FP8 operands:
``FP8_DTYPES``). A config holds no dtype but ``fp8``: its resources are checked for
16-bit operands (an fp32 A where it transforms A), or with ``fp8`` for one-byte ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ...compile.dtypes import cutlass_dtype_name
from ..sm90 import SMEM_BYTES

__all__ = [
    "GemmConfig", "config_error", "gemm_dtype", "dtype_bytes", "DEFAULT_GROUP_SIZE",
    "FP8_DTYPES", "SPLIT_K_CHOICES", "TILE_N_CHOICES",
]

# Reserved for mbarriers + alignment padding of the smem carve-out.
SMEM_RESERVED = 1024 + 256
MAX_CLUSTER_CTAS = 8  # the portable cluster size
MAX_ACC_REGS = 192  # fp32 accumulator registers per consumer thread (of 232)
SPLIT_K_CHOICES = (1, 2, 4, 8)  # 8 = the portable maximum cluster size
DEFAULT_GROUP_SIZE = 8  # clusters per band of the swizzled raster
# 224: 14336 / 224 = 64 N tiles; 96: SwiGLU's two accumulators of a 256x192 GEMM tile.
TILE_N_CHOICES = (16, 32, 64, 96, 128, 192, 224, 256)
TILE_K_CHOICES = (32, 64, 128)

_SHORT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                 "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
_GEMM_DTYPES = tuple(_SHORT_DTYPES.values())
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)  # operands of the scaled GEMM only


def gemm_dtype(dt: Any) -> Optional[torch.dtype]:
    """``dt`` (torch dtype, CuTe DSL numeric type, a short name of ``_SHORT_DTYPES`` or a
    torch dtype's name) as one of the torch dtypes the GEMM knows (bf16, fp16, fp32 and
    the FP8 operand types), else None."""
    if isinstance(dt, str):
        dt = _SHORT_DTYPES.get(dt) or getattr(torch, dt.removeprefix("torch."), None)
    if isinstance(dt, torch.dtype):
        return dt if dt in _GEMM_DTYPES else None
    name = getattr(dt, "__name__", None)
    return next((t for t in _GEMM_DTYPES if cutlass_dtype_name(t) == f"cutlass.{name}"), None)


def dtype_bytes(dt: Any, default: int = 2) -> int:
    """Bytes per element of ``dt`` (see ``gemm_dtype``); ``default`` where it is None or
    unknown."""
    known = gemm_dtype(dt)
    return known.itemsize if known is not None else default


def epilogue_bytes(c_bytes: int, wgs: int) -> int:
    """The TMA-store buffers of ``wgs`` consumer warpgroups' epilogue sub-tiles."""
    return 64 * wgs * 32 * c_bytes * epilogue_stages(c_bytes)


def epilogue_stages(c_bytes: int) -> int:
    return 4 if c_bytes <= 2 else 2


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"GemmConfig: {message}")


@dataclass(frozen=True)
class GemmConfig:
    """One configuration of ``Sm90Gemm`` (see ``sm90_gemm``'s docstring for the design).

    :param tile_m: CTA tile M: 64 or 128 with ``cooperative=False`` (per warpgroup with
        ``pingpong``), 128 or 256 with ``cooperative=True``.
    :param tile_n: CTA tile N, one of ``TILE_N_CHOICES``; below 64 only with
        ``store="direct"``.
    :param tile_k: CTA tile K (one pipeline stage): 32, 64 or 128.
    :param cluster_m: CTAs per cluster along M (1 or 2); B is multicast.
    :param cluster_n: CTAs per cluster along N (1 or 2); A is multicast.
    :param stages: smem ring depth; 0 = as many as fit (at most 8).
    :param raster: "m" or "n": the fast direction of the persistent walk.
    :param group_size: band width (in clusters) of the swizzled raster.
    :param cooperative: two consumer warpgroups share one tile (True) or one owns it.
    :param pingpong: two consumer warpgroups take alternate tiles (``cooperative=False``).
    :param store: "tma" (smem + TMA store; ``N * sizeof(C)`` a multiple of 16 bytes) or
        "direct" (predicated stores from registers, any N).
    :param split_k: CTAs of a cluster sharing one output tile, each over its own K range,
        reduced through distributed shared memory.
    :param swiglu: "" (a GEMM), "b" (``silu(A @ B^T) * (A @ B_up^T)``) or "a"
        (``silu(A @ B^T) * (A_up @ B^T)``).
    :param swap_ab: the caller computes ``C^T = B A^T`` (small M); the tile is C^T's.
    :param transform_a: A is loaded in its own dtype (fp32, bf16 or fp16), transformed
        elementwise in registers (the ``prologue_op`` hook: a fused prologue) and
        converted to B's dtype for WGMMAs that read A from registers
        (``transform_a.py``); not with ``swiglu``, ``swap_ab`` or split-K.
    :param fp8: the operands are FP8 (one byte each, K-major: ``scaled.py``'s
        ``Sm90ScaledGemm``, SwiGLU's two weights too); the shared-memory check counts
        one-byte operands. Not with ``transform_a``.
    :param pdl: launched with programmatic dependent launch: the grid may start while the
        previous kernel on the stream ends, its setup (barriers, descriptor prefetch)
        overlapping that kernel's tail; it waits for that kernel (``griddepcontrol.wait``)
        before touching global memory, so stream order holds as without it.
    """

    tile_m: int = 128
    tile_n: int = 128
    tile_k: int = 64
    cluster_m: int = 1
    cluster_n: int = 1
    stages: int = 0
    raster: str = "m"
    group_size: int = DEFAULT_GROUP_SIZE
    cooperative: bool = True
    pingpong: bool = False
    store: str = "tma"
    split_k: int = 1
    swiglu: str = ""
    swap_ab: bool = False
    transform_a: bool = False
    fp8: bool = False
    pdl: bool = False

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kind = {"int": int, "bool": bool, "str": str}[field.type]
            _require(isinstance(value, kind) and (kind is bool or not isinstance(value, bool)),
                     f"{field.name}={value!r} must be a {field.type}")
        self._check_kernel()
        self._check_resources()
        _require(not self.swap_ab or self.store == "direct",
                 "swap_ab=True needs store='direct' (C^T is column-major)")
        _require(not (self.transform_a and (self.swiglu or self.swap_ab or self.split_k > 1)),
                 "transform_a=True needs swiglu='', swap_ab=False and split_k=1 (it "
                 "transforms the activation, which is A there)")
        _require(not (self.fp8 and self.transform_a), "fp8=True needs transform_a=False")

    def _check_kernel(self) -> None:
        _require(self.store in ("tma", "direct"), f"store={self.store!r} must be 'tma' or 'direct'")
        _require(self.split_k in SPLIT_K_CHOICES,
                 f"split_k={self.split_k} not in {SPLIT_K_CHOICES}")
        ctas = self.cluster_m * self.cluster_n * self.split_k
        _require(ctas <= MAX_CLUSTER_CTAS,
                 f"cluster_m * cluster_n * split_k = {ctas} CTAs per cluster (the cluster "
                 f"holds the K split), more than {MAX_CLUSTER_CTAS}")
        _require(not (self.pingpong and self.cooperative),
                 "pingpong=True needs cooperative=False (each warpgroup owns its tiles)")
        _require(not (self.pingpong and self.split_k > 1),
                 f"split_k={self.split_k} needs pingpong=False")
        allowed_m = (128, 256) if self.cooperative else (64, 128)
        _require(self.tile_m in allowed_m,
                 f"tile_m={self.tile_m} not in {allowed_m} (cooperative={self.cooperative})")
        _require(self.tile_n in TILE_N_CHOICES, f"tile_n={self.tile_n} not in {TILE_N_CHOICES}")
        _require(self.tile_n >= 64 or self.store == "direct",
                 f"tile_n={self.tile_n} needs store='direct' (the TMA store's sub-tile is "
                 "32 columns of a tile of at least 64)")
        _require(self.tile_k in TILE_K_CHOICES, f"tile_k={self.tile_k} not in {TILE_K_CHOICES}")
        _require(self.swiglu in ("", "a", "b"), f"swiglu={self.swiglu!r} must be '', 'a' or 'b'")
        _require(not (self.swiglu and self.split_k > 1),
                 f"split_k={self.split_k} needs swiglu=''")

    def _check_resources(self) -> None:
        wgs = self.tile_wgs
        if self.tile_m * self.tile_n * max(self.operand_tiles) > MAX_ACC_REGS * 128 * wgs:
            what = "two accumulators of a " if self.swiglu else ""
            _require(False, f"{what}tile {self.tile_m}x{self.tile_n} need(s) more than "
                            f"{MAX_ACC_REGS} accumulator registers per thread with {wgs} "
                            "consumer warpgroup(s)")
        _require(self.cluster_m in (1, 2) and self.cluster_n in (1, 2),
                 f"cluster ({self.cluster_m},{self.cluster_n}) must have entries in (1, 2)")
        _require(self.raster in ("m", "n"), f"raster={self.raster!r} must be 'm' or 'n'")
        _require(self.group_size >= 1, f"group_size={self.group_size} must be >= 1")
        _require(self.stages == 0 or self.stages >= 2,
                 f"stages={self.stages} must be 0 (auto) or >= 2")
        # with the widest supported output (fp32), and an fp32 A where it is transformed
        ab_bytes = 1 if self.fp8 else 2
        if self.ring_stages(4 if self.transform_a else ab_bytes, 4, ab_bytes) < 2:
            extra = " next to the split-K reduction buffer" if self.split_k > 1 else ""
            _require(False, f"tile does not fit two pipeline stages in shared memory{extra}")

    # ------------------------------------------------------------ derived facts
    @property
    def name(self) -> str:
        """Short stable name, e.g. ``t128x256x64_c2x1_coop_rm`` (``_pp_`` for ping-pong,
        ``_k4`` for split_k=4, ``_swap`` for swap-AB, whose tile is C^T's, ``_swiglu``
        for the two-weight kernel, ``_g4`` for a raster band of 4 clusters instead of
        ``DEFAULT_GROUP_SIZE``, ``_s12`` for 12 stages, ``_ta`` for a transformed A,
        ``_fp8`` for FP8 operands, ``_pdl`` for programmatic dependent launch, ``_direct``
        for the direct store where swap-AB does not imply it)."""
        consumers = "pp" if self.pingpong else ("coop" if self.cooperative else "1wg")
        return "".join([
            f"t{self.tile_m}x{self.tile_n}x{self.tile_k}_c{self.cluster_m}x{self.cluster_n}",
            f"_{consumers}_r{self.raster}",
            f"_g{self.group_size}" if self.group_size != DEFAULT_GROUP_SIZE else "",
            f"_s{self.stages}" if self.stages else "",
            f"_k{self.split_k}" if self.split_k > 1 else "",
            "_swap" if self.swap_ab else "",
            "_swiglu" if self.swiglu else "",
            "_ta" if self.transform_a else "",
            "_fp8" if self.fp8 else "",
            "_pdl" if self.pdl else "",
            "_direct" if self.store == "direct" and not self.swap_ab else ""])

    def replace(self, **changes: Any) -> "GemmConfig":
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def tile_wgs(self) -> int:
        """Consumer warpgroups that share one tile (stacked along M)."""
        return 2 if self.cooperative else 1

    @property
    def consumer_wgs(self) -> int:
        return 2 if self.cooperative or self.pingpong else 1

    @property
    def operand_tiles(self) -> tuple[int, int]:
        """(A tiles, B tiles) per pipeline stage: two of the operand that holds two weights."""
        return (2 if self.swiglu == "a" else 1), (2 if self.swiglu == "b" else 1)

    def kernel_mn(self, m: int, n: int) -> tuple[int, int]:
        """The kernel's (M, N) for torch's problem: swapped under swap-AB."""
        return (n, m) if self.swap_ab else (m, n)

    def reduce_bytes(self) -> int:
        """The split-K reduction buffer: one fp32 accumulator tile (none without split)."""
        return self.tile_m * self.tile_n * 4 if self.split_k > 1 else 0

    def ring_stages(self, ab_bytes: int, c_bytes: int, b_bytes: Optional[int] = None) -> int:
        """The smem ring depth for these operand and output widths (A's ``ab_bytes``, B's
        ``b_bytes``, by default the same): the requested depth, or 0 where it does not
        fit; with ``stages=0`` as many as fit, at most 8. Ping-pong keeps one set of
        epilogue buffers per consumer warpgroup."""
        a_tiles, b_tiles = self.operand_tiles
        b_bytes = ab_bytes if b_bytes is None else b_bytes
        per_stage = (self.tile_m * a_tiles * ab_bytes
                     + self.tile_n * b_tiles * b_bytes) * self.tile_k
        budget = (SMEM_BYTES - SMEM_RESERVED
                  - epilogue_bytes(c_bytes, self.consumer_wgs) - self.reduce_bytes())
        fit = budget // per_stage
        if self.stages:
            return self.stages if self.stages <= fit else 0
        return min(fit, 8)

    def resident_clusters(self, num_sms: int) -> int:
        """Persistent clusters assumed co-resident on ``num_sms`` SMs: the default grid
        cap. A cluster must fit in one GPC (16-18 SMs on H100/H200), so split-K clusters
        of 4 or 8 CTAs strand a few SMs per GPC (the H200's occupancy query: 66, 30 and
        15 active clusters of 2, 4 and 8 CTAs); launching more would run the excess as a
        late second wave."""
        ctas = self.cluster_m * self.cluster_n * self.split_k
        if self.split_k == 1 or ctas <= 2:
            return max(1, num_sms // ctas)
        return max(1, num_sms * 15 // 16 // ctas)


def config_error(**fields: Any) -> Optional[str]:
    """Why ``GemmConfig(**fields)`` is invalid, or None if it is valid."""
    try:
        GemmConfig(**fields)
    except ValueError as err:
        return str(err)
    return None
