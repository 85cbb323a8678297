"""``bench sweep`` without a GPU: the configs it sweeps and ``--precompile``, which builds
them all into the kernel cache."""

from cutedsl_inductor import config
from cutedsl_inductor.bench.sweep import sweep_configs
from cutedsl_inductor.cli import main
from cutedsl_inductor import counters
from cutedsl_inductor.kernels.gemm.heuristic import pick_configs


def test_the_ranked_configs_come_first_with_their_rank_then_their_valid_variants():
    ranked = pick_configs(256, 512, 128, max_configs=2)
    swept = sweep_configs(256, 512, 128, [{"tile_k": 64}, {"tile_n": 160}], ranked_limit=2)
    assert [cfg for cfg, _ in swept[:2]] == ranked
    assert [rank for _, rank in swept] == [0, 1] + [None] * (len(swept) - 2)
    variants = [cfg for cfg, _ in swept[2:]]
    assert len(variants) == 2 and all(cfg.tile_k == 64 for cfg in variants)  # 160: invalid
    assert len({cfg.name for cfg, _ in swept}) == len(swept)


def test_precompile_builds_every_swept_config(capsys):
    with config.patch(gemm_max_configs=8):
        assert main(["bench", "sweep", "--shapes", "256x512x128", "--ranked", "2",
                     "--layouts", "nt,nn", "--precompile"]) == 0
    out = capsys.readouterr().out
    assert "256x512x128 nt: 2 configs compiled or cached" in out
    assert "256x512x128 nn: 2 configs compiled or cached" in out and "0 failure(s)" in out
    assert counters.kernels.compiled == 4  # a binary per config and layout of B
