"""What the compiler refuses to build: an arch CuTe DSL does not know, compile options
that would set what entries are labelled with."""

import pytest

from cutedsl_inductor import config, counters
from cutedsl_inductor.exc import ConfigError
from tests.compile.cache.test_disk_cache import add_choice


def test_an_unknown_arch_is_refused_before_anything_compiles(graph, monkeypatch):
    monkeypatch.setattr(config, "arch", "sm_99")
    with pytest.raises(ConfigError, match="cutedsl_inductor.config.arch='sm_99'.*sm_90a"):
        add_choice(graph).load()
    assert counters.kernels.compiled == 0


@pytest.mark.parametrize("options", ["--gpu-arch sm_80", "--keep-ptx --gpu-a=sm_80",
                                     "--enable-tvm-ffi", "--host-target aarch64"])
def test_options_cutedsl_sets_itself_are_refused(options):
    """An entry labelled sm_90a must hold sm_90a code: refused where they are set."""
    with pytest.raises(ConfigError, match="--gpu-arch.*CUTEDSL_INDUCTOR_ARCH"):
        config.compile_options = options
    assert config.compile_options == ""


def test_a_dump_dir_that_does_not_exist_is_refused_and_one_that_does_gets_the_cubin(
        graph, monkeypatch, tmp_path):
    """CuTe DSL dumps nothing into a folder that does not exist, and says nothing."""
    with pytest.raises(ConfigError, match="a --dump-dir that is a folder"):
        monkeypatch.setattr(config, "compile_options",
                            f"--keep-cubin --dump-dir={tmp_path / 'no'}")
        add_choice(graph).load()
    assert counters.kernels.compiled == 0
    monkeypatch.setattr(config, "compile_options", f"--keep-cubin --dump-dir={tmp_path}")
    add_choice(graph).load()
    assert list(tmp_path.glob("*.cubin"))
