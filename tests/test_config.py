"""Knobs from environment variables: parsed strictly, a bad value one clear error."""

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cutedsl_inductor import config
from cutedsl_inductor.exc import ConfigError, UnknownKnobError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def reload_config(monkeypatch):
    """Re-read the knobs from the environment as set in the test; after it, the module as
    it was (its classes too: other modules hold them, e.g. ``config.Reach``)."""
    saved = dict(vars(config))
    yield lambda: importlib.reload(config)
    monkeypatch.undo()
    vars(config).update(saved)


@pytest.mark.parametrize("raw, value", [("1", True), ("TRUE", True), (" yes ", True),
                                        ("On", True), ("0", False), ("false", False),
                                        ("NO", False), ("off", False), ("", True)])
def test_booleans_take_a_fixed_set_of_words(monkeypatch, reload_config, raw, value):
    monkeypatch.setenv("CUTEDSL_INDUCTOR_DISK_CACHE", raw)
    assert reload_config().disk_cache is value


@pytest.mark.parametrize("raw, value", [("choice", "choice"), ("ON", "on"), ("1", "on"),
                                        ("off", "off"), ("no", "off")])
def test_a_mode_takes_its_words_and_a_booleans(monkeypatch, reload_config, raw, value):
    monkeypatch.setenv("CUTEDSL_INDUCTOR_FLEX_PERSISTENT", raw)
    assert reload_config().flex_persistent == value


def test_a_mode_assigned_a_bool_holds_its_word():
    with config.patch(flex_persistent=True):
        assert config.flex_persistent == "on"
    with config.patch(flex_persistent=False):
        assert config.flex_persistent == "off"


@pytest.mark.parametrize("variable, raw, accepted", [
    ("CUTEDSL_INDUCTOR_DISK_CACHE", "maybe", "a boolean: 1/true/yes/on/0/false/no/off"),
    ("CUTEDSL_INDUCTOR_FLEX_PERSISTENT", "sometimes", "one of off, on, choice"),
    ("CUTEDSL_INDUCTOR_EPILOGUE_FUSION", "disabled", "a boolean"),
    ("CUTEDSL_INDUCTOR_GEMM_MAX_CONFIGS", "abc", "an integer from 1 to 1024"),
    ("CUTEDSL_INDUCTOR_GEMM_MAX_CONFIGS", "0", "an integer from 1 to 1024"),
    ("CUTEDSL_INDUCTOR_FUSED_CHOICE_CANDIDATES", "-5", "an integer from 0 to 64"),
    ("CUTEDSL_INDUCTOR_COMPILE_WORKERS", "100000", f"an integer from 0 to {os.cpu_count()}"),
    ("CUTEDSL_INDUCTOR_AUTOTUNE_SETTLE_MS", "1e3", "an integer from 0 to 60000"),
    ("CUTEDSL_INDUCTOR_COMPILE_OPTIONS", "--gpu-arch sm_80", "other than --gpu-arch"),
    ("CUTEDSL_INDUCTOR_COMPILE_OPTIONS", "--keep-cubin --dump-dir=/nonexistent",
     "a --dump-dir that is a folder ('/nonexistent' is none"),
    ("CUTEDSL_INDUCTOR_COMPILE_OPTIONS", "--keep-ptx --dump-dir /nonexistent",
     "a --dump-dir that is a folder ('/nonexistent' is none"),
    ("CUTEDSL_INDUCTOR_ARCH", "foo", "a GPU arch such as sm_90a"),
    ("CUTE_DSL_ARCH", "sm90", "a GPU arch such as sm_90a"),
    ("CUTEDSL_INDUCTOR_ENTRY_SUFFIX", "x(): pass\nimport os", "letters, digits and _"),
    ("CUTEDSL_INDUCTOR_ENTRY_SUFFIX", "kernel", "other than kernel, jit, "),
    ("CUTEDSL_INDUCTOR_ENTRY_SUFFIX", "epilogue_apply", "other than kernel, jit, "),
    ("TORCHINDUCTOR_REDIS_URL", "redis://127.0.0.1:notaport", "PORT from 1 to 65535"),
    ("TORCHINDUCTOR_REDIS_URL", "redis://127.0.0.1:99999", "PORT from 1 to 65535"),
    ("TORCHINDUCTOR_REDIS_URL", "redis://[::1", "a Redis URL"),
    ("TORCHINDUCTOR_REDIS_URL", "http://127.0.0.1:6379", "a Redis URL"),
])
def test_a_bad_value_names_the_variable_and_what_it_accepts(monkeypatch, reload_config,
                                                            variable, raw, accepted):
    monkeypatch.delenv("CUTEDSL_INDUCTOR_ARCH", raising=False)
    monkeypatch.setenv(variable, raw)
    with pytest.raises(ConfigError) as info:
        reload_config()
    assert str(info.value).startswith(f"{variable}={raw.strip()!r} is not accepted: expected ")
    assert accepted in str(info.value)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379", "rediss://user:pw@cache:6380/0",
                                 "redis://cache", "unix:///run/redis.sock"])
def test_a_redis_url_with_a_port_or_a_socket_is_taken(monkeypatch, reload_config, url):
    monkeypatch.setenv("TORCHINDUCTOR_REDIS_URL", url)
    assert reload_config().redis_url == url


