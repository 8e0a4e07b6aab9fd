"""The launcher on a disk that is full for some of its outputs (no privileges, no tmpfs needed).

    FULL_DISK=.csv,tensorboard FULL_DISK_AFTER=2 python full_disk.py <launcher flags>

FULL_DISK names what fails with ENOSPC ("No space left on device"), as a comma list of:
- a suffix (.csv, .json, .npz, .png): a file written through `pydtnn.outputs.atomic_write` whose name ends
  with it fails at its fsync (the data has gone to the page cache, as on a real full disk);
- "tensorboard": TensorBoard's event file fills: its writes and flushes fail once FULL_DISK_AFTER flushes went
  through (the loop's writes are synchronous, so a write inside an epoch meets it).
FULL_DISK_AFTER (default 0): how many such writes of each kind succeed first (0: full from the start).
FULL_DISK_ONLY_IN (optional): only writes under this folder fail (the rescue's other folders are fine).
FULL_DISK_ERRNO (default ENOSPC): the error, e.g. EROFS for a file system remounted read-only.
"""
import errno
import os
import sys

from pydtnn import cli, outputs          # noqa: E402

KINDS = [k for k in os.environ.get("FULL_DISK", "").split(",") if k]
AFTER = int(os.environ.get("FULL_DISK_AFTER", "0"))
ONLY_IN = os.environ.get("FULL_DISK_ONLY_IN")
ERRNO = getattr(errno, os.environ.get("FULL_DISK_ERRNO", "ENOSPC"))
done = {k: 0 for k in KINDS}


def _full(kind):
    done[kind] += 1
    return done[kind] > AFTER


real_fsync = os.fsync


def fsync(fd):
    target = os.readlink(f"/proc/self/fd/{fd}")
    name = os.path.basename(target)
    inside = ONLY_IN is None or target.startswith(os.path.abspath(ONLY_IN) + os.sep)
    for kind in KINDS:
        if kind.startswith(".") and name.startswith(outputs.TMP_PREFIX) and name.endswith(kind) and inside:
            if _full(kind):
                raise OSError(ERRNO, os.strerror(ERRNO))
    return real_fsync(fd)


outputs.os.fsync = fsync
class FillingFile:
    """TensorBoard's event file on a disk that fills: once FULL_DISK_AFTER flushes went through, every write
    and flush fails with ENOSPC (with 0, from its first write)."""

    def __init__(self, path):
        self.f = open(path, "wb")
        self.full = AFTER == 0

    def write(self, data):
        if self.full:
            raise OSError(ERRNO, os.strerror(ERRNO))
        return self.f.write(data)

    def flush(self):
        if self.full:
            raise OSError(ERRNO, os.strerror(ERRNO))
        self.f.flush()
        done["tensorboard"] += 1
        self.full = done["tensorboard"] >= AFTER          # the disk is full from here on

    def fileno(self):
        return self.f.fileno()

    def close(self):
        self.f.close()


if "tensorboard" in KINDS:
    from tensorboardX import record_writer
    record_writer.open_file = FillingFile

sys.exit(cli.main(sys.argv[1:]))
