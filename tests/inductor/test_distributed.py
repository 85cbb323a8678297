"""Our choices in Inductor's distributed autotuning (GPU-less): the description of a
winner of ours survives pickling and rebuilds the same kernel on another graph's nodes of
the same op, loaded from the kernel cache; and two gloo ranks compile a graph together,
each loading the GEMM the other autotuned without compiling it."""

import contextlib
import dataclasses
import json
import pickle

import pytest
import torch
import torch.multiprocessing
from torch._inductor import config as inductor_config
from torch._inductor import ir
from torch._inductor.kernel_inputs import MMKernelInputs

from cutedsl_inductor import config, counters
from cutedsl_inductor.compile import compiler
from cutedsl_inductor.exc import DistributedChoiceError
from cutedsl_inductor.inductor import distributed
from cutedsl_inductor.template.caller import CuteDSLTemplateCaller
from tests.helpers import lowered, use_virtual_sm90
from tests.inductor.distributed_ranks import run_rank

pytestmark = pytest.mark.skipif(not distributed.supported(),
                                reason="this torch's distributed autotuning is not taken part in")


@pytest.fixture
def max_autotune(monkeypatch):
    use_virtual_sm90(monkeypatch)
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN,CUTEDSL"), \
            config.patch(gemm_max_configs=2):
        yield


@contextlib.contextmanager
def deferred_gemm(shapes):
    """Our choices, the MMKernelInputs and the layout of ``x @ w`` lowered at ``shapes``
    (V.graph is that graph inside the ``with``)."""
    with lowered(lambda x, w: x @ w, *shapes) as graph:
        (multi,) = [b for b in graph.buffers if isinstance(b, ir.MultiTemplateBuffer)]
        ours = [c for c in multi.choices if isinstance(c, CuteDSLTemplateCaller)]
        yield ours, MMKernelInputs(list(multi.original_inputs)), multi.layout


def test_a_winner_of_ours_travels_and_loads_from_the_cache_elsewhere(max_autotune):
    with deferred_gemm([(256, 512), (512, 384)]) as (ours, inputs, layout):
        winner = ours[1]
        record = pickle.loads(pickle.dumps(distributed.serialized(3, winner)))
        winner.precompile()  # the deciding rank compiles it while autotuning
        compiled = counters.kernels.compiled
        compiler._COMPILED.clear()  # the other rank: another process
        rebuilt = record.get_choice(layout, inputs)
        assert record.index == 3 and isinstance(rebuilt, CuteDSLTemplateCaller)
        assert (rebuilt.name, rebuilt.source, rebuilt.params) == (
            winner.name, winner.source, winner.params)
        rebuilt.load()
    assert counters.kernels.compiled == compiled == 1
    assert counters.kernels.disk_hits == 1


def test_a_description_rebuilds_on_any_shape_of_its_kernel(max_autotune):
    """The GEMM compiles sizes as runtime values where their divisibility is the same:
    another N of that class is the same kernel."""
    with deferred_gemm([(256, 512), (512, 384)]) as (ours, _, _):
        description = distributed.ChoiceDescription.of(ours[0])
    with deferred_gemm([(256, 512), (512, 256)]) as (_, inputs, layout):
        assert description.rebuild(inputs.nodes(), layout).name == description.kernel


@pytest.mark.parametrize("differing", ["argument specs", "rendered source", "template"])
def test_a_description_that_renders_another_kernel_here_is_refused(differing, max_autotune):
    with deferred_gemm([(256, 512), (512, 384)]) as (ours, _, _):
        description = distributed.ChoiceDescription.of(ours[0])
    n = 200 if differing == "argument specs" else 384  # divisible by 8, not by 16
    suffix = "other" if differing == "rendered source" else config.entry_suffix
    if differing == "template":
        description = dataclasses.replace(description, template="not_registered")
    expected = (f"its {differing} differ" if differing != "template"
                else "no template of that name")
    with config.patch(entry_suffix=suffix), \
            deferred_gemm([(256, 512), (512, n)]) as (_, inputs, layout), \
            pytest.raises(DistributedChoiceError, match=expected):
        description.rebuild(inputs.nodes(), layout)


def test_two_ranks_share_the_gemms_they_autotuned(tmp_path, redis_server, monkeypatch):
    """Rank r autotunes GEMM r and compiles our choices for it; it loads the other GEMM,
    rebuilt from rank 1-r's winner, from the shared disk cache (``disk``) or the Redis
    tier (``redis``, a disk cache per rank) without compiling it; an ATen winner is
    rebuilt as ATen's (GEMM 1 of ``disk``). With the knob off, the GEMMs Inductor
    distributes get no choice of ours and the compile still goes through."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch.multiprocessing.spawn(run_rank, nprocs=2, args=(
        2, str(tmp_path), ["disk", "redis", "off"], redis_server.port))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    (zero, one), (disk0, disk1) = ([rank["redis"] for rank in ranks],
                                   [rank["disk"] for rank in ranks])
    assert zero["kernels"] == one["kernels"] == sorted(zero["tuned"] + one["tuned"])
    assert len(zero["tuned"]) == len(one["tuned"]) == 1
    assert disk1["tuned"] == ["aten"] and disk0["kernels"] == disk1["kernels"] == disk0["tuned"]
    for rank in (zero, one, disk0, disk1):  # its own choice, while autotuning: nothing else
        assert rank["compiled"] == rank["compiled_while_tuning"] == 1
    assert zero["remote_hits"] == one["remote_hits"] == 1
    assert (disk0["disk_hits"], disk1["disk_hits"]) == (0, 1)
    for rank in ranks:
        assert rank["off"] == {"tuned": [], "kernels": [], "compiled_while_tuning": 0,
                               "compiled": 0, "disk_hits": 0, "remote_hits": 0}
