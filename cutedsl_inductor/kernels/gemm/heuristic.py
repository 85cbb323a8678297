"""The GEMM's config space and the heuristic that ranks it for a problem.

``pick_configs(m, n, k, ...)`` ranks candidates by a cost model (waves x per-tile work /
tile efficiency); ``swiglu_configs`` derives the two-weight kernel's from it,
``fp8_swiglu_configs`` the FP8 two-weight kernel's from that, and
``fp8_configs`` the FP8 kernel's (not yet measured: the 16-bit ranking, its K tiles
twice as many elements). The
candidate lists hold configs measured to win somewhere on the H200 (the figures:
docs/measurements.md, "The GEMM's config space"); the model only orders them, so a
candidate that never wins is noise that can push a winner out of the offered few.
Everything returned is a valid ``GemmConfig``; swap-AB ones (``swap_ab=True``) are
scored on the swapped problem, as the template runs them.
"""

from __future__ import annotations

from typing import Any, Optional

from .config import GemmConfig, dtype_bytes

__all__ = ["DEFAULT_CONFIGS", "EXTRA_CONFIGS", "SPLIT_K_BASE_CONFIGS", "SWAP_AB_MAX_M",
           "fp8_configs", "fp8_swiglu_configs", "pick_configs", "swap_ab_configs",
           "swiglu_configs"]

_DEFAULT_NUM_SMS = 132  # H100 SXM / H200

DEFAULT_CONFIGS = [
    GemmConfig(128, 256, 64, cluster_m=2, raster="m"),
    GemmConfig(128, 256, 64, cluster_n=2, raster="n"),
    GemmConfig(256, 128, 64, cluster_n=2, raster="n"),
    GemmConfig(128, 256, 64, raster="m"),
    GemmConfig(128, 128, 64, cluster_m=2, raster="m"),
    GemmConfig(128, 128, 64, raster="m"),
    GemmConfig(64, 256, 64, raster="n", cooperative=False),
    GemmConfig(64, 128, 64, cluster_n=2, raster="n", cooperative=False),
    # 64 N tiles at N = 14336: whole waves where 128- and 256-wide tiles leave SMs idle
    GemmConfig(128, 224, 64, cluster_m=2, raster="m"),
    # 192 accumulator registers per thread, 22% less L2 -> smem traffic per FLOP than
    # 256x128; it loses at N = 4096 (22 tiles of 192), where the model ranks it low
    GemmConfig(256, 192, 64, cluster_n=2, raster="n"),
    # ping-pong: tile sizes are per consumer warpgroup (128x128 the largest offered)
    GemmConfig(128, 128, 64, cluster_m=2, pingpong=True, raster="m", cooperative=False),
    GemmConfig(128, 128, 64, cluster_n=2, pingpong=True, raster="n", cooperative=False),
    GemmConfig(64, 256, 64, cluster_n=2, pingpong=True, raster="n", cooperative=False),
]

# Small tiles, offered where the problem has few tiles.
EXTRA_CONFIGS = [
    GemmConfig(64, 64, 64, raster="n", cooperative=False),
    GemmConfig(64, 64, 128, raster="n", cooperative=False),  # half the pipeline round trips
    GemmConfig(128, 64, 64, raster="m", cooperative=False),
    GemmConfig(128, 128, 64, pingpong=True, raster="m", cooperative=False),
    # two M tiles share each B tile by multicast: where M spans a few tiles and the
    # weight is the whole stream, that halves B's L2 reads
    GemmConfig(64, 64, 128, cluster_m=2, raster="n", cooperative=False),
    GemmConfig(128, 64, 64, cluster_m=2, raster="m", cooperative=False),
    GemmConfig(64, 128, 64, cluster_m=2, raster="m", cooperative=False),
    GemmConfig(64, 224, 64, cluster_m=2, raster="n", cooperative=False),
]

# Split-K bases (``split_k`` from ``_SPLIT_K_FACTORS`` added), for problems whose output
# tiles cannot fill the SMs. Their reduction buffer leaves room for >= 3 stages.
SPLIT_K_BASE_CONFIGS = [
    GemmConfig(64, 64, 64, raster="n", cooperative=False),
    GemmConfig(64, 64, 64, raster="n", stages=12, cooperative=False),  # more of B in flight at small M
    GemmConfig(64, 128, 64, raster="n", cooperative=False),
    GemmConfig(64, 256, 64, raster="n", cooperative=False),
    GemmConfig(128, 128, 64, raster="m"),
    # pairs of M tiles that multicast B (the large operand at small M) to each other
    GemmConfig(64, 128, 64, cluster_m=2, raster="n", cooperative=False),
    GemmConfig(128, 128, 64, cluster_m=2, raster="m"),
]