def test_a_dump_dir_that_exists_is_taken(monkeypatch, reload_config, tmp_path):
    options = f"--keep-cubin --dump-dir={tmp_path}"
    monkeypatch.setenv("CUTEDSL_INDUCTOR_COMPILE_OPTIONS", options)
    assert reload_config().compile_options == options


def test_the_entry_suffix_names_nothing_the_templates_define_beside_the_entry():
    """Every ``<kernel_name>_<name>`` the package's templates and hooks define, and the
    docs' examples, is refused as the entry's suffix (the entry would replace it)."""
    texts = [p.read_text() for p in (ROOT / "cutedsl_inductor").rglob("*.py")]
    texts += [(ROOT / "README.md").read_text(), (ROOT / "docs" / "templates.md").read_text()]
    defined = {name for text in texts for name in re.findall(
        r"(?:\{\{kernel_name\}\}|\{self\.kernel_name\}|<kernel_name>)_(\w+)", text)}
    assert defined - {"main"} <= set(config.TAKEN_SUFFIXES), defined
    assert "kernel" in defined


def test_the_import_fails_with_that_one_line():
    env = {**os.environ, "CUTEDSL_INDUCTOR_GEMM_MAX_CONFIGS": "abc"}
    run = subprocess.run([sys.executable, "-c", "import cutedsl_inductor"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "cutedsl_inductor.exc.ConfigError: CUTEDSL_INDUCTOR_GEMM_MAX_CONFIGS='abc' is not "
        "accepted: expected an integer from 1 to 1024")
    assert "invalid literal for int()" not in run.stderr


def test_the_cache_key_holds_exactly_the_knobs_that_change_generated_code():
    assert set(config.snapshot()) == {"entry_suffix", "compile_options", "arch",
                                      "gemm_max_configs", "gemm_exhaustive", "gemm_pdl",
                                      "epilogue_fusion", "fused_choice_candidates",
                                      "flex_attention", "flex_max_configs",
                                      "flex_only_ours", "flex_pipelined", "flex_pingpong",
                                      "flex_persistent", "flex_fold_scale",
                                      "flex_bwd_fused_dq", "flex_bwd_lpt", "flex_bwd_early_s",
                                      "prologue_fusion", "sdpa", "aot", "fp8", "fp8_swiglu",
                                      "distributed_autotune"}
    with config.patch(gemm_max_configs=3):
        assert config.snapshot()["gemm_max_configs"] == 3


def test_a_benchmark_request_carries_the_knobs_that_locate_a_binary():
    assert set(config.binary_knobs()) == {"cache_dir", "disk_cache", "arch", "entry_suffix",
                                           "compile_options", "remote_cache",
                                           "remote_cache_timeout_ms",
                                           "remote_cache_secret_file", "redis_url",
                                           "redis_host", "redis_port"}
    with config.patch(cache_dir="/elsewhere"):
        assert config.binary_knobs()["cache_dir"] == "/elsewhere"


def test_every_knob_is_a_module_attribute_read_from_its_variable(monkeypatch, reload_config):
    for variable in [v for knob in config.KNOBS.values() for v in knob.env]:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("CUTEDSL_INDUCTOR_FUSED_CHOICE_CANDIDATES", "5")
    fresh = reload_config()
    for name, knob in fresh.KNOBS.items():
        assert getattr(fresh, name) == (5 if name == "fused_choice_candidates" else knob.default)


def test_an_assignment_to_no_knob_is_refused_naming_it_and_the_closest():
    with pytest.raises(UnknownKnobError, match=r"no knob 'epilog_fusion' \(did you mean "
                                                r"'epilogue_fusion'\?\)"):
        config.epilog_fusion = False
    assert not hasattr(config, "epilog_fusion") and config.epilogue_fusion is True
    with pytest.raises(ConfigError, match="no knob 'gemm_max_config'"):
        with config.patch(gemm_max_config=3):
            pass


@pytest.mark.parametrize("name, value, accepted", [
    ("compile_workers", "lots", "an integer from 0 to"),
    ("compile_workers", True, "an integer from 0 to"),
    ("gemm_max_configs", 0, "an integer from 1 to 1024"),
    ("epilogue_fusion", "no", "True or False"),
    ("disk_cache", 0, "True or False"),
    ("arch", "sm90", "sm_"),
    ("compile_options", "--gpu-arch sm_100a", ""),
    ("cache_dir", 3, ""),
    ("flex_persistent", "always", "one of off, on, choice"),
])
def test_an_assignment_the_knob_refuses_raises_naming_it(name, value, accepted):
    before = getattr(config, name)
    with pytest.raises(ConfigError, match=rf"^config\.{name}={value!r} is not accepted: "
                                          rf"expected .*{accepted}"):
        setattr(config, name, value)
    with pytest.raises(ConfigError, match=rf"config\.{name}="):
        with config.patch(**{name: value}):
            pass
    assert getattr(config, name) == before


def test_an_accepted_assignment_holds_until_set_back():
    with config.patch(gemm_max_configs=3, arch="sm_100a", redis_url=None):
        assert (config.gemm_max_configs, config.arch) == (3, "sm_100a")
    config.epilogue_fusion = False
    try:
        assert config.snapshot()["epilogue_fusion"] is False
    finally:
        config.epilogue_fusion = True
