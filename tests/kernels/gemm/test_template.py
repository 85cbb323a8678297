"""The GEMM template renders and compiles (GPU-less, sm_90a) for mm, addmm and bmm."""

import re

import pytest
import torch
import tvm_ffi

from cutedsl_inductor.compile.specs import Sym
from cutedsl_inductor.kernels.gemm.template import gemm_choices
from tests.helpers import make_input, make_layout


@pytest.mark.parametrize("op", ["mm", "addmm", "bmm"])
def test_first_choice_compiles_with_symbolic_shapes(graph, op):
    batch = (3,) if op == "bmm" else ()
    a = make_input(graph, "a", (*batch, 1000, 512), torch.bfloat16)
    b = make_input(graph, "b", (*batch, 512, 384), torch.bfloat16, stride=None if batch else (1, 512))
    nodes = [a, b]
    if op == "addmm":
        nodes.insert(0, make_input(graph, "bias", (1000, 384), torch.bfloat16, stride=(0, 1)))
    choices = []
    gemm_choices(choices, op, nodes, make_layout((*batch, 1000, 384), torch.bfloat16),
                 alpha=1.0, beta=1.0 if op == "addmm" else 0.0)
    assert choices
    choice = choices[0]
    out_spec = choice.specs[-1]
    assert all(isinstance(d, Sym) for d in out_spec.shape)
    assert "Sm90Gemm(" in choice.source
    assert isinstance(choice.load().kernel_fn, tvm_ffi.Function)


def test_precompile_covers_mm_addmm_bmm_and_both_dtypes():
    from cutedsl_inductor.autotune.scratch import scratch_graph
    from cutedsl_inductor.kernels.gemm.template import precompile_choices

    with scratch_graph() as scratch:
        choices = precompile_choices(scratch)
    dtypes = {spec.dtype for c in choices for spec in c.specs[:1]}
    assert dtypes == {"bfloat16", "float16"}
    assert any(c.params["HAS_BIAS"] for c in choices)
    assert any(len(c.specs[0].shape) == 3 for c in choices)
    assert len({c.hash_key() for c in choices}) == len(choices)


def test_precompile_for_shapes_offers_each_shapes_configs():
    """Small M gets split-K configs that 4096^3 does not: precompiling for both shapes
    offers the kernels of both."""
    from cutedsl_inductor.autotune.scratch import scratch_graph
    from cutedsl_inductor.kernels.gemm.template import precompile_choices

    def configs(choices):
        return {c.description for c in choices}

    with scratch_graph() as scratch:
        large = precompile_choices(scratch)
        both = precompile_choices(scratch, [(16, 4096, 4096), (4096, 4096, 4096)])
    assert not any("SPLIT_K" in c.params for c in large)
    assert any("SPLIT_K" in c.params for c in both)
    assert configs(large) < configs(both)


def test_split_k_choice_renders_split_k_only_when_split(graph):
    a = make_input(graph, "a", (128, 4096), torch.bfloat16)
    b = make_input(graph, "b", (4096, 4096), torch.bfloat16, stride=(1, 4096))
    choices = []
    gemm_choices(choices, "mm", [a, b], make_layout((128, 4096), torch.bfloat16))
    split = [c for c in choices if "SPLIT_K" in c.params]
    unsplit = [c for c in choices if "SPLIT_K" not in c.params]
    assert split and unsplit
    assert all("split_k=SPLIT_K" in c.source and "SPLIT_K" in c.description for c in split)
    assert all("split_k" not in c.source.lower() for c in unsplit)
    assert isinstance(split[0].load().kernel_fn, tvm_ffi.Function)


def test_exhaustive_mode_offers_every_candidate(graph):
    """At M = 16 there are more candidates (split-K and swap-AB variants) than a fixed
    multiple of the default configs; exhaustive mode offers all of them."""
    from cutedsl_inductor import config
    from cutedsl_inductor.kernels.gemm.heuristic import pick_configs

    a = make_input(graph, "a", (16, 4096), torch.bfloat16)
    b = make_input(graph, "b", (4096, 4096), torch.bfloat16, stride=(1, 4096))
    choices = []
    with config.patch(gemm_exhaustive=True):
        gemm_choices(choices, "mm", [a, b], make_layout((16, 4096), torch.bfloat16))
    every = pick_configs(16, 4096, 4096, max_configs=None)
    assert len(every) > 48 and len(choices) == len(every)


def test_raster_band_renders_only_where_not_the_default(graph):
    """A sweep's ``group_size`` reaches the kernel as GROUP_SIZE; the default's source (and
    so its cache key) has no trace of it."""
    from cutedsl_inductor.kernels.gemm.heuristic import DEFAULT_CONFIGS

    a = make_input(graph, "a", (4096, 4096), torch.bfloat16)
    b = make_input(graph, "b", (4096, 4096), torch.bfloat16, stride=(1, 4096))
    layout = make_layout((4096, 4096), torch.bfloat16)
    cfg = DEFAULT_CONFIGS[0]
    default, banded = [], []
    gemm_choices(default, "mm", [a, b], layout, configs=[cfg])
    gemm_choices(banded, "mm", [a, b], layout, configs=[cfg.replace(group_size=4)])
    assert "group_size" not in default[0].source and "GROUP_SIZE" not in default[0].params
    assert "group_size=GROUP_SIZE" in banded[0].source and banded[0].params["GROUP_SIZE"] == 4
    assert cfg.replace(group_size=4).name == cfg.name + "_g4"
    assert isinstance(banded[0].load().kernel_fn, tvm_ffi.Function)


