"""Tuning decisions persisted: sealed in the local cache, fetched from and published to a
real redis-server, cleared by ``cache clear``; an edited one is not used."""

import dataclasses
import json

from cutedsl_inductor import config, counters
from cutedsl_inductor.cli import main as cli_main
from cutedsl_inductor.compile.cache import decisions
from cutedsl_inductor.compile.cache.disk_cache import default_cache

KEY = decisions.decision_key("retime", {"candidates": ["a", "b"], "sizes": "64x64"})


def test_a_decision_is_kept_locally_and_sealed(kernel_cache_dir):
    assert decisions.lookup(KEY) is None
    decisions.save(KEY, {"winner": "b"})
    assert decisions.lookup(KEY) == {"winner": "b"}
    counts = dataclasses.asdict(counters.decisions)
    seconds = counts.pop("lookup_s")
    assert counts == {"local_hits": 1, "remote_hits": 0, "misses": 1, "saved": 1}
    assert 0 < seconds < 5  # the two lookups
    stored = json.loads((kernel_cache_dir / "decisions" / f"{KEY}.json").read_text())
    assert stored["key"] == KEY and stored["value"] == {"winner": "b"} and stored["mac"]
    assert decisions.entries() == [KEY]


def test_the_key_hashes_the_material_and_the_versions(monkeypatch):
    from cutedsl_inductor.compile import versions

    other = decisions.decision_key("retime", {"candidates": ["a", "b"], "sizes": "64x65"})
    forged = {**versions.toolchain_versions(), "apache-tvm-ffi": "0.0.1"}
    monkeypatch.setattr(versions, "toolchain_versions", lambda: forged)
    assert len({KEY, other, decisions.decision_key(
        "retime", {"candidates": ["a", "b"], "sizes": "64x64"})}) == 3


def test_an_edited_decision_is_not_used(kernel_cache_dir, caplog):
    decisions.save(KEY, {"winner": "b"})
    path = kernel_cache_dir / "decisions" / f"{KEY}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "value": {"winner": "a"}}))
    assert decisions.lookup(KEY) is None
    assert "ignoring unusable CuteDSL tuning decision" in caplog.text
    decisions.save(KEY, {"winner": "b"})  # the next save replaces it
    assert decisions.lookup(KEY) == {"winner": "b"}


def test_another_machine_fetches_it_and_keeps_it(remote_redis, tmp_path, monkeypatch):
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "a"))
    decisions.save(KEY, {"winner": "b"})
    assert remote_redis.keys() == [f"pt2:cutedsl-inductor::decision:{KEY}:c1"]
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "b"))
    assert decisions.lookup(KEY) == {"winner": "b"}
    assert counters.decisions.remote_hits == 1
    remote_redis.client.flushall()
    assert decisions.lookup(KEY) == {"winner": "b"}  # from b's local cache now
    assert counters.decisions.local_hits == 1


def test_cache_clear_removes_the_decisions(kernel_cache_dir, capsys):
    decisions.save(KEY, {"winner": "b"})
    assert cli_main(["cache", "info"]) == 0
    assert "decisions: 1 (tuning decisions)" in capsys.readouterr().out
    assert cli_main(["cache", "clear"]) == 0
    assert "removed 0 entries and 1 tuning decisions" in capsys.readouterr().out
    assert decisions.lookup(KEY) is None and decisions.entries() == []
    assert default_cache().mode.writable
