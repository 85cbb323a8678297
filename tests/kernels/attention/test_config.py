"""FlexConfig refuses what the kernel cannot run, naming why."""

import pytest

from cutedsl_inductor.kernels.attention.config import FlexConfig, default_configs


def config(**changes):
    fields = dict(head_dim=128, block_n=128, stages=2, sparse_q_block=128, sparse_kv_block=128,
                  has_full_blocks=True, sm_scale=0.125)
    return FlexConfig(**{**fields, **changes})


@pytest.mark.parametrize("changes, reason", [
    (dict(head_dim=256), "head dim 256"),
    (dict(head_dim=32), "head dim 32"),
    (dict(sparse_q_block=64), "Q block size 64"),
    (dict(sparse_kv_block=64), "KV block size 64"),
    (dict(stages=4), "shared memory"),
    (dict(block_n=32), "block_n 32"),
    (dict(fold_scale=True, sm_scale=-0.125), "sm_scale -0.125 cannot be folded"),
    (dict(fold_scale=True, sm_scale=0.0), "sm_scale 0.0 cannot be folded"),
])
def test_refused_configs_say_why(changes, reason):
    with pytest.raises(ValueError, match=reason):
        config(**changes)


def test_kv_tiles_per_block():
    assert config(block_n=64, stages=3, sparse_kv_block=256).kv_tiles_per_block == 4


def test_default_configs_fit_the_blockmask():
    assert [c.block_n for c in default_configs(64, 128, 128, True, 0.1)] == [128, 64]
    assert [c.block_n for c in default_configs(128, 128, 64, False, 0.1)] == [64]
    assert default_configs(128, 64, 128, True, 0.1) == []  # Q blocks smaller than the tile


def test_persistent_configs_hold_two_q_tiles():
    """The next tile's Q loads while one tile runs: a second Q buffer, which a ring that
    just fits beside one does not leave room for."""
    assert config(persistent=True).smem_bytes() - config().smem_bytes() == 128 * 128 * 2
    config(block_n=64, stages=5)
    with pytest.raises(ValueError, match="shared memory"):
        config(block_n=64, stages=5, persistent=True)
    offered = default_configs(128, 128, 128, True, 0.1, persistent=True)
    assert [(c.block_n, c.persistent) for c in offered] == [(128, True), (64, True)]
    assert not any(c.persistent for c in default_configs(128, 128, 128, True, 0.1))
