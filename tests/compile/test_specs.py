import torch

from cutedsl_inductor.compile.specs import (
    ScalarSpec,
    Sym,
    TensorSpec,
    fake_arguments,
    mismatch,
    specs_key,
    tensor_spec,
)
from tests.helpers import make_input


def test_static_spec_keeps_sizes_and_strides(graph):
    node = make_input(graph, "arg0_1", (64, 96), torch.bfloat16)
    spec = tensor_spec(node, symbolic=False, index=0)
    assert spec == TensorSpec("bfloat16", (64, 96), (96, 1), 16)


def test_symbolic_spec_keeps_divisibility_and_unit_stride(graph):
    node = make_input(graph, "arg0_1", (1000, 96), torch.float16)
    spec = tensor_spec(node, symbolic=True, index=3)
    assert spec.shape == (Sym("a3_size0", 8), Sym("a3_size1", 16))
    assert spec.stride == (Sym("a3_stride0", 16), 1)


def test_symbolic_spec_makes_a_size_of_one_a_runtime_value(graph):
    """M = 1 must run the binary every M runs: a static extent of 1 compiles another kernel."""
    node = make_input(graph, "arg0_1", (1, 96), torch.bfloat16)
    spec = tensor_spec(node, symbolic=True, index=0)
    assert spec.shape == (Sym("a0_size0", 1), Sym("a0_size1", 16))
    assert spec.stride == (Sym("a0_stride0", 16), 1)
    broadcast = make_input(graph, "arg1_1", (8, 96), torch.bfloat16, stride=(0, 1))
    assert tensor_spec(broadcast, symbolic=True, index=1).stride == (0, 1)


def test_offset_view_and_unaligned_inputs_lose_alignment(graph):
    view = make_input(graph, "arg0_1", (8, 8), torch.float32, stride=(8, 1), offset=1)
    assert tensor_spec(view, symbolic=False, index=0).align == 4
    plain = make_input(graph, "arg1_1", (8, 8), torch.float32)
    graph.unaligned_buffers.add("arg1_1")
    assert tensor_spec(plain, symbolic=False, index=1).align == 4


def test_key_distinguishes_what_changes_the_binary():
    base = TensorSpec("float32", (Sym("m", 16), 64), (64, 1), 16)
    variants = [
        TensorSpec("float16", (Sym("m", 16), 64), (64, 1), 16),
        TensorSpec("float32", (Sym("m", 8), 64), (64, 1), 16),
        TensorSpec("float32", (Sym("m", 16), 32), (32, 1), 16),
        TensorSpec("float32", (Sym("m", 16), 64), (64, 1), 4),
    ]
    keys = {specs_key([base])} | {specs_key([v]) for v in variants}
    assert len(keys) == 5
    assert specs_key([base, ScalarSpec()]) != specs_key([base])


def test_fake_arguments_share_symbols_by_name():
    import cutlass

    shared = Sym("m", 16)
    a, b, n = fake_arguments([
        TensorSpec("float32", (shared, 64), (64, 1), 16),
        TensorSpec("float32", (shared, 64), (64, 1), 16),
        ScalarSpec(),
    ])
    assert a.shape[0] is b.shape[0]
    assert a.element_type == cutlass.Float32
    assert isinstance(n, cutlass.Int64)


def test_mismatch_reports_the_first_problem():
    spec = TensorSpec("float32", (4, 4), (4, 1), 4)
    assert "2 arguments for 1" in mismatch([spec], (1, 2))
    cpu = torch.zeros(4, 4)
    assert "expected a CUDA tensor" in mismatch([spec], (cpu,))
    assert "dtype torch.float16" in mismatch([spec], (cpu.half(),))
    assert "expected an int" in mismatch([ScalarSpec()], (cpu,))


def test_a_static_spec_is_checked_against_its_layout_in_one_comparison():
    spec = TensorSpec("float32", (4, 4), (4, 1), 4)
    assert spec.static_layout == (torch.float32, (4, 4), (4, 1))
    assert spec == TensorSpec("float32", (4, 4), (4, 1), 4) and "static_layout" not in repr(spec)
    assert TensorSpec("float32", (Sym("s0"), 4), (4, 1), 4).static_layout is None
    # a CPU tensor of that layout misses the comparison and gets the full check's reason
    assert "expected a CUDA tensor" in mismatch([spec], (torch.zeros(4, 4),))


def test_inductor_dynamic_sizes_become_shared_runtime_symbols(graph):
    import sympy

    s0 = sympy.Symbol("s0", integer=True, positive=True)
    a = make_input(graph, "arg0_1", (s0, 64), torch.float32)
    b = make_input(graph, "arg1_1", (s0, 64), torch.float32)
    spec_a, spec_b = (tensor_spec(n, symbolic=False, index=i) for i, n in enumerate((a, b)))
    assert spec_a.shape == (Sym("s0", 1), 64) and spec_a.stride == (64, 1)
    assert spec_a.shape[0] == spec_b.shape[0]
    fake_a, fake_b = fake_arguments([spec_a, spec_b])
    assert fake_a.shape[0] is fake_b.shape[0]
