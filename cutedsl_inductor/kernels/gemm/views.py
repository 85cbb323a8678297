"""Views of torch's matmul operands in ``Sm90Gemm``'s convention, for use inside
``@cute.jit`` code. Each keeps the operand's memory and strides (a transposed operand
is a view, never a copy); a 2-D operand gets a batch mode of size 1 and stride 0.

  torch                       kernel
  a   (M, K)  / (L, M, K) ->  A (M, K, L)
  b   (K, N)  / (L, K, N) ->  B (N, K, L)
  out (M, N)  / (L, M, N) ->  C (M, N, L)   (also an addmm bias expanded to (M, N))

Swap-AB (``C^T = B A^T``) passes ``b`` as the kernel's A (``as_nkl_from_kn``), ``a`` as
its B (``as_mkl``) and the output and bias as ``as_nml``: C^T (N, M, L), column-major
for a row-major output.

``broadcast_mnl`` views a tensor that varies along at most one dim with the kernel's M
and one with its N (``_scaled_mm``'s scales and bias vector: rank 0, 1 or 2) as the
kernel's (M, N, 1), stride 0 along the rest.
"""

from __future__ import annotations

import cutlass.cute as cute


def _permuted(t: cute.Tensor, order: tuple[int, int, int]) -> cute.Tensor:
    """Modes of a 2-D or 3-D tensor reordered to ``order`` (indices into the 3-D
    form, where a 2-D tensor is first given a leading batch mode (1, stride 0))."""
    if cute.rank(t) == 2:
        shape, stride = (1, t.shape[0], t.shape[1]), (0, t.stride[0], t.stride[1])
    else:
        shape, stride = tuple(t.shape), tuple(t.stride)
    return cute.make_tensor(
        t.iterator,
        cute.make_layout(tuple(shape[i] for i in order), stride=tuple(stride[i] for i in order)),
    )


def as_mkl(a: cute.Tensor) -> cute.Tensor:
    return _permuted(a, (1, 2, 0))


def as_nkl_from_kn(b: cute.Tensor) -> cute.Tensor:
    return _permuted(b, (2, 1, 0))


def as_mnl(c: cute.Tensor) -> cute.Tensor:
    return _permuted(c, (1, 2, 0))


def as_nml(c: cute.Tensor) -> cute.Tensor:
    return _permuted(c, (2, 1, 0))


def broadcast_mnl(t: cute.Tensor, m, n, m_dim, n_dim) -> cute.Tensor:
    """``t`` as an (m, n, 1) tensor whose M mode steps along ``t``'s dim ``m_dim`` and N
    mode along ``n_dim`` (each None: broadcast, stride 0)."""
    m_stride = 0 if m_dim is None else t.stride[m_dim]
    n_stride = 0 if n_dim is None else t.stride[n_dim]
    return cute.make_tensor(t.iterator,
                            cute.make_layout((m, n, 1), stride=(m_stride, n_stride, 0)))