# Swap-AB (M <= SWAP_AB_MAX_M): C^T = B A^T puts the weight's N rows in the WGMMA's M
# mode (64-row atoms) and torch's M in a tile_n of 16 or 32 (``swap_ab_configs``),
# instead of a 64-row tile that is mostly padding; C^T is written by the direct store.
# At M = 64 the swapped tiles only tied the unswapped ones.
SWAP_AB_MAX_M = 32
_SWAP = dict(tile_n=16, raster="m", store="direct", swap_ab=True)
_SWAP_AB_BASE_CONFIGS = [
    GemmConfig(64, tile_k=64, stages=16, **_SWAP, cooperative=False),
    GemmConfig(64, tile_k=64, cluster_m=2, stages=16, **_SWAP, cooperative=False),
    GemmConfig(128, tile_k=64, **_SWAP, cooperative=False),
    # 256-byte TMA box rows of a K-major weight (an nn.Linear's) instead of 128
    GemmConfig(128, tile_k=128, **_SWAP, cooperative=False),
    GemmConfig(128, tile_k=64, **_SWAP),
    GemmConfig(128, tile_k=64, cluster_m=2, **_SWAP),
    GemmConfig(256, tile_k=64, **_SWAP),
]

# No split of 8: it lost to 2 everywhere and its candidates pushed winners out.
_SPLIT_K_FACTORS = (2, 4)
# Split-K is considered while the output tiles fill less than this fraction of the SMs.
_SPLIT_K_MAX_FILL = 0.6
# A CTA's share of the reduce-scatter reads (split_k - 1) / split_k fp32 tiles through
# DSMEM: at ~32 B/clk against ~2048 WGMMA FMA/clk per SM a whole tile costs about as
# much as this many extra K elements of mainloop.
_SPLIT_K_REDUCE_K = 256

# Rough relative mainloop efficiency of a tile shape (bigger tiles reuse more).
_TILE_EFFICIENCY = {
    (256, 192): 1.03, (128, 256): 1.00, (256, 128): 1.00, (128, 224): 0.98, (128, 192): 0.95,
    (128, 128): 0.88, (64, 256): 0.80, (64, 224): 0.78, (128, 64): 0.70, (64, 128): 0.70,
    (64, 64): 0.55,
}
# Ping-pong tiles (per warpgroup) once every CTA has at least two tiles, so that the
# epilogues hide behind the other warpgroup's mainloop; with fewer, one warpgroup does
# the whole tile while the other idles: _PINGPONG_ONE_WAVE x the table above.
_PINGPONG_EFFICIENCY = {(128, 128): 0.97, (64, 256): 0.88}
_PINGPONG_ONE_WAVE = 0.9
# Two weight tiles per stage must leave room for this many stages (2 ran far slower).
_SWIGLU_MIN_STAGES = 3


def _ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def _valid(cfg: GemmConfig, **changes: Any) -> Optional[GemmConfig]:
    """``cfg`` with ``changes``, or None where that is no valid config."""
    try:
        return cfg.replace(**changes)
    except ValueError:
        return None


def swap_ab_configs(m: int) -> list[GemmConfig]:
    """The swap-AB candidates for an M <= SWAP_AB_MAX_M: C^T's N tile 16 or 32 wide."""
    tile_n = 16 if m <= 16 else 32
    return [cfg.replace(tile_n=tile_n) for cfg in _SWAP_AB_BASE_CONFIGS]


def _candidates(m: int, n: int, k: int, l: int, num_sms: int) -> list[GemmConfig]:
    """Every candidate for the problem: the fixed lists, swap-AB at small M, and the
    split-K variants where the output tiles fill few SMs and each split gets >= 2 K
    tiles (swap-AB ones on the swapped problem)."""
    candidates = list(DEFAULT_CONFIGS + EXTRA_CONFIGS)
    split_bases = list(SPLIT_K_BASE_CONFIGS)
    if m <= SWAP_AB_MAX_M:
        swapped = swap_ab_configs(m)
        candidates += swapped
        split_bases += swapped
    for cfg in split_bases:
        pm, pn = cfg.kernel_mn(m, n)
        tiles = _ceil_div(pm, cfg.tile_m) * _ceil_div(pn, cfg.tile_n) * l
        if tiles < _SPLIT_K_MAX_FILL * num_sms:
            k_tiles = _ceil_div(k, cfg.tile_k)
            candidates += [split for s in _SPLIT_K_FACTORS
                           if k_tiles >= 2 * s and (split := _valid(cfg, split_k=s))]
    return candidates


