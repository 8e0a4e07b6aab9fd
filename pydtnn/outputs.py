"""Output files: checked before the first step, written atomically with the umask's permissions.

Every writer (history, trace, weights, checkpoints) goes through `atomic_write`: a temporary file
`.tmp-pydtnn-<host>.<pid>.<random>` in the target's folder, fsynced, then renamed over the target, so a
crash mid-write leaves the previous file intact. An OSError (full disk, read-only folder, a directory in
the way) becomes one `OutputError` naming the file and the cause, and the temporary file is removed. A
temporary file left by a writer that was killed (same host, process gone) is removed at the next write
into that folder.
"""
from __future__ import annotations

import os
import socket
import tempfile

from pydtnn.errors import OutputError

TMP_PREFIX = ".tmp-pydtnn-"
_HOST = socket.gethostname().replace(".", "_")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _describe(e: OSError) -> str:
    return e.strerror or str(e)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_tmp(folder: str) -> list[str]:
    """Remove temporary files that a killed writer on this host left in `folder`; returns their names."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(TMP_PREFIX):
            continue
        host, _, rest = name[len(TMP_PREFIX):].partition(".")
        pid = rest.split(".", 1)[0]
        if host != _HOST or not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue                  # another host's writer may still be running: not ours to judge
        try:
            os.unlink(os.path.join(folder, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def atomic_write(path: str, write, binary: bool = True) -> None:
    """Call `write(file)` on a temporary file beside `path`, then rename it over `path`.

    The file gets the permissions a plain open() would give (0666 minus the umask), not mkstemp's 0600.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        if os.path.isdir(path):
            raise IsADirectoryError(21, "Is a directory", path)
        clean_stale_tmp(folder)
        fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{_HOST}.{os.getpid()}.",
                                   suffix=os.path.splitext(path)[1], dir=folder)
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"newline": ""})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        dir_fd = os.open(folder, os.O_RDONLY)       # make the rename itself durable
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {_describe(e)}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def unused_path(path: str) -> str:
    """`path`, or the first of `name-1.ext`, `name-2.ext`, ... that does not exist (a rescue replaces nothing)."""
    stem, ext = os.path.splitext(path)
    n = 0
    while os.path.lexists(path):
        n += 1
        path = f"{stem}-{n}{ext}"
    return path


def rescue_folders(first) -> list[str]:
    """Where a rescue (the training's state when an output failed) may go: `first`, then a folder of this
    process in the system's temporary folder (often another file system than a full one)."""
    fallback = os.path.join(tempfile.gettempdir(), f"pydtnn-rescue-{_HOST}-{os.getpid()}")
    return [str(first), fallback] if first is not None else [fallback]


def _probe_folder(folder: str, what: str) -> None:
    """Create and remove a file in `folder`: the only test that read-only mounts and ACLs cannot fool."""
    try:
        fd, probe = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{_HOST}.{os.getpid()}.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputError(f"{what}: cannot write into {folder}: {_describe(e)}") from None


def check_output_file(path, flag: str) -> None:
    """`path` can be written: not empty, not a directory, in an existing writable folder."""
    if path is None:
        return
    path = os.fspath(path)
    if not path.strip():
        raise OutputError(f"{flag}: empty file name")
    if os.path.isdir(path):
        raise OutputError(f"{flag} {path} is a directory")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(folder):
        raise OutputError(f"{flag} {path}: folder {folder} does not exist")
    if not os.path.isdir(folder):
        raise OutputError(f"{flag} {path}: {folder} is not a folder")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise OutputError(f"{flag} {path}: the file is not writable")
    _probe_folder(folder, f"{flag} {path}")


def check_output_dir(path, flag: str, create: bool) -> None:
    """`path` is (or can become) a writable folder; created now when `create`, else left untouched."""
    path = os.fspath(path)
    if not path.strip():
        raise OutputError(f"{flag}: empty folder name")
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{flag} {path} is not a folder")
    if create:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise OutputError(f"{flag}: cannot create {path}: {_describe(e)}") from None
    existing = os.path.abspath(path)
    while not os.path.exists(existing):          # the folder that mkdir would have to write into
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise OutputError(f"{flag} {path}: {existing} is not a folder")
    _probe_folder(existing, f"{flag} {path}")
