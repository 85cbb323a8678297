"""Retiming in rounds: the feedback saver that records an autotuning's timings is
installed for its ``with`` block only, and the candidates' example tensors are shared per
buffer and shape, never between two buffers. (The retiming itself runs on the GPU:
tests/gpu/test_epilogue.py.)"""

import dataclasses

import pytest
import torch
from torch._inductor import select_algorithm
from torch._inductor.autotune_process import TensorMeta

from cutedsl_inductor import counters
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


@pytest.fixture
def timings(monkeypatch):
    """The GPU's interleaved timing stood in for (CPU tests): records what it was asked
    to time; "b" is the fastest."""
    from cutedsl_inductor.autotune import retime
    from tests.helpers import use_virtual_sm90

    use_virtual_sm90(monkeypatch)
    timed = []

    def fastest_by_median(calls, rounds):
        timed.append(sorted(calls))
        return "b", {name: 2.0 if name == "a" else 1.0 for name in calls}

    monkeypatch.setattr(retime, "fastest_by_median", fastest_by_median)
    return timed


def test_a_retiming_is_timed_once_for_every_process_and_machine(timings, remote_redis,
                                                                 monkeypatch, tmp_path):
    from cutedsl_inductor import config
    from cutedsl_inductor.autotune import retime
    from cutedsl_inductor.compile.cache import decisions

    calls = {"a": lambda: None, "b": lambda: None}
    assert retime.fastest_in_rounds(calls, "64x64") == ("b", {"a": 2.0, "b": 1.0})
    monkeypatch.setattr(retime, "_WINNERS", {})  # a new process on this machine
    assert retime.fastest_in_rounds(calls, "64x64") == ("b", {})
    monkeypatch.setattr(retime, "_WINNERS", {})  # another machine, the same Redis
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "b"))
    assert retime.fastest_in_rounds(calls, "64x64") == ("b", {})
    assert timings == [["a", "b"]]
    assert dataclasses.asdict(counters.decisions) == {
        "local_hits": 1, "remote_hits": 1, "misses": 1, "saved": 1,
        "lookup_s": pytest.approx(counters.decisions.lookup_s)}


def test_a_decision_is_reused_only_for_the_same_candidates_sizes_and_gpu(timings,
                                                                         monkeypatch):
    from types import SimpleNamespace

    from cutedsl_inductor import config
    from cutedsl_inductor.autotune import retime
    from cutedsl_inductor.bench.lowering import H200_PROPERTIES
    from cutedsl_inductor.compile.cache import decisions

    calls = {"a": lambda: None, "b": lambda: None}
    retime.fastest_in_rounds(calls, "64x64")
    retime.fastest_in_rounds({**calls, "c": lambda: None}, "64x64")
    retime.fastest_in_rounds(calls, "64x128")
    other_gpu = SimpleNamespace(**{**vars(H200_PROPERTIES), "name": "NVIDIA H100"})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: other_gpu)
    monkeypatch.setattr(retime, "_WINNERS", {})
    retime.fastest_in_rounds(calls, "64x64")
    monkeypatch.setattr(config, "compile_options", "--opt-level 2")
    monkeypatch.setattr(retime, "_WINNERS", {})
    retime.fastest_in_rounds(calls, "64x64")
    assert len(timings) == 5
    # a stored winner that is not among the candidates is not taken
    monkeypatch.setattr(retime, "_WINNERS", {})
    decisions.save(retime.winner_key((("a", "b"), "64x64")), {"winner": "z"})
    assert retime.fastest_in_rounds(calls, "64x64")[0] == "b" and len(timings) == 6
