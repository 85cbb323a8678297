import pickle

import pytest
import torch

from cutedsl_inductor.exc import RecordError
from cutedsl_inductor.kernels.gemm.heuristic import DEFAULT_CONFIGS
from cutedsl_inductor.kernels.gemm.problem import GemmProblem


def why_not(*args, config=None, **kwargs):
    return GemmProblem(*args, **kwargs).why_not(config)


def test_what_the_kernel_runs():
    assert why_not("bf16", "bf16", "bf16", "k", "k", 1000, 1000, 1000) is None
    assert why_not(torch.float16, torch.float16, torch.float32, "m", "n", 136, 256, 64) is None
    assert "lda=129" in why_not("bf16", "bf16", "bf16", "m", "k", 129, 256, 64)
    # K-major A with an odd K has a misaligned row stride ...
    assert "lda=65" in why_not("bf16", "bf16", "bf16", "k", "k", 128, 128, 65)
    # ... unless the leading dimension is padded.
    assert why_not("bf16", "bf16", "bf16", "k", "k", 129, 257, 65, lda=72, ldb=72,
                   ldc=264) is None
    assert "both be bf16" in why_not("bf16", "fp16", "bf16", "k", "k", 128, 128, 128)
    assert "both be bf16" in why_not("fp32", "fp32", "fp32", "k", "k", 128, 128, 128)
    assert why_not("bf16", "bf16", "bf16", "k", "k", 0, 128, 128) == "m=0 must be >= 1"
    assert "too large" in why_not("bf16", "bf16", "bf16", "k", "k", 2**31, 128, 128)
    assert "bias dtype" in why_not("bf16", "bf16", "bf16", "k", "k", 8, 8, 8,
                                   bias_dtype=torch.int8)
    # The TMA-store epilogue needs 16-byte output rows; the direct one does not.
    padded = dict(lda=72, ldb=72, ldc=264)
    tma = DEFAULT_CONFIGS[0]
    assert tma.store == "tma"
    assert "TMA-store" in why_not("bf16", "bf16", "bf16", "k", "k", 129, 257, 65,
                                  config=tma, **padded)
    assert why_not("bf16", "bf16", "bf16", "k", "k", 129, 257, 65, config=tma.replace(
        store="direct"), **padded) is None
    assert "batch stride of A" in why_not("bf16", "bf16", "bf16", "k", "k", 8, 8, 8, l=2,
                                          batch_strides=(8 * 8 + 1, 64, 64))


def test_the_swapped_problem_is_c_transposed_of_b_and_a():
    problem = GemmProblem(torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, "k", "n",
                          m=16, n=4096, k=512, l=2, lda=528, ldb=4112, ldc=4096,
                          batch_strides=(1, 2, 3))
    swapped = problem.swapped()
    assert swapped == GemmProblem(torch.float8_e5m2, torch.float8_e4m3fn, torch.bfloat16,
                                  "m", "k", m=4096, n=16, k=512, l=2, lda=4112, ldb=528,
                                  ldc=4096, batch_strides=(2, 1, 3))
    assert swapped.swapped() == problem
    # a column-major A (a_major "m") is the swapped kernel's K-major... B: majors map across
    assert GemmProblem("bf16", "bf16", "bf16", "m", "k", 8, 8, 8).swapped().b_major == "n"


def test_the_swapped_problem_names_its_own_operands_in_a_refusal():
    """B's misaligned leading dimension is the swapped kernel's A's."""
    problem = GemmProblem("bf16", "bf16", "bf16", "k", "k", m=8, n=8, k=64, lda=64, ldb=65)
    assert problem.why_not().startswith("ldb=65 elements")
    assert problem.swapped().why_not().startswith("lda=65 elements")


def test_a_problem_pickles_and_hashes():
    problem = GemmProblem(torch.bfloat16, torch.bfloat16, torch.float32, "k", "n", 64, 128,
                          256, l=4, batch_strides=(1 << 14, 1 << 15, 1 << 13))
    again = pickle.loads(pickle.dumps(problem))
    assert again == problem and hash(again) == hash(problem)
    assert problem.replace(bias_dtype=torch.bfloat16) != problem


@pytest.mark.parametrize("field,value,changes", [
    ("a_major", "n", {"a_major": "n"}),
    ("b_major", "m", {"b_major": "m"}),
    ("m", 12.0, {"m": 12.0}),
    ("l", True, {"l": True}),
    ("ldc", "8", {"ldc": "8"}),
    ("batch_strides", (1, 2), {"batch_strides": (1, 2)}),
    ("batch_strides", [1, 2, 3], {"batch_strides": [1, 2, 3]}),
])
def test_a_malformed_problem_is_refused_naming_its_field(field, value, changes):
    fields = dict(a_dtype="bf16", b_dtype="bf16", out_dtype="bf16", a_major="k",
                  b_major="k", m=8, n=8, k=8) | changes
    with pytest.raises(RecordError) as info:
        GemmProblem(**fields)
    assert str(info.value).startswith(f"GemmProblem: {field}={value!r} is refused: ")
