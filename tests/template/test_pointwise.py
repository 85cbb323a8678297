"""PointwiseToCuteDSL: every supported op is translated, rendered into a small
``@cute.kernel`` and compiled for sm_90a without a GPU (fake tensors, real compiles)."""

import importlib.util
import re

import pytest
import sympy
import torch
from torch._inductor import ir
from torch._inductor import virtualized as vz
from torch._inductor.virtualized import V

from cutedsl_inductor.template.pointwise import PointwiseToCuteDSL, translate_pointwise

N = 128
INDEX = [sympy.Symbol("x0")]
# kernel parameter -> element dtype: fp32 and bf16 inputs
PARAMS = {"a": torch.float32, "b": torch.bfloat16, "c": torch.float32}


def load_param(name, index):
    return f"{name}[i]", PARAMS[name]


def compile_exprs(tmp_path, fns, out_dtype=torch.float32, params=PARAMS, load=load_param,
                  index=INDEX):
    """Translate each fn (an inner_fn, IR node or LoopBody), store result j into
    out[i, j] and compile the kernel; returns the translations."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    results = [translate_pointwise(fn, index, load, prefix=f"t{j}_")
               for j, fn in enumerate(fns)]
    body = []
    for j, tr in enumerate(results):
        body += tr.lines
        body.append(f"out[i, {j}] = {tr.result}.to(cutlass.Float32).to(out.element_type)")
    args = ", ".join(f"{p}: cute.Tensor" for p in params)
    names = ", ".join(params)
    source = "\n".join([
        "import cutlass",
        "import cutlass.cute as cute",
        "",
        "@cute.kernel",
        f"def pointwise_kernel({args}, out: cute.Tensor):",
        "    i, _, _ = cute.arch.thread_idx()",
        *("    " + line for line in body),
        "",
        "@cute.jit",
        f"def launch({args}, out: cute.Tensor):",
        f"    pointwise_kernel({names}, out).launch(grid=[1, 1, 1], block=[{N}, 1, 1])",
        "",
    ])
    path = tmp_path / f"pointwise_{len(list(tmp_path.glob('*.py')))}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    cutlass_type = {torch.float32: cutlass.Float32, torch.bfloat16: cutlass.BFloat16,
                    torch.float16: cutlass.Float16}
    fakes = [make_fake_compact_tensor(cutlass_type[d], (N,)) for d in params.values()]
    out = make_fake_compact_tensor(cutlass_type[out_dtype], (N, len(fns)))
    options = f"--gpu-arch sm_90a --keep-ptx --dump-dir={tmp_path}"  # PTX stays in tmp_path
    compiled = cute.compile(module.launch, *fakes, out, options=options)
    assert ".entry" in compiled.__ptx__, source
    return results


def a(idx):
    return vz.ops.load("a", idx[0])


def b(idx):
    return vz.ops.load("b", idx[0])


def c(idx):
    return vz.ops.load("c", idx[0])


def test_arithmetic_and_constants_compile(tmp_path):
    fns = [
        lambda i: vz.ops.add(a(i), b(i)),
        lambda i: vz.ops.sub(a(i), vz.ops.constant(0.5, torch.float32)),
        lambda i: vz.ops.mul(b(i), c(i)),
        lambda i: vz.ops.truediv(a(i), b(i)),
        lambda i: vz.ops.neg(b(i)),
        lambda i: vz.ops.maximum(a(i), vz.ops.constant(float("-inf"), torch.float32)),
        lambda i: vz.ops.minimum(a(i), vz.ops.constant(float("inf"), torch.bfloat16)),
        lambda i: vz.ops.abs(b(i)),
        lambda i: vz.ops.relu(a(i)),
        lambda i: vz.ops.add(a(i), vz.ops.constant(float("nan"), torch.float32)),
        lambda i: vz.ops.reciprocal(c(i)),
        lambda i: vz.ops.square(b(i)),
        lambda i: a(i) * 2 + 1.5,  # OpsValue operators with Python scalars
    ]
    res = compile_exprs(tmp_path, fns)
    text = "\n".join(line for r in res for line in r.lines)
    assert "t0_0 = a[i]" in text and "t0_1 = (b[i]).to(cutlass.Float32)" in text
    assert "cutlass.Float32(float('-inf'))" in text and "cutlass.Float32(float('inf'))" in text
    assert "cutlass.Float32(float('nan'))" in text
    assert "propagate_nan=True" in text and "cute.math.abs(" in text
    assert all(r.dtype == torch.float32 for r in res)


def test_transcendentals_compile(tmp_path):
    fns = [
        lambda i: vz.ops.exp(a(i)),
        lambda i: vz.ops.log(b(i)),
        lambda i: vz.ops.tanh(a(i)),
        lambda i: vz.ops.erf(b(i)),
        lambda i: vz.ops.sigmoid(a(i)),
        lambda i: vz.ops.sqrt(c(i)),
        lambda i: vz.ops.rsqrt(b(i)),
    ]
    res = compile_exprs(tmp_path, fns, out_dtype=torch.bfloat16)
    for r, fn in zip(res, ["exp", "log", "tanh", "erf", "exp", "sqrt", "rsqrt"]):
        assert any(f"cute.math.{fn}(" in line for line in r.lines), r.lines
        fast = fn in ("exp", "log", "erf")  # the approximations Triton uses too
        assert any("fastmath=True" in line for line in r.lines) == fast, r.lines


def test_comparisons_logic_where_and_casts_compile(tmp_path):
    zero = lambda: vz.ops.constant(0.0, torch.float32)  # noqa: E731
    fns = [
        lambda i: vz.ops.eq(a(i), b(i)),
        lambda i: vz.ops.ne(a(i), zero()),
        lambda i: vz.ops.lt(a(i), c(i)),
        lambda i: vz.ops.le(b(i), c(i)),
        lambda i: vz.ops.gt(a(i), zero()),
        lambda i: vz.ops.ge(b(i), a(i)),
        lambda i: vz.ops.logical_and(vz.ops.gt(a(i), zero()), vz.ops.lt(b(i), zero())),
        lambda i: vz.ops.logical_or(vz.ops.gt(a(i), zero()), c(i)),  # float operand -> != 0
        lambda i: vz.ops.logical_not(vz.ops.le(a(i), b(i))),
        lambda i: vz.ops.where(vz.ops.gt(a(i), zero()), a(i), zero()),
        lambda i: vz.ops.where(vz.ops.lt(a(i), b(i)), vz.ops.gt(c(i), zero()),
                               vz.ops.constant(True, torch.bool)),
        lambda i: vz.ops.where(vz.ops.constant(False, torch.bool), a(i), b(i)),  # static condition
        lambda i: vz.ops.to_dtype(a(i), torch.bfloat16),
        lambda i: vz.ops.to_dtype(b(i), torch.float16),
        lambda i: vz.ops.to_dtype(vz.ops.to_dtype(a(i), torch.float16), torch.float32),
        lambda i: vz.ops.to_dtype(a(i), torch.bool),
        lambda i: vz.ops.to_dtype(vz.ops.gt(a(i), b(i)), torch.float32),
        lambda i: vz.ops.add(vz.ops.to_dtype(a(i), torch.int32), vz.ops.constant(3, torch.int32)),
        lambda i: vz.ops.to_dtype(vz.ops.to_dtype(vz.ops.lt(a(i), c(i)), torch.int32),
                                  torch.bfloat16),
        lambda i: vz.ops.maximum(vz.ops.to_dtype(b(i), torch.int32),
                                 vz.ops.neg(vz.ops.constant(2, torch.int32))),
        # a 16-bit cast rounds only without compute types (emulate_precision_casts)
        lambda i: vz.ops.to_dtype(a(i), torch.bfloat16, use_compute_types=False),
        lambda i: vz.ops.to_dtype(vz.ops.to_dtype(b(i), torch.float16, use_compute_types=False),
                                  torch.float16),
    ]
    res = compile_exprs(tmp_path, fns)
    dtypes = [r.dtype for r in res]
    assert dtypes[:9] == [torch.bool] * 9
    # with compute types (Inductor's default) a bf16/fp16 cast is to fp32, as in Triton
    assert dtypes[9:] == [torch.float32, torch.bool, torch.float32, torch.float32,
                          torch.float32, torch.float32, torch.bool, torch.float32,
                          torch.int32, torch.float32, torch.int32, torch.bfloat16,
                          torch.float32]
    assert res[12].lines == ["t12_0 = a[i]"]  # to_dtype(a, bf16): a itself, unrounded
    assert res[20].lines[-1] == "t20_1 = t20_0.to(cutlass.BFloat16)"
    assert res[21].lines[-2:] == ["t21_1 = t21_0.to(cutlass.Float16)",
                                  "t21_2 = t21_1.to(cutlass.Float32)"]
    assert "cutlass.Float32(cutlass.select_(" in res[9].lines[-1]
    assert res[11].lines[-1] == "t11_2 = (b[i]).to(cutlass.Float32)"  # where(False, a, b)
    assert res[11].result == "t11_2"  # is b, no select_


ACTIVATIONS = {  # name -> (fn, the cute.math function its decomposition needs)
    "gelu": (lambda x: torch.nn.functional.gelu(x), "erf"),
    "gelu_tanh": (lambda x: torch.nn.functional.gelu(x, approximate="tanh"), "tanh"),
    "silu": (lambda x: torch.nn.functional.silu(x), "exp"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_and_silu_through_inductor_lowering(tmp_path, dtype):
    """Inductor's own decompositions and lowerings make one Pointwise node per
    activation; their inner_fns (and silu's LoopBody) translate and compile."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.graph import GraphLowering
    from torch.fx.experimental.proxy_tensor import make_fx

    def model(x):
        return tuple(fn(x) for fn, _ in ACTIVATIONS.values())

    x = torch.randn(8, 16, dtype=dtype)
    gm = make_fx(model, decomposition_table=select_decomp_table(), tracing_mode="fake")(x)
    graph = GraphLowering(gm)
    loaded = set()

    def load(name, index):
        loaded.add((name, str(index)))
        return "x[i]", dtype

    with V.set_graph_handler(graph):
        graph.run(x)
        bufs = [b for b in graph.buffers if isinstance(b, ir.ComputedBuffer)]
        assert [type(b.data) for b in bufs] == [ir.Pointwise] * 3
        _, silu_body, _ = bufs[2].get_default_sizes_body()
        index = [sympy.Symbol("x0"), sympy.Symbol("x1")]
        res = compile_exprs(tmp_path, [b.data for b in bufs] + [silu_body],
                            out_dtype=dtype, params={"x": dtype}, load=load, index=index)

    assert loaded == {(name, "16*x0 + x1") for name in graph.graph_inputs}
    for tr, (_, fn) in zip(res, [*ACTIVATIONS.values(), (None, "exp")]):
        text = "\n".join(tr.lines)
        assert f"cute.math.{fn}(" in text, text
        assert tr.dtype == torch.float32  # the final bf16 cast is to the compute type
        if dtype == torch.bfloat16:
            assert "(x[i]).to(cutlass.Float32)" in text and "BFloat16" not in text
    strip = lambda lines: [re.sub(r"t\d+_", "t_", line) for line in lines]  # noqa: E731
    assert strip(res[2].lines) == strip(res[3].lines)  # inner_fn and LoopBody agree


def test_cse_and_line_format():
    def fn(i):
        x = a(i)
        return vz.ops.add(vz.ops.mul(x, x), vz.ops.mul(a(i), a(i)))

    tr = translate_pointwise(fn, INDEX, load_param)
    assert tr.lines == ["tmp0 = a[i]", "tmp1 = tmp0 * tmp0", "tmp2 = tmp1 + tmp1"]
    assert tr.result == "tmp2" and tr.dtype == torch.float32


def test_plain_string_load_is_fp32_and_index_is_passed():
    seen = []

    def load(name, index):
        seen.append((name, index))
        return "acc[j]"

    tr = translate_pointwise(lambda i: vz.ops.exp(vz.ops.load("buf0", 4 * i[0])), INDEX, load)
    assert seen == [("buf0", 4 * INDEX[0])]
    assert tr.lines == ["tmp0 = acc[j]", "tmp1 = cute.math.exp(tmp0, fastmath=True)"]


@pytest.mark.parametrize("fn", [
    lambda i: vz.ops.index_expr(i[0], torch.int32),
    lambda i: vz.ops.load("a", vz.ops.indirect_indexing(a(i), 16)),
    lambda i: vz.ops.bitwise_xor(a(i), a(i)),  # an op this handler does not know
    lambda i: vz.ops.to_dtype(a(i), torch.int64),
    lambda i: vz.ops.add(vz.ops.gt(a(i), b(i)), vz.ops.lt(a(i), b(i))),  # bool arithmetic
    lambda i: vz.ops.store("buf1", i[0], a(i), "atomic_add"),
], ids=["index_expr", "indirect_indexing", "unknown_op", "int64", "bool_add", "atomic"])
def test_unsupported_raises_not_implemented(fn):
    with pytest.raises(NotImplementedError, match="op "):
        translate_pointwise(fn, INDEX, load_param)


def test_non_pointwise_node_is_not_fusable(graph):
    from torch._inductor.lowering import lowerings

    layout = ir.FixedLayout(torch.device("cpu"), torch.float32, [4, 8])
    x = ir.TensorBox.create(ir.InputBuffer(name="arg0_1", layout=layout))
    graph.graph_inputs["arg0_1"] = x
    red = lowerings[torch.ops.aten.sum.dim_IntList](x, [1])
    with pytest.raises(NotImplementedError, match="Reduction"):
        translate_pointwise(red, INDEX, load_param)


def test_handler_is_a_default_handler():
    from torch._inductor.ops_handler import DefaultHandler

    handler = PointwiseToCuteDSL(load_param)
    assert isinstance(handler, DefaultHandler)
    with pytest.raises(NotImplementedError, match="sin"):
        handler.sin("x")
