"""``bench model``'s first-call breakdown on CPU: torch's figures from a real
torch.compile of a small function (cold, then its FX graph cache hit, with Inductor's
remote FX graph cache on a real Redis), ours from real GPU-less kernel loads (compiled on
one machine, fetched from the remote tier on another), and the line and CSV cells."""

import time

import pytest
import torch

from cutedsl_inductor.bench.first_call import (
    OURS,
    TORCH_COUNTS,
    TORCH_TIMES,
    Recorder,
    _hooked_columns,
    describe,
)
from cutedsl_inductor.bench.model_report import write_csv
from tests.compile.cache.test_remote_cache import load_on


def fn(x, w):
    return torch.relu(x @ w).sum(1).softmax(0) * 3


def first_call(compiled, *args):
    recorder = Recorder()
    begin = time.perf_counter()
    compiled(*args)
    seconds = time.perf_counter() - begin
    return seconds, recorder.columns(seconds)


# Inductor's own patch, not monkeypatch, whose undo deletes a config that was None: a
# deleted Inductor config is hidden, and every later compile with the FX cache raises
@torch._inductor.config.patch(fx_graph_remote_cache=True)
def test_a_cold_compile_then_its_cache_hit(tmp_path, monkeypatch, redis_server):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("TORCHINDUCTOR_REDIS_PORT", str(redis_server.port))
    args = torch.randn(32, 48), torch.randn(48, 40)
    torch._dynamo.reset()
    seconds, cold = first_call(torch.compile(fn), *args)
    assert cold["fc_fx_cache_misses"] == 1 and cold["fc_fx_cache_hits"] == 0
    assert 0 < cold["fc_inductor_s"] < cold["fc_compile_s"] <= seconds
    assert cold["fc_rest_s"] == pytest.approx(seconds - cold["fc_compile_s"])
    assert cold["fc_dynamo_s"] > 0 and cold["fc_backward_compile_s"] == 0
    assert "compile_file" in cold["fc_torch_top"]  # the C++ compile, under the containers
    assert "_compile.compile_inner" not in cold["fc_torch_top"]
    # Inductor's remote FX graph cache: looked up (a miss), then written
    assert cold["fc_inductor_remote_gets"] >= 1 and cold["fc_inductor_remote_puts"] >= 1
    assert "RemoteFxGraphCache" in cold["fc_remote_by_cache"]
    assert cold["fc_load_kernel_calls"] == 0 and cold["fc_cute_compiled"] == 0

    torch._dynamo.reset()  # a new frame compile: the cached graph is loaded
    seconds, warm = first_call(torch.compile(fn), *args)
    assert warm["fc_aot_cache_hits"] + warm["fc_fx_cache_hits"] >= 1
    assert warm["fc_inductor_s"] == 0 and warm["fc_autotune_s"] == 0
    assert 0 < warm["fc_cache_load_s"] < warm["fc_compile_s"] <= seconds
    assert warm["fc_output_code_s"] <= warm["fc_cache_load_s"]


def test_our_kernels_by_origin_and_the_remote_tier(graph, remote_redis, tmp_path, monkeypatch):
    recorder = Recorder()
    load_on(graph, monkeypatch, tmp_path / "a")  # compiled, published
    first = recorder.columns(1.0)
    assert first["fc_cute_compiled"] == 1 and first["fc_cute_compile_s"] > 0
    assert first["fc_load_kernel_calls"] == 1
    assert first["fc_load_kernel_s"] >= first["fc_cute_compile_s"]
    assert first["fc_redis_round_trips"] == 2  # the miss and the publication
    assert first["fc_redis_bytes_written"] > 0 and first["fc_cute_remote"] == 0

    recorder = Recorder()
    load_on(graph, monkeypatch, tmp_path / "b")  # another machine: fetched and adopted
    second = recorder.columns(1.0)
    assert second["fc_cute_compiled"] == 0 and second["fc_cute_remote"] == 1
    assert second["fc_redis_round_trips"] == 1
    assert second["fc_redis_bytes_read"] == first["fc_redis_bytes_written"]
    assert second["fc_cute_remote_fetch_s"] > 0 and second["fc_cute_remote_adopt_s"] > 0
    assert second["fc_load_kernel_s"] >= (second["fc_cute_remote_fetch_s"]
                                          + second["fc_cute_remote_adopt_s"])
    # our tier is Inductor's RemoteCache too: timed by the hook, kept apart from Inductor's
    assert "get CuteDSLRemoteCache 1" in second["fc_remote_by_cache"]
    assert second["fc_inductor_remote_gets"] == 0


