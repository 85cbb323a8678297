"""The cache's file operations on a real filesystem: modes, symlinks, locks."""

import contextlib
import os
import stat
import threading

import pytest

from cutedsl_inductor.compile.cache.cache_files import Folder, make_dirs, private_dir


@contextlib.contextmanager
def umask(value):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_folders_are_0700_and_files_0600_under_any_umask(tmp_path):
    with umask(0):
        make_dirs(tmp_path / "a" / "b")
        with Folder.open_root(tmp_path / "a" / "b") as root, root.child("cd", create=True) as sub:
            sub.write_atomic("x.json", b"{}")
            sub.write_atomic("x.json", b"[]")  # replaces
            assert sub.link_new("y", b"1") and not sub.link_new("y", b"2")
            os.close(sub.lock("x.lock"))
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/cd")] == [0o700] * 3
    folder = tmp_path / "a" / "b" / "cd"
    assert {p.name: mode(p) for p in folder.iterdir()} == {"x.json": 0o600, "y": 0o600,
                                                           "x.lock": 0o600}
    assert (folder / "x.json").read_bytes() == b"[]" and (folder / "y").read_bytes() == b"1"


def test_a_folder_or_file_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "k.json").write_text("theirs")
    root = tmp_path / "root"
    root.mkdir()
    (root / "ab").symlink_to(outside)
    (root / "cd").mkdir()
    (root / "cd" / "k.json").symlink_to(outside / "k.json")
    (root / "cd" / "k.lock").symlink_to(outside / "k.json")
    with Folder.open_root(root) as folder:
        with pytest.raises(NotADirectoryError):
            folder.child("ab")
        with pytest.raises(NotADirectoryError):
            folder.child("ab", create=True)
        with folder.child("cd") as sub:
            with pytest.raises(OSError):
                sub.read("k.json")
            with pytest.raises(OSError):
                sub.lock("k.lock")
            assert not sub.unlink_file("k.json")  # a symlink: left alone
            sub.write_atomic("k.json", b"ours")  # replaces the link, not its target
    assert (outside / "k.json").read_text() == "theirs"
    assert (root / "cd" / "k.json").read_bytes() == b"ours"
    assert (root / "cd" / "k.lock").is_symlink()


def test_read_and_unlink_take_regular_files_only(tmp_path):
    (tmp_path / "d.json").mkdir()
    os.mkfifo(tmp_path / "f.json")
    with Folder.open_root(tmp_path) as folder:
        for name in ("d.json", "f.json"):
            with pytest.raises(OSError, match="not a regular file"):
                folder.read(name)
            assert not folder.unlink_file(name)
        with pytest.raises(FileNotFoundError):
            folder.read("missing.json")
    assert (tmp_path / "d.json").is_dir() and stat.S_ISFIFO(os.lstat(tmp_path / "f.json").st_mode)


def test_a_lock_excludes_another_holder(tmp_path):
    with Folder.open_root(tmp_path) as folder:
        held = folder.lock("k.lock")
        assert folder.lock("k.lock", blocking=False) is None
        os.close(held)
        again = folder.lock("k.lock", blocking=False)
        assert again is not None
        os.close(again)


def test_a_waiter_whose_lock_file_was_unlinked_locks_the_new_one(tmp_path):
    """``cache clear`` unlinks a lock file while holding it: a process that waited on the
    old file must not hold its lock beside one that locked the new file."""
    with Folder.open_root(tmp_path) as folder:
        first = folder.lock("k.lock")
        acquired = threading.Event()

        def waiter():
            fd = folder.lock("k.lock")
            acquired.set()
            os.close(fd)

        thread = threading.Thread(target=waiter)
        thread.start()
        assert not acquired.wait(0.3)  # waits on the first file
        folder.unlink_file("k.lock")
        second = folder.lock("k.lock", blocking=False)  # the new file under the name
        assert second is not None
        os.close(first)  # the waiter wakes on the old file, then waits on the new one
        assert not acquired.wait(0.5)
        os.close(second)
        assert acquired.wait(5)
        thread.join(5)


def test_private_dirs_are_0700_and_removed(tmp_path):
    with private_dir() as folder:
        assert mode(folder) == 0o700
    assert not folder.exists()
