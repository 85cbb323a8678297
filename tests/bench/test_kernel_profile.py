"""The kernels of a profiled call: summed by name, per call, the longest first; on the
GPU, what a real call launches (memsets where asked)."""

import pytest
import torch

from cutedsl_inductor.bench.kernel_profile import KernelTime, kernel_events, per_call


def test_kernels_are_summed_by_name_per_call_the_longest_first():
    events = [("gemm", 300.0), ("memset", 20.0), ("cast", 50.0), ("gemm", 340.0),
              ("cast", 50.0)]
    assert per_call(events, units=2) == [
        KernelTime("gemm", pytest.approx(0.32), 1.0),
        KernelTime("cast", pytest.approx(0.05), 1.0),
        KernelTime("memset", pytest.approx(0.01), 0.5)]


@pytest.mark.gpu
def test_a_real_call_s_kernels_once_per_call_and_memsets_only_where_asked_for():
    x = torch.randn(1 << 20, device="cuda")
    workspace = torch.empty(1 << 24, dtype=torch.uint8, device="cuda")

    def call():
        workspace.zero_()
        torch.relu(x)

    with_memsets = per_call(kernel_events(call, 3, memsets=True), 3)
    without = per_call(kernel_events(call, 3), 3)
    assert [k.launches for k in without] == [1.0] * len(without) and without
    assert all(k.ms > 0 for k in without)
    assert not any(k.name.startswith("Memset") for k in without)
    assert {k.name for k in without} <= {k.name for k in with_memsets}
