"""The cache secret and the seal of manifests."""

import os
import stat
import threading

import pytest

from cutedsl_inductor.compile.cache.cache_files import Folder
from cutedsl_inductor.compile.cache.integrity import (
    SECRET_BYTES,
    SECRET_NAME,
    check_seal,
    read_secret,
    seal,
)


def test_the_secret_is_made_once_0600_and_processes_starting_together_agree(tmp_path):
    owner = os.getuid()
    with Folder.open_root(tmp_path) as root:
        assert read_secret(root, owner, create=False) is None
        seen = []
        threads = [threading.Thread(target=lambda: seen.append(read_secret(root, owner, True)))
                   for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(seen)) == 1 and len(seen[0]) == SECRET_BYTES
        assert read_secret(root, owner, create=False) == seen[0]
    assert stat.S_IMODE(os.stat(tmp_path / SECRET_NAME).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [SECRET_NAME]  # no temp file left


@pytest.mark.parametrize("damage", ["world_writable", "short", "symlink", "other_owner"])
def test_an_untrusted_secret_is_refused(tmp_path, damage):
    path = tmp_path / SECRET_NAME
    path.write_bytes(os.urandom(SECRET_BYTES))
    path.chmod(0o600)
    if damage == "world_writable":
        path.chmod(0o602)
    elif damage == "short":
        path.write_bytes(b"0" * 8)
    elif damage == "symlink":
        path.rename(tmp_path / "elsewhere")
        path.symlink_to(tmp_path / "elsewhere")
    else:
        if os.geteuid() != 0:
            pytest.skip("making a file of another user needs root")
        os.chown(path, 12345, 12345)
    with Folder.open_root(tmp_path) as root, pytest.raises(OSError):
        read_secret(root, os.getuid(), create=True)


def test_the_seal_covers_every_field():
    secret = os.urandom(SECRET_BYTES)
    manifest = {"key": "ab" * 32, "size": 10, "sha256": "00" * 32, "params": {"T": "1"}}
    manifest["mac"] = seal(secret, manifest)
    assert check_seal(secret, manifest)
    assert not check_seal(os.urandom(SECRET_BYTES), manifest)
    for field, value in (("key", "cd" * 32), ("size", 11), ("sha256", "11" * 32),
                         ("params", {"T": "2"}), ("mac", None)):
        assert not check_seal(secret, {**manifest, field: value})
    assert not check_seal(secret, {k: v for k, v in manifest.items() if k != "mac"})
