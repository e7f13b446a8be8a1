"""Writing files in places other users share (the HF cache, the state directory, a job's output
folder) without following links someone else planted there (issue 27). Standard library only:
the supervise bundle writes its state with it inside the containers.

- `write_atomic(path, data)`: the one atomic write of kit. A new file of a random name is created
  with O_EXCL|O_NOFOLLOW in the folder (opened once, as a directory handle), written, then
  renamed over `path`: a reader sees the old file or the new one, never half of one, and a link
  at `path` or at the temporary name is replaced, never written through.
- `open_private(path, flags)`: open (create) one file of kit's own, such as a partial download or
  a lock file, refusing a symbolic link, anything but a regular file, and a file with other hard
  links (its bytes would land in someone else's file).
- `locked(path)`: an exclusive flock on a lock file (opened with open_private), waited for at
  most `wait_s`; `update_json(path, change)` reads a JSON record file again under that lock,
  applies `change` and writes it atomically, so concurrent writers (kit pull/fetch on several
  nodes sharing the state directory) never lose each other's entries.

flock on some network file systems (NFS without lockd, some Lustre/GPFS mounts) is a silent
no-op: there, the re-read under the lock still narrows the window to milliseconds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
LOCK_WAIT_S = 30.0


class UnsafeFile(OSError):
    """A path kit will not write through: a link, a device or a file with other hard links."""


def _refuse(path: str | Path, why: str) -> UnsafeFile:
    return UnsafeFile(errno.EPERM, f"{why}; kit does not write through it (was it planted?)", str(path))


def write_atomic(path: str | Path, data: bytes | str, *, mode: int = 0o644, fsync: bool = False) -> None:
    """Replace `path` with `data` in one rename; see the module docstring. `mode` is applied
    exactly (not through the umask), so a secret or a shared record gets the mode asked for.
    Raises OSError (UnsafeFile for a folder that is not one)."""
    target = Path(path)
    blob = data.encode() if isinstance(data, str) else data
    dir_fd = os.open(target.parent if str(target.parent) else ".", os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        name = target.name
        tmp = f".{name[:60]}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(blob)
                handle.flush()
                os.fchmod(handle.fileno(), mode)
                if fsync:
                    os.fsync(handle.fileno())
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


def open_private(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """os.open for one of kit's own files in a shared folder: no symbolic link at `path` (ELOOP
    becomes UnsafeFile), a regular file with no other hard link. Returns the descriptor."""
    try:  # O_NONBLOCK: a FIFO planted there is not waited on (its open would block)
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "is a symbolic link") from None
        if exc.errno == errno.ENXIO:
            raise _refuse(path, "is a FIFO") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, "is not a regular file")
        if st.st_nlink > 1:
            raise _refuse(path, f"has {st.st_nlink} hard links")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def locked(
    path: str | Path, *, wait_s: float = LOCK_WAIT_S, stop: Callable[[float], bool] | None = None
) -> Iterator[int]:
    """Hold an exclusive flock on `path` (created 0o664 when missing) for the block. Waits at most
    `wait_s` (TimeoutError after); `stop(seconds)` waits between tries and may end the wait early
    by returning True (InterruptedError)."""
    fd = open_private(path, os.O_RDWR | os.O_CREAT, 0o664)
    try:
        end = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= end:
                    raise TimeoutError(
                        errno.ETIMEDOUT, f"another process holds the lock for over {wait_s:g} s", str(path)
                    ) from None
                if stop is not None:
                    if stop(0.2):
                        raise InterruptedError(errno.EINTR, "stopped while waiting for the lock", str(path)) from None
                else:
                    time.sleep(0.05)
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def update_json(
    path: str | Path,
    change: Callable[[dict[str, Any]], None],
    *,
    read: Callable[[Path], dict[str, Any]],
    mode: int = 0o644,
    wait_s: float = LOCK_WAIT_S,
) -> None:
    """Read the JSON object at `path` again under its lock (`read`: the caller's bounded loader,
    {} when there is none), apply `change` to it and write it back atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target.with_name(f".{target.name}.lock"), wait_s=wait_s):
        data = read(target)
        change(data)
        write_atomic(target, json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n", mode=mode)


def loose_mode(path: str | Path) -> int | None:
    """The permission bits of a file group or others may read (None when only its owner can,
    or it cannot be looked at)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if st.st_mode & 0o044 else None


def loose_secret_warning(path: str | Path, key: str) -> str | None:
    """The warning for a secret file others can read, naming the file and the fix."""
    mode = loose_mode(path)
    if mode is None:
        return None
    who = "group and others" if mode & 0o004 and mode & 0o040 else "others" if mode & 0o004 else "its group"
    return f"{key} {path} is readable by {who} (mode {mode:03o}): run `chmod 600 {path}`"


def make_dirs(path: str | Path, under: str | Path) -> None:
    """`mkdir -p path`, where every folder below `under` (which the user chose, links and all)
    must be a real folder: a symbolic link planted in place of one (a snapshot folder pointing
    into someone's home) is refused, never entered."""
    target, base = Path(path), Path(under)
    try:
        rest = target.relative_to(base).parts
    except ValueError:
        rest = ()
    current = base
    base.mkdir(parents=True, exist_ok=True)
    for part in rest:
        current = current / part
        try:
            os.mkdir(current)
        except FileExistsError:
            if current.is_symlink() or not current.is_dir():
                raise _refuse(current, "is a symbolic link or not a folder") from None
    if not rest:
        target.mkdir(parents=True, exist_ok=True)