def _cost(cfg: GemmConfig, m: int, n: int, k: int, l: int, num_sms: int) -> float:
    """The model's time for ``cfg`` (lower is better)."""
    tm, tn = cfg.tile_m, cfg.tile_n
    cm, cn = cfg.cluster_m, cfg.cluster_n
    pm, pn = cfg.kernel_mn(m, n)
    tiles_m, tiles_n = _ceil_div(pm, tm), _ceil_div(pn, tn)
    clusters = _ceil_div(tiles_m, cm) * _ceil_div(tiles_n, cn) * l
    waves = _ceil_div(clusters, cfg.resident_clusters(num_sms))
    split_k = cfg.split_k
    k_work = max(_ceil_div(k, split_k), 64) + _SPLIT_K_REDUCE_K * (split_k - 1) / split_k
    efficiency = _TILE_EFFICIENCY.get((tm, tn), 0.6)
    if cfg.pingpong:
        efficiency = (_PINGPONG_EFFICIENCY.get((tm, tn), efficiency) if waves >= 2
                      else efficiency * _PINGPONG_ONE_WAVE)
    cost = waves * tm * tn * k_work / efficiency
    # Clusters whose partner CTA would sit entirely outside the problem waste an SM.
    if (cm > 1 and tiles_m < 2) or (cn > 1 and tiles_n < 2):
        cost *= 1.5
    bonus = 0.0
    if cm * cn > 1:  # multicast: less L2 traffic
        bonus -= 0.02
    if cfg.tile_k == 128:  # the model counts K elements, not k-tile round trips
        bonus -= 0.01
    if (cfg.raster == "m") == (tiles_m >= tiles_n):  # the fast direction has more tiles
        bonus -= 0.01
    return cost * (1.0 + bonus)


def pick_configs(m: int, n: int, k: int, dtype: Any = "bf16",
                 max_configs: Optional[int] = 8,
                 l: int = 1, num_sms: int = _DEFAULT_NUM_SMS,
                 out_dtype: Any = None) -> list[GemmConfig]:
    """Rank candidate configs for an (m, n, k, l) problem, best guess first: the first
    ``max_configs`` of them, or every one (``None``).

    Cost: waves x per-tile work / tile efficiency, partial tiles' padding counted as
    work; a ping-pong config gets its better efficiency only with at least two waves.
    Ties prefer multicast clusters and the raster whose fast direction has more tiles.
    A split-K candidate's per-tile work is ``ceil(k / split_k)`` plus the DSMEM
    reduction (``_SPLIT_K_REDUCE_K * (split_k - 1) / split_k`` K elements). When
    ``n * sizeof(out)`` is not a multiple of 16 bytes every config returned has
    ``store="direct"``. Both 16-bit input dtypes rank alike (``dtype`` is not used).
    """
    direct = (n * dtype_bytes(out_dtype or dtype)) % 16 != 0
    candidates = _candidates(m, n, k, l, num_sms)
    costs = {id(cfg): _cost(cfg, m, n, k, l, num_sms) for cfg in candidates}
    out: list[GemmConfig] = []
    for cfg in sorted(candidates, key=lambda c: (costs[id(c)], c.name)):
        cfg = cfg.replace(store="direct") if direct else cfg
        if cfg not in out:
            out.append(cfg)
        if max_configs is not None and len(out) >= max_configs:
            break
    return out


