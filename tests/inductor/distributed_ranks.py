"""The ranks of ``test_distributed.py``: processes of one gloo group (spawned by
torch.multiprocessing) that each lower and generate code for the same graph, two chained
GEMMs, under Inductor's distributed autotuning on a virtual sm_90, and write what they
compiled and loaded to ``<workdir>/rank<r>.json``.

Rank r autotunes the GEMM of index r: it compiles our choices for it (what Inductor's
precompile does) and gives the node the timings benchmarking would have measured (nothing
runs without a GPU): ours fastest, but for the GEMMs of ``ATEN_WINS``; the other GEMM is
a placeholder that Inductor rebuilds from the winner the other rank sends. Scenarios:
``disk``, one kernel cache folder for both ranks (one machine), our epilogue fusion off
(so our winner stays deferred) and ATen winning GEMM 1; ``redis``, a folder per rank and
the Redis tier (two machines), fusion on (our winners finalized before the exchange);
``off``, ``config.distributed_autotune`` off.
"""

import json
import os

import torch
import torch.distributed as dist

# the two GEMMs of a scenario differ in N's divisibility (16, 8), so in their kernels
SHAPES = {"disk": [(256, 512), (512, 384), (384, 200)],
          "redis": [(128, 256), (256, 192), (192, 40)],
          "off": [(64, 128), (128, 64), (64, 32)]}
ATEN_WINS = {"disk": {1}}


def chained_gemms(a, b, c):
    return (a @ b) @ c


def run_rank(rank, world, workdir, scenarios, redis_port):
    dist.init_process_group("gloo", init_method=f"file://{workdir}/store", rank=rank,
                            world_size=world)
    try:
        report = {name: scenario(name, rank, workdir, redis_port) for name in scenarios}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(workdir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def scenario(name, rank, workdir, redis_port):
    from torch._inductor import config as inductor_config
    from torch._inductor import distributed_autotune

    from cutedsl_inductor import config
    from cutedsl_inductor.bench.lowering import (
        kernel_definitions,
        load_kernels,
        lowered,
        virtual_sm90,
    )
    from cutedsl_inductor import counters

    folder = f"kernels{rank}" if name == "redis" else "kernels"
    knobs = dict(distributed_autotune=name != "off", epilogue_fusion=name != "disk",
                 gemm_max_configs=1, compile_workers=0, cache_dir=os.path.join(workdir, folder),
                 remote_cache=name == "redis", redis_url=None, redis_host="127.0.0.1",
                 redis_port=redis_port)
    before = counters.snapshot()["kernels"]
    with virtual_sm90(), config.patch(**knobs), inductor_config.patch(
            max_autotune=True, max_autotune_gemm_backends="ATEN,CUTEDSL",
            distributed_max_autotune_gemm=True), distributed_autotune.graph_context(), \
            lowered(chained_gemms, *SHAPES[name], dtype=torch.bfloat16) as graph:
        tuned = autotune_here(graph, ATEN_WINS.get(name, set()))
        code = graph.codegen()[0].value
        compiled_while_tuning = counters.kernels.compiled - before["compiled"]
        definitions = kernel_definitions(code)
        load_kernels(definitions)
    counts = {k: getattr(counters.kernels, k) - before[k]
              for k in ("compiled", "disk_hits", "remote_hits")}
    return {"tuned": tuned, "kernels": sorted(d.targets[0].id for d in definitions),
            "compiled_while_tuning": compiled_while_tuning, **counts}


def autotune_here(graph, aten_wins):
    """What Inductor's autotuning does to this rank's deferred GEMMs before the ranks
    exchange winners: our choices compiled, every choice timed (here: given timings).
    Returns the winners, ours by kernel name."""
    from torch._inductor import distributed_autotune, ir

    from cutedsl_inductor.template.caller import CuteDSLTemplateCaller

    winners = []
    for multi in graph.buffers:
        if not isinstance(multi, ir.MultiTemplateBuffer) or isinstance(
                multi, distributed_autotune._DistributedAutotuneBuffer):
            continue
        ours = [c for c in multi.choices if isinstance(c, CuteDSLTemplateCaller)]
        for choice in ours:
            choice.precompile()
        index = multi.origin_node.meta[distributed_autotune._DISTRIBUTED_AUTOTUNE_KEY].index
        aten_ms = 0.5 if index in aten_wins else 9.0
        multi._choice_timings[None] = {
            c: 1.0 + ours.index(c) if c in ours else aten_ms for c in multi.choices}
        winners.append("aten" if index in aten_wins else ours[0].name)
    return winners
