"""Downloads into the cache: resumable, checksummed, atomic.

:func:`fetch` downloads ``url`` into ``dest_path + ".part"``, resuming an existing ``.part`` with an HTTP
``Range`` request (if the server answers 200 instead of 206, it starts over), shows a tqdm progress bar,
verifies the checksum, fsyncs and atomically renames the file into place: ``dest_path`` exists only when
complete and verified. A dropped connection is retried (resuming) ``retries`` times.

:func:`download_dataset` fetches the files of ``mnist`` or ``cifar10`` that are missing from the cache
(``$PYDTNN_CACHE``, else ``~/.cache/pydtnn``) and returns the folder to load. In an MPI job call it on one
rank, then barrier: two processes must not write the same ``.part`` file.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import shutil
import tarfile
import urllib.error
import urllib.request

from pydtnn.errors import ConfigError, DatasetError

CHUNK = 1 << 20

# Checksums of the files as their publishers distribute them (byte-identical on the mirrors listed).
# MNIST: SHA-256 of the four .gz files (their MD5s, as torchvision lists them, are f68b3c2d..., d53e105e...,
# 9fb629c4..., ec29112d...). After download the loader also checks IDX magic numbers and sizes.
MNIST_MIRRORS = [
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
]
MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
# CIFAR-10 binary archive, 170,052,171 bytes (MD5 c32a1d4ab5d03f1284b67883e8d87530, as published on
# https://www.cs.toronto.edu/~kriz/cifar.html).
CIFAR10_URLS = ["https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"]
CIFAR10_ARCHIVE = "cifar-10-binary.tar.gz"
CIFAR10_SHA256 = "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"


def default_cache_dir() -> str:
    """``$PYDTNN_CACHE`` if set, else ``~/.cache/pydtnn``."""
    return os.environ.get("PYDTNN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "pydtnn")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class _Dropped(Exception):
    """The connection ended before the announced length."""


class _RangeDone(_Dropped):
    """The server refused the resume range (416): the part file is complete, or stale."""


def _attempt(url: str, part: str, progress: bool, timeout: float) -> None:
    """One request: append to ``part`` from where it stops (Range), or start it over."""
    have = os.path.getsize(part) if os.path.exists(part) else 0
    headers = {"User-Agent": "pydtnn-downloader"}
    if have:
        headers["Range"] = f"bytes={have}-"
    req = urllib.request.Request(url, headers=headers)
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()                    # an HTTPError holds the open response
        if e.code == 416 and have:   # nothing left to send: the part may be complete, or stale
            raise _RangeDone("range not satisfiable") from None
        raise DatasetError(f"{url}: HTTP error {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        raise DatasetError(f"{url}: cannot download ({reason})") from None
    with resp:
        status = resp.status
        length = resp.headers.get("Content-Length")
        length = int(length) if length and length.isdigit() else None
        if have and status == 206:
            m = re.match(r"bytes (\d+)-\d+/(\d+|\*)", resp.headers.get("Content-Range", ""))
            if not m or int(m.group(1)) != have:
                raise DatasetError(f"{url}: server answered the range request with a wrong Content-Range "
                                   f"{resp.headers.get('Content-Range')!r}")
            mode = "ab"
        elif status == 200:
            have, mode = 0, "wb"     # no Range support (or no part file): start over
        else:
            raise DatasetError(f"{url}: unexpected HTTP status {status}")
        total = have + length if length is not None else None
        got = 0
        from pydtnn.observe.progress import progress as progress_bar
        bar = progress_bar(total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024,
                           desc=os.path.basename(part[:-5]), enabled=progress, leave=False)
        with open(part, mode) as f:
            try:
                while True:
                    block = resp.read(CHUNK)
                    if not block:
                        break
                    f.write(block)
                    got += len(block)
                    if bar is not None:
                        bar.update(len(block))
            except (http.client.IncompleteRead, OSError, http.client.HTTPException) as e:
                f.flush()
                raise _Dropped(f"connection lost after {have + got} bytes ({type(e).__name__})") from None
            finally:
                if bar is not None:
                    bar.close()
            f.flush()
            os.fsync(f.fileno())
        if length is not None and got != length:
            raise _Dropped(f"connection lost after {have + got} of {total} bytes")


def fetch(url: str, dest_path: str, sha256: str | None = None, progress: bool = True, *,
          retries: int = 3, timeout: float = 60.0) -> str:
    """Download ``url`` to ``dest_path`` (resumable, verified, atomic); returns ``dest_path``.

    ``sha256``: expected hex digest; on mismatch the part file is removed and DatasetError raised.
    ``retries``: how many times a dropped connection is resumed before giving up (the ``.part`` file
    is then kept, and a later call resumes it).
    """
    dest_path = os.fspath(dest_path)
    folder = os.path.dirname(os.path.abspath(dest_path))
    os.makedirs(folder, exist_ok=True)
    part = dest_path + ".part"
    failures = 0
    while True:
        try:
            _attempt(url, part, progress, timeout)
            break
        except _Dropped as e:
            if isinstance(e, _RangeDone):
                # A complete part file from an earlier run, or a stale one: verify it, else restart.
                if sha256 is not None and _sha256(part) == sha256.lower():
                    break
                _remove(part)
            failures += 1
            if failures > retries:
                raise DatasetError(f"{url}: download incomplete, {e}; partial data kept in {part}") from None
    if sha256 is not None:
        got = _sha256(part)
        if got != sha256.lower():
            _remove(part)
            raise DatasetError(f"{dest_path}: checksum mismatch (sha256 {got}, expected {sha256.lower()}) "
                               f"from {url}; the download was removed")
    with open(part, "rb") as f:
        os.fsync(f.fileno())
    os.replace(part, dest_path)
    _fsync_dir(folder)
    return dest_path


def _fetch_mirrors(urls: list[str], dest: str, sha256: str | None, progress: bool) -> None:
    errors = []
    for url in urls:
        try:
            fetch(url, dest, sha256, progress)
            return
        except DatasetError as e:
            errors.append(str(e))
    raise DatasetError(f"{dest}: every mirror failed: " + " | ".join(errors))


def _extract_cifar(archive: str, folder: str) -> None:
    """Extract only the six expected regular members (no other path is ever written)."""
    from . import cifar10
    wanted = {f"{cifar10.ARCHIVE_FOLDER}/{name}": name for name in cifar10.TRAIN_FILES + cifar10.TEST_FILES}
    out = os.path.join(folder, cifar10.ARCHIVE_FOLDER)
    os.makedirs(out, exist_ok=True)
    found = set()
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = wanted.get(member.name.lstrip("./"))
                if name is None or not member.isfile():
                    continue
                src = tar.extractfile(member)
                tmp = os.path.join(out, name + ".part")
                with src, open(tmp, "wb") as f:
                    shutil.copyfileobj(src, f, CHUNK)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, os.path.join(out, name))
                found.add(name)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DatasetError(f"{archive}: corrupt archive ({e})") from None
    missing = sorted(set(wanted.values()) - found)
    if missing:
        raise DatasetError(f"{archive}: archive lacks {', '.join(missing)}")
    _fsync_dir(out)


DOWNLOADABLE = ("mnist", "cifar10")


def ways_to_get(name: str, path_given: bool) -> str:
    """The ways out of a built-in dataset's missing files, to end that message: its folder (the flag and
    load_dataset's argument), the download (mnist, cifar10) and the launcher's synthetic data of its shape."""
    if path_given:
        ways = ["correct --dataset_train_path (train_path=)"]
        fetch_it = "or leave it out and fetch the files into the cache with --download true (download=True)"
    else:
        ways = ["give the folder of its files with --dataset_train_path DIR (train_path=DIR)"]
        fetch_it = "fetch them into the cache with --download true (download=True)"
    if name in DOWNLOADABLE:
        ways.append(fetch_it)
    ways.append(f"or train on synthetic data shaped like {name} with --use_synthetic_data true")
    return ", ".join(ways)


def download_dataset(name: str, cache_dir: str | None = None, progress: bool = True) -> str:
    """Fetch the missing files of ``mnist`` or ``cifar10`` into ``<cache>/<name>``; returns that folder."""
    from . import cifar10
    root = os.path.join(cache_dir or default_cache_dir(), name)
    os.makedirs(root, exist_ok=True)
    if name == "mnist":
        for fname, digest in MNIST_SHA256.items():
            stem = fname[:-3]
            if os.path.isfile(os.path.join(root, fname)) or os.path.isfile(os.path.join(root, stem)):
                continue
            _fetch_mirrors([m + fname for m in MNIST_MIRRORS], os.path.join(root, fname), digest, progress)
        return root
    if name == "cifar10":
        if cifar10.has_files(root, "train") and cifar10.has_files(root, "test"):
            return root
        archive = os.path.join(root, CIFAR10_ARCHIVE)
        if not os.path.isfile(archive):
            _fetch_mirrors(list(CIFAR10_URLS), archive, CIFAR10_SHA256, progress)
        _extract_cifar(archive, root)
        return root
    raise ConfigError(f"dataset {name!r} cannot be downloaded (only {' and '.join(DOWNLOADABLE)} can)")
