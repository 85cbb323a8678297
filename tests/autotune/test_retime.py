"""Retiming in rounds: the feedback saver that records an autotuning's timings is
installed for its ``with`` block only, and the candidates' example tensors are shared per
buffer and shape, never between two buffers. (The retiming itself runs on the GPU:
tests/gpu/test_epilogue.py.)"""

import pytest
import torch
from torch._inductor import select_algorithm
from torch._inductor.autotune_process import TensorMeta

from cutedsl_inductor.autotune.retime import example_tensor, recording_timings


def feedback_savers():
    return select_algorithm.get_algorithm_selector_cache().feedback_saver_fns


def test_the_record_is_a_feedback_saver_inside_its_block_only():
    before = list(feedback_savers())
    with recording_timings() as record:
        assert feedback_savers() == [*before, record]
        for saver in feedback_savers():  # as Inductor calls them after an autotuning
            saver({"choice": 0.5}, "mm", [], ["choice"], lambda: {}, {})
    assert record.timings == {"choice": 0.5}
    assert feedback_savers() == before
    with pytest.raises(RuntimeError), recording_timings():
        raise RuntimeError("an autotuning that fails")
    assert feedback_savers() == before


def meta(name, sizes, strides):
    return TensorMeta(device=torch.device("cpu"), dtype=torch.bfloat16, sizes=sizes,
                      strides=strides, offset=0, name=name)


def test_example_tensors_are_shared_per_buffer_and_view():
    tensors = {}
    x = example_tensor(meta("x", (64, 32), (32, 1)), tensors)
    assert example_tensor(meta("x", (64, 32), (32, 1)), tensors) is x
    # the same buffer seen transposed (a swap-AB choice), and another buffer of x's shape
    x_t = example_tensor(meta("x", (32, 64), (1, 32)), tensors)
    w = example_tensor(meta("w", (64, 32), (32, 1)), tensors)
    assert x_t.stride() == (1, 32) and x_t.data_ptr() != x.data_ptr()
    assert w.data_ptr() != x.data_ptr() and len(tensors) == 3