def swiglu_configs(m: int, n: int, k: int, dtype: Any = "bf16",
                   max_configs: Optional[int] = 8,
                   l: int = 1, out_dtype: Any = None) -> list[GemmConfig]:
    """Ranked configs of the two-weight kernel for an (m, n, k, l) problem.

    Where M <= ``SWAP_AB_MAX_M`` the swap-AB ones come first (``swiglu="a"``: the
    weights in A's place): the unsplit swapped candidates of :func:`pick_configs`, their
    stage count left to the kernel (two weight tiles per stage). Then ``swiglu="b"``:
    per output tile the WGMMA work of a GEMM tile twice as wide, so
    :func:`pick_configs`'s for N = 2n (unsplit, unswapped) at half their tile width
    where that width is a valid config (the direct store where ``n`` rows of the output
    are not whole 16-byte units). Configs whose two weight tiles leave room for fewer
    than ``_SWIGLU_MIN_STAGES`` stages are left out."""
    c_bytes = dtype_bytes(out_dtype or dtype)
    store = "direct" if (n * c_bytes) % 16 else "tma"
    candidates = []
    if m <= SWAP_AB_MAX_M:
        candidates += [
            _valid(cfg, stages=0, swiglu="a")
            for cfg in pick_configs(m, n, k, dtype, max_configs=None, l=l, out_dtype=out_dtype)
            if cfg.swap_ab and cfg.split_k == 1]
    candidates += [
        _valid(cfg, tile_n=cfg.tile_n // 2, swiglu="b", store=store)
        for cfg in pick_configs(m, 2 * n, k, dtype, max_configs=None, l=l,
                                out_dtype=out_dtype)
        if cfg.split_k == 1 and not cfg.swap_ab and cfg.tile_n % 2 == 0]
    out: list[GemmConfig] = []
    for cfg in candidates:
        if cfg is None or cfg in out:
            continue
        if cfg.ring_stages(2, c_bytes) >= _SWIGLU_MIN_STAGES:
            out.append(cfg)
        if max_configs is not None and len(out) >= max_configs:
            break
    return out


# An FP8 K tile: a stage of the bytes of a 16-bit one with K tile 64, rows of one 128-byte
# swizzle atom (FP8 WGMMA takes K = 32 per instruction).
_FP8_TILE_K = 128
# Accumulator registers per consumer thread an FP8 config may have: the scales' values
# (one sub-tile ahead) must fit next to them; the 256x192 tile's 192 spilled
# (docs/gemm.md, "FP8").
_FP8_MAX_ACC_REGS = 128


def fp8_configs(m: int, n: int, k: int, dtype: Any = "e4m3",
                max_configs: Optional[int] = 8, l: int = 1,
                out_dtype: Any = None) -> list[GemmConfig]:
    """Ranked configs of the FP8 kernel (``fp8=True``) for an (m, n, k, l) problem:
    :func:`pick_configs`'s order, each K tile ``_FP8_TILE_K`` elements (a config of
    the 16-bit ranking with a K tile of 128, 256-byte rows there, becomes one of 128-byte
    rows), each config once; an FP8 stage holds no more bytes than the 16-bit one it
    comes from, so every one fits. Tiles of more than ``_FP8_MAX_ACC_REGS``
    accumulator registers per thread are left out. ``out_dtype`` defaults to bf16."""
    return _as_fp8(pick_configs(m, n, k, dtype, max_configs=None, l=l,
                                out_dtype=out_dtype or "bf16"), 1, max_configs)


def fp8_swiglu_configs(m: int, n: int, k: int, dtype: Any = "e4m3",
                       max_configs: Optional[int] = 8, l: int = 1,
                       out_dtype: Any = None) -> list[GemmConfig]:
    """Ranked configs of the FP8 SwiGLU (``swiglu`` and ``fp8``) for an (m, n, k, l)
    problem: :func:`swiglu_configs`'s order, each K tile ``_FP8_TILE_K`` elements (as
    :func:`fp8_configs`), each config once. Tiles whose two accumulators together take
    more than ``_FP8_MAX_ACC_REGS`` registers per thread are left out (the three scales'
    values sit next to them). ``out_dtype`` defaults to bf16."""
    return _as_fp8(swiglu_configs(m, n, k, dtype, max_configs=None, l=l,
                                  out_dtype=out_dtype or "bf16"), 2, max_configs)


def _as_fp8(ranked: list[GemmConfig], accumulators: int,
            max_configs: Optional[int]) -> list[GemmConfig]:
    """``ranked`` with FP8's K tile, each config once, those whose ``accumulators``
    accumulator tiles take more than ``_FP8_MAX_ACC_REGS`` registers a thread left out."""
    out: list[GemmConfig] = []
    for cfg in ranked:
        if accumulators * cfg.tile_m * cfg.tile_n > _FP8_MAX_ACC_REGS * 128 * cfg.tile_wgs:
            continue
        cfg = cfg.replace(tile_k=_FP8_TILE_K, fp8=True)
        if cfg not in out:
            out.append(cfg)
        if max_configs is not None and len(out) >= max_configs:
            break
    return out