def test_pdl_renders_only_with_its_knob_and_compiles(graph):
    """``config.gemm_pdl`` gives every heuristic config PDL (its source, cache key and name
    say so); without it no source mentions it."""
    from cutedsl_inductor import config

    a = make_input(graph, "a", (64, 4096), torch.bfloat16)
    b = make_input(graph, "b", (4096, 4096), torch.bfloat16, stride=(1, 4096))
    layout = make_layout((64, 4096), torch.bfloat16)
    plain, launched = [], []
    gemm_choices(plain, "mm", [a, b], layout)
    with config.patch(gemm_pdl=True):
        gemm_choices(launched, "mm", [a, b], layout)
    assert plain and len(launched) == len(plain)
    assert all("pdl" not in c.source and "PDL" not in c.params for c in plain)
    assert all("pdl=PDL" in c.source and c.params["PDL"] is True for c in launched)
    assert isinstance(launched[0].load().kernel_fn, tvm_ffi.Function)


def test_pingpong_choice_renders_and_compiles(graph):
    a = make_input(graph, "a", (4096, 4096), torch.bfloat16)
    b = make_input(graph, "b", (4096, 4096), torch.bfloat16, stride=(1, 4096))
    choices = []
    gemm_choices(choices, "mm", [a, b], make_layout((4096, 4096), torch.bfloat16))
    pingpong = [c for c in choices if c.params["PINGPONG"]]
    assert pingpong and not all(c.params["PINGPONG"] for c in choices)
    choice = pingpong[0]
    assert not choice.params["COOPERATIVE"]
    assert "pingpong=PINGPONG" in choice.source and "PINGPONG: cutlass.Constexpr = True" in choice.source
    assert "PINGPONG=True" in choice.description
    assert isinstance(choice.load().kernel_fn, tvm_ffi.Function)


@pytest.mark.parametrize("op", ["mm", "addmm"])
def test_swap_ab_choice_renders_and_compiles(graph, op):
    """At small M the swap-AB choice passes the kernel (B, A, C^T) and the bias as C^T's."""
    a = make_input(graph, "a", (16, 4096), torch.bfloat16)
    b = make_input(graph, "b", (4096, 14336), torch.bfloat16, stride=(1, 4096))
    nodes = [a, b]
    if op == "addmm":
        nodes.insert(0, make_input(graph, "bias", (16, 14336), torch.bfloat16, stride=(0, 1)))
    choices = []
    gemm_choices(choices, op, nodes, make_layout((16, 14336), torch.bfloat16),
                 alpha=1.0, beta=1.0 if op == "addmm" else 0.0)
    swapped = [c for c in choices if c.params.get("SWAP_AB")]
    assert swapped
    source = swapped[0].source
    assert "as_nkl_from_kn(b), as_mkl(a), as_nml(out)" in source
    assert ("bias_view = as_nml(bias)" in source) == (op == "addmm")
    assert all("SWAP_AB" not in c.source for c in choices if not c.params.get("SWAP_AB"))
    assert isinstance(swapped[0].load().kernel_fn, tvm_ffi.Function)


def _mm_ptx(graph, tmp_path, alpha: float = 1.0) -> str:
    """The PTX of a 512x384x256 bf16 mm choice (a 128x128 cooperative tile) compiled here."""
    from cutedsl_inductor import config
    from cutedsl_inductor.kernels.gemm.heuristic import DEFAULT_CONFIGS

    a = make_input(graph, "a", (512, 256), torch.bfloat16)
    b = make_input(graph, "b", (256, 384), torch.bfloat16, stride=(1, 256))
    choices = []
    gemm_choices(choices, "mm", [a, b], make_layout((512, 384), torch.bfloat16), alpha=alpha,
                 configs=[DEFAULT_CONFIGS[5]])
    with config.patch(disk_cache=False, compile_options=f"--keep-ptx --dump-dir {tmp_path}"):
        choices[0].load()
    (ptx,) = tmp_path.glob("*.ptx")
    return ptx.read_text()


def _register_constants(ptx: str, operand: str) -> set[str]:
    """The constants a 64-bit PTX register can hold, through its movs and selps."""
    if not operand.startswith("%"):
        return {operand}
    ((op, args),) = re.findall(rf"\n\s*(mov|selp)\.b64\s+{operand}, ([^;]*);", ptx)
    sources = args.split(", ")
    return set().union(*(_register_constants(ptx, x)
                         for x in (sources if op == "mov" else sources[:2])))


@pytest.mark.parametrize("alpha, multiplies", [(1.0, False), (0.5, True)])
def test_unit_alpha_costs_no_multiply(graph, tmp_path, alpha, multiplies):
    """The template passes ALPHA to the kernel as a compile-time number: the PTX of an
    mm with alpha = 1 has no fp32 multiply at all (the epilogue's only one is by alpha)."""
    ptx = _mm_ptx(graph, tmp_path, alpha)
    assert bool(re.search(r"\bmul(\.rn)?\.f32\b", ptx)) == multiplies


def test_tma_copies_carry_l2_policies(graph, tmp_path):
    """Every TMA copy's cache-policy operand is a createpolicy encoding, not the DSL's
    default 0: the loads choose evict-first or evict-normal at run time (by how many
    clusters read each tile and the operand's size), the stores evict-normal."""
    first, normal = str(0x12F0000000000000), str(0x1000000000000000)
    ptx = _mm_ptx(graph, tmp_path)
    copies = re.findall(r"cp\.async\.bulk\.tensor\.\S*(global\.shared|shared::cta\.global)"
                        r"\S*L2::cache_hint [^;]*, (%rd\d+);", ptx)
    assert {kind for kind, _ in copies} == {"global.shared", "shared::cta.global"}
    for kind, reg in copies:
        loads = kind == "shared::cta.global"
        assert _register_constants(ptx, reg) == ({first, normal} if loads else {normal}), (
            kind, reg)