def test_the_line_and_the_csv_cells(tmp_path):
    columns = Recorder().columns(0.5)  # nothing ran: every column, each 0 or None
    assert set(TORCH_TIMES) | set(TORCH_COUNTS) | set(OURS) <= set(columns)
    row = {"first_call_s": 0.5, "first_call_warm_s": 0.25, "cutlass_imported": False,
           **columns, **{f"warm_{k}": v for k, v in columns.items()}}
    row["warm_fc_cute_remote"], row["warm_fc_compile_s"] = 48, None
    cold, warm = describe(row), describe(row, warm=True)
    assert cold.startswith("cold 0.50 s = compile ") and "cutlass not imported" in cold
    assert warm.startswith("warm 0.25 s = compile ? [") and "remote 48: fetch" in warm
    assert describe({"first_call_s": 1.0}) == ""  # a row without a breakdown
    write_csv([row], tmp_path / "rows.csv")
    header, values = (tmp_path / "rows.csv").read_text().splitlines()
    cells = dict(zip(header.split(","), values.split(","), strict=True))
    assert cells["warm_fc_compile_s"] == "" and cells["warm_fc_cute_remote"] == "48"


def test_the_kernels_triton_compiled_most_often():
    """Per-kernel counts from the listener's entries (a re-tuned kernel compiles once per
    config tried); totals over all kernels as before."""
    before = {"triton compiled triton_poi_0": [1, 0.5]}
    now = {"triton compiled triton_poi_0": [4, 2.0], "triton compiled triton_red_1": [2, 1.0],
           "triton cache hit triton_poi_2": [5, 0.1], "triton compiled triton_per_3": [1, 0.2]}
    columns = _hooked_columns(before, now)
    assert columns["fc_triton_compiled_kernels"] == "triton_poi_0 3; triton_red_1 2; triton_per_3 1"
    assert columns["fc_triton_compiled"] == 6 and columns["fc_triton_cache_hits"] == 5
    assert _hooked_columns({}, {})["fc_triton_compiled_kernels"] is None


def test_the_kernels_whose_coordinate_descent_took_longest():
    before = {"coordesc triton_red_0": [1, 2.0]}
    now = {"coordesc triton_red_0": [2, 5.0], "coordesc triton_poi_1": [1, 4.0],
           "triton compiled triton_poi_1": [3, 1.0]}
    columns = _hooked_columns(before, now)
    assert columns["fc_coordesc_kernels"] == "triton_poi_1 4.00s; triton_red_0 3.00s"
    assert columns["fc_coordesc"] == 2 and columns["fc_coordesc_s"] == 7.0
    assert columns["fc_triton_compile_s"] == 1.0  # coordinate descent is not a compile


def test_coordinate_descent_is_timed_per_kernel_once_hooked():
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    from cutedsl_inductor.bench import first_call

    first_call.Recorder()
    first_call.Recorder()  # hooks installed once
    tuning = CachingAutotuner.coordinate_descent_tuning
    assert tuning.__wrapped__.__qualname__ == "CachingAutotuner.coordinate_descent_tuning"
    assert not hasattr(tuning.__wrapped__, "__wrapped__")


def test_where_our_fastest_choice_ranked_in_each_autotuning(graph):
    """Three of our real choices in the heuristic's order beside another backend's."""
    from cutedsl_inductor.bench import first_call
    from tests.runtime.test_workers import add_choices

    first, second, third = add_choices(graph, (64, 128, 256))
    aten = object()  # another backend's choice: no CuteDSL benchmark request
    before = {name: list(entry) for name, entry in first_call._hooked.items()}
    # settle_clocks_first moved our first choice ahead of the rest
    first_call._note_our_ranks({first: 0.30, second: 0.20, third: 0.25, aten: 0.10}, "mm", [],
                               [first, aten, second, third])
    first_call._note_our_ranks({first: 0.1, second: float("inf"), aten: 0.2}, "mm", [],
                               [first, aten, second, third])
    first_call._note_our_ranks({aten: 0.2}, "mm", [], [aten])  # none of ours: not counted
    now = {name: list(entry) for name, entry in first_call._hooked.items()}
    columns = _hooked_columns(before, now)
    assert columns["fc_our_autotunings"] == 2 and columns["fc_ours_won"] == 1
    assert columns["fc_our_best_ranks"] == "#1:1 #2:1"
