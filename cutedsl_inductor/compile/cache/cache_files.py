"""File operations of the kernel cache that follow no symlink below its root, write
nothing outside it and never leave a partial file.

``Folder`` is an open directory (a descriptor; below the root opened with O_NOFOLLOW,
so a folder that is a symlink is refused) and every file in it is opened, replaced and
unlinked relative to that descriptor: a folder swapped for a symlink after it was
opened cannot redirect anything. Files are created 0600 and folders 0700, whatever the
umask. A write goes to ``.<name>.<random>.tmp`` (O_EXCL), renamed over ``name``.
``unlink_file`` removes regular files only. ``lock`` is a ``flock`` on a lock file; if
the file was unlinked (``cache clear``) while this process waited for it, the lock is
taken again on the file now under that name, so two holders never coexist.

``private_dir`` is a fresh 0700 temp folder outside the cache, for exporting an object
and for loading the bytes that were verified (nobody else can write there).

Failure semantics: everything raises OSError; callers decide what a fault means.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


def make_dirs(path: Path) -> None:
    """``mkdir -p path``, each folder it creates 0700."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            continue
        os.chmod(folder, 0o700)  # the umask may have taken bits off


def _not_regular(name: str) -> OSError:
    return OSError(errno.EINVAL, "not a regular file", name)


class Folder:
    """An open folder: the cache root (``open_root``: the path may be a symlink, the
    user's choice) or a folder in it (``child``: never a symlink)."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def open_root(cls, path: Path) -> "Folder":
        return cls(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path)

    def child(self, name: str, create: bool = False) -> "Folder":
        created = False
        if create:
            try:
                os.mkdir(name, 0o700, dir_fd=self.fd)
                created = True
            except FileExistsError:
                pass
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _OPEN_FLAGS, dir_fd=self.fd)
        if created:
            os.fchmod(fd, 0o700)  # the umask may have taken bits off
        return Folder(fd, self.path / name)

    def __enter__(self) -> "Folder":
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    def lstat(self, name: str) -> os.stat_result:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def is_file(self, name: str) -> bool:
        try:
            return stat.S_ISREG(self.lstat(name).st_mode)
        except FileNotFoundError:
            return False

    def file_size(self, name: str) -> int:
        """The size of the regular file ``name``; 0 if there is none."""
        try:
            info = self.lstat(name)
        except FileNotFoundError:
            return 0
        return info.st_size if stat.S_ISREG(info.st_mode) else 0

    def open_file(self, name: str) -> int:
        """A read-only descriptor of the regular file ``name`` (FileNotFoundError if none)."""
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _OPEN_FLAGS, dir_fd=self.fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise _not_regular(name)
        return fd

    def read(self, name: str) -> bytes:
        with open(self.open_file(name), "rb") as f:
            return f.read()

    def _temp_copy(self, name: str, data: bytes) -> str:
        """A new temp file (``.<name>.<random>.tmp``) holding ``data``: its name."""
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o600,
                     dir_fd=self.fd)
        try:
            with open(fd, "wb") as f:
                f.write(data)
        except BaseException:
            self._unlink_quietly(tmp)
            raise
        return tmp

    def _unlink_quietly(self, name: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=self.fd)

    def write_atomic(self, name: str, data: bytes) -> None:
        tmp = self._temp_copy(name, data)
        try:
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            self._unlink_quietly(tmp)
            raise

    def link_new(self, name: str, data: bytes) -> bool:
        """Create ``name`` holding ``data``, complete from its first moment (hard link of a
        written temp file); False if ``name`` exists already."""
        tmp = self._temp_copy(name, data)
        try:
            os.link(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        finally:
            self._unlink_quietly(tmp)

    def unlink_file(self, name: str) -> bool:
        """Unlink ``name`` if it is a regular file (never a folder or a symlink's
        target); whether one was removed."""
        if not self.is_file(name):
            return False
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True

    def lock(self, name: str, blocking: bool = True) -> int | None:
        """``flock`` the lock file ``name`` (created 0600): the locked descriptor (close
        it to release), or None when another holds it and ``blocking`` is False."""
        while True:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _OPEN_FLAGS, 0o600,
                         dir_fd=self.fd)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise _not_regular(name)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
                except BlockingIOError:
                    os.close(fd)
                    return None
                if self._names_file(name, fd):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # unlinked while we waited: lock the file under the name now

    def _names_file(self, name: str, fd: int) -> bool:
        try:
            return self.lstat(name).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False


@contextlib.contextmanager
def private_dir() -> Iterator[Path]:
    """A new 0700 temp folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="cutedsl-inductor-") as folder:
        yield Path(folder)
