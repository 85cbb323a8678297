"""torch's own CuTe DSL kernels and ours, side by side (GPU-less, a virtual sm_90).

torch 2.13 has two: ``CUTEDSL`` among ``max_autotune_gemm_backends`` turns on its
Blackwell grouped GEMM (``torch._grouped_mm``, sm_100 to sm_109 only), and flex's
``kernel_options={"BACKEND": "FLASH"}`` its FlexAttention from the flash-attn package's
CuTe DSL kernels. The same ``CUTEDSL`` name turns on our Hopper GEMM for mm, addmm and bmm,
and our flex switch is a key of its own (``"CUTEDSL": True``). Each reaches only its own
path: docs/torch-versions.md, "CuTe DSL in torch itself"."""

from unittest import mock

import pytest
import torch
from torch._inductor.kernel import mm_grouped

from cutedsl_inductor.bench.lowering import kernel_definitions, lowered
from tests.helpers import virtual_sm90_max_autotune
from tests.inductor import test_flex
from tests.inductor.test_flex import lower, our_kernels, virtual_flex  # noqa: F401 (fixture)

# nothing can be timed without a GPU: only our GEMM's choices and ATen's grouped GEMM
NO_TIMING = {"test_configs.autotune_choice_name_regex": "sm90_gemm|grouped"}


def test_one_backend_name_reaches_torchs_blackwell_check_and_our_hopper_gemm(monkeypatch):
    asked = []

    def blackwell_check(*args, **kwargs):
        asked.append(mm_grouped_check(*args, **kwargs))
        return asked[-1]

    def fn(x, w, a, b, offsets):
        return x @ w, torch._grouped_mm(a, b, offs=offsets)

    mm_grouped_check = mm_grouped.use_blackwell_cutedsl_grouped_mm
    shapes = [(256, 512), (512, 256), (256, 512), (4, 512, 256), (4,)]
    dtypes = [torch.bfloat16] * 4 + [torch.int32]
    with virtual_sm90_max_autotune(monkeypatch, "ATEN,CUTEDSL", gemm_max_configs=1), \
            mock.patch.object(mm_grouped, "use_blackwell_cutedsl_grouped_mm", blackwell_check), \
            torch._inductor.config.patch(NO_TIMING), lowered(fn, *shapes, dtype=dtypes) as graph:
        code = graph.codegen()[0].value
    assert asked == [False]  # torch's own: asked, and not on an sm_90
    (ours,) = kernel_definitions(code)
    assert ours.targets[0].id.startswith("cutedsl_sm90_gemm_")  # ours: the mm
    assert "extern_kernels._grouped_mm(" in code


def outcome(options):
    """Our kernels in the output code, or the lowering's error (its first line: the rest
    lists the call's arguments)."""
    try:
        return len(our_kernels(lower(options)))
    except Exception as err:
        return f"{type(err).__name__}: {err}".splitlines()[0]


def test_flexs_flash_backend_is_torchs_own_with_our_key_or_without(virtual_flex):  # noqa: F811
    """BACKEND="FLASH" goes to torch's FLASH path whether our key is there or not (here,
    without flash-attn installed, its error that says so); ours joins the Triton path."""
    flash = outcome({"BACKEND": "FLASH"})
    assert outcome({"BACKEND": "FLASH", "CUTEDSL": True}) == flash
    if isinstance(flash, str):
        assert "BACKEND='FLASH'" in flash and "CUTEDSL" not in flash
    else:
        assert flash == 0
    assert outcome({"BACKEND": "TRITON", "CUTEDSL": True}) == 1


pytestmark = pytest.mark.skipif(not hasattr(mm_grouped, "use_blackwell_cutedsl_grouped_mm")
                                or "FLASH" not in open(test_flex.FLEX_MODULE.__file__).read(),
                                reason="this torch has neither of its own CuTe DSL kernels")
