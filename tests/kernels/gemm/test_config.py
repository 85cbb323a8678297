"""GemmConfig: typed, frozen, validated at construction; the one home of defaults."""

import dataclasses

import pytest

from cutedsl_inductor.kernels.gemm.config import GemmConfig, config_error


def test_defaults_are_a_valid_cooperative_128x128_config():
    cfg = GemmConfig()
    assert (cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.stages, cfg.group_size) == (128, 128, 64, 0, 8)
    assert cfg.name == "t128x128x64_c1x1_coop_rm"


def test_it_is_frozen_and_replace_validates_again():
    cfg = GemmConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tile_m = 64
    with pytest.raises(ValueError, match="tile_m=64 not in"):
        cfg.replace(tile_m=64)
    assert cfg.replace(tile_m=256).tile_m == 256


@pytest.mark.parametrize("fields,message", [
    (dict(tile_m=128.0), "tile_m=128.0 must be a int"),
    (dict(cooperative=1), "cooperative=1 must be a bool"),
    (dict(tile_n=True), "tile_n=True must be a int"),
    (dict(raster=None), "raster=None must be a str"),
    (dict(swap_ab=True), "swap_ab=True needs store='direct'"),
    (dict(group_size=0), "group_size=0 must be >= 1"),
    (dict(split_k=2, pingpong=True, cooperative=False, tile_m=64), "needs pingpong=False"),
])
def test_invalid_fields_raise_value_error_naming_the_rule(fields, message):
    with pytest.raises(ValueError, match=message):
        GemmConfig(**fields)
    assert message.split()[0] in config_error(**fields)


def test_derived_facts():
    pp = GemmConfig(tile_m=128, tile_n=128, cooperative=False, pingpong=True)
    assert (pp.tile_wgs, pp.consumer_wgs) == (1, 2)
    assert GemmConfig(swiglu="b").operand_tiles == (1, 2)
    swapped = GemmConfig(tile_n=16, store="direct", swap_ab=True, tile_m=64, cooperative=False)
    assert swapped.kernel_mn(16, 4096) == (4096, 16) and swapped.name.endswith("_swap")
    assert GemmConfig(split_k=4).resident_clusters(132) < 132 // 4
    assert GemmConfig(cluster_m=2).resident_clusters(132) == 66
