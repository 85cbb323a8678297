"""The remote tier on a real redis-server, with real GPU-less compiles of the add
template: a local miss is fetched, verified, stored locally and loaded; a compile
publishes; a fleet secret seals what is published and refuses what is not sealed."""

import dataclasses

import pytest

from cutedsl_inductor import config, counters
from cutedsl_inductor.compile import compiler, versions
from cutedsl_inductor.compile.cache import portable, remote_cache
from cutedsl_inductor.compile.cache.disk_cache import default_cache
from tests.compile.cache.test_disk_cache import add_choice, key_of


def load_on(graph, monkeypatch, cache_dir, threads=128):
    """Load the add kernel as a new process with its own local cache would."""
    monkeypatch.setattr(config, "cache_dir", str(cache_dir))
    compiler._COMPILED.clear()
    return add_choice(graph, threads=threads).load()


def test_a_compile_publishes_and_another_machine_loads_it(graph, remote_redis, tmp_path,
                                                           monkeypatch):
    first = load_on(graph, monkeypatch, tmp_path / "a")
    assert first.origin == "compiled" and remote_redis.keys() == [
        f"pt2:cutedsl-inductor::kernel:{key_of(add_choice(graph))}:c1"]
    second = load_on(graph, monkeypatch, tmp_path / "b")
    assert second.origin == "remote" and counters.kernels.compiled == 1
    (entry,) = default_cache().entries()  # stored, and sealed under b's own secret
    assert entry["verified"] and entry["template"] == "elementwise_add"
    assert entry["params"] == {"THREADS": "128", "VECTOR": "4"}
    assert load_on(graph, monkeypatch, tmp_path / "b").origin == "disk"
    counts = dataclasses.asdict(counters.remote)
    traffic = {name: counts.pop(name) for name in
               ("round_trips", "bytes_read", "bytes_written", "seconds")}
    assert counts == {"hits": 1, "misses": 1, "rejected": 0, "published": 1,
                                  "errors": 0}
    # a's miss and publication, b's fetch of what a published (the bytes it wrote)
    assert traffic["round_trips"] == 3 and traffic["bytes_read"] == traffic["bytes_written"] > 0
    assert 0 < traffic["seconds"] < 5
    assert counters.kernels.compile_s > 0 and counters.kernels.remote_adopt_s > 0
    assert counters.kernels.remote_fetch_s > 0


def test_the_value_is_a_portable_entry_bound_to_its_key(graph, remote_redis, tmp_path,
                                                        monkeypatch):
    load_on(graph, monkeypatch, tmp_path / "a")
    key = key_of(add_choice(graph))
    (name,) = remote_redis.keys()
    header, payload = portable.unpack(remote_redis.client.get(name), key, "test", None,
                                      "kernel")
    assert header["versions"] == versions.toolchain_versions() and "mac" not in header
    assert payload == (default_cache().root / key[:2] / f"{key}.o").read_bytes()


def test_without_a_disk_cache_nothing_goes_remote(graph, remote_redis, tmp_path, monkeypatch):
    monkeypatch.setattr(config, "disk_cache", False)
    load_on(graph, monkeypatch, tmp_path / "a")
    assert remote_redis.keys() == []


@pytest.fixture
def fleet_secret(tmp_path, monkeypatch):
    def use(name, text="a secret the fleet shares, 32 b"):
        path = tmp_path / name
        path.write_text(text + "\n")
        monkeypatch.setattr(config, "remote_cache_secret_file", str(path))
        remote_cache._tier_for.cache_clear()
        portable._read_secret.cache_clear()
    return use


def test_under_a_fleet_secret_entries_are_sealed_and_only_sealed_ones_load(
        graph, remote_redis, tmp_path, monkeypatch, fleet_secret, caplog):
    load_on(graph, monkeypatch, tmp_path / "unsealed")  # published before the secret
    fleet_secret("secret")
    assert load_on(graph, monkeypatch, tmp_path / "a").origin == "compiled"
    assert "its seal does not verify under the fleet secret" in caplog.text
    (name,) = remote_redis.keys()
    assert "mac" in portable.unpack(remote_redis.client.get(name), key_of(add_choice(graph)),
                                    "test", portable.fleet_secret())[0]
    assert load_on(graph, monkeypatch, tmp_path / "b").origin == "remote"
    fleet_secret("other", "another fleet's secret, 32 bytes")
    assert load_on(graph, monkeypatch, tmp_path / "c").origin == "compiled"
    assert counters.kernels.compiled == 3 and counters.remote.rejected == 2


def test_a_fleet_secret_that_cannot_be_used_turns_the_tier_off(
        graph, remote_redis, tmp_path, monkeypatch, fleet_secret, caplog):
    fleet_secret("short", "too short")
    assert load_on(graph, monkeypatch, tmp_path / "a").origin == "compiled"
    assert "cannot be used (a fleet secret needs at least 16 bytes, this one has 9); off for " \
        "this process" in caplog.text
    assert remote_redis.keys() == []
