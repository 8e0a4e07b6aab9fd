"""How a job ends early: a user's mistake is one line and status 2 on every rank (a preempted run, after its
checkpoint, one line and status 3); a bug ends the job.

A mistake is usually seen by every rank at once (a flag, a shared file, a NaN in the reduced loss). Then
all ranks meet at a non-blocking barrier, rank 0 prints the line, and every rank ends with status 2. If a
rank does not arrive within a few seconds the error was its own: it prints, naming itself, and aborts
the job (a banner of mpiexec's may follow; that is the price of not hanging).

How the agreed end is made quiet depends on the MPI:
- MPICH (Hydra): rank 0 alone calls MPI_Abort, with its stderr closed, while the others wait to be
  ended. Separate exits race with Hydra's clean-up (a rank still finalizing is SIGKILLed and Hydra prints
  a banner); an abort ends the job at once with the status, and only the rank itself would have printed
  anything. MPI_Abort may return before mpiexec ends the process (seen under load): the process
  then exits with the status itself, never runs on (it did, into code that failed and aborted with 1).
  Before it, every rank waits (up to a few seconds) until mpiexec has read what it printed: the
  teardown does not wait for a pipe to drain, and under load rank 0's line was sometimes lost.
- Open MPI: stdout and stderr to /dev/null (the line has been read), MPI_Finalize, then exit with the
  status. prterun prints a 13-line MPI_ABORT banner for an abort; for a non-zero exit it still adds its
  own fixed notice ("prterun detected that one or more processes exited with non-zero status"). No
  process can turn it off: only an mpiexec setting does (state_base_error_non_zero_exit=0), and that
  also makes the job's status 0.

Open MPI's launcher, sent SIGTERM or SIGINT (Ctrl-C), ends the job itself: it sends the ranks SIGCONT, then
SIGTERM a quarter of a second later, then SIGKILL a quarter of a second after that (measured with Open MPI
5.0.11; no setting changes it), and from the first signal on it forwards nothing the ranks print. Rank 0,
a child of that launcher, then writes its line straight to the launcher's own stderr (`tell_launcher`).

Before MPI starts (a bad flag), a process of a job of several processes initializes MPI to agree the same
way; if that fails, the job's environment (`pydtnn.parallel.runtime.environment`) says which process is
rank 0.
"""
from __future__ import annotations

import os
import sys
import time
import traceback

from pydtnn.parallel.runtime import environment

USER_ERROR_STATUS = 2
SYNC_SECONDS_VAR = "PYDTNN_ERROR_SYNC_S"      # how long ranks wait for each other to agree on an error


def flush_output():
    """Flush stdout and stderr: an abort or an exit would lose what they still buffer."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - best effort while ending
            pass


def _mpi_world(start: bool):
    """COMM_WORLD of an initialized MPI with more than one process, else None. With ``start``, a
    process of a job of several processes initializes MPI first (a mistake found before it)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None and start and environment.launched_with_many_processes():
        try:
            from mpi4py import MPI as mpi
        except Exception:  # noqa: BLE001 - no usable MPI: fall back to the job's environment
            return None
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized() or mpi.COMM_WORLD.Get_size() == 1:
        return None
    return mpi


def _is_open_mpi(mpi) -> bool:
    return "Open MPI" in mpi.Get_library_version()


def exit_on_user_error(message) -> None:
    """Print ``pydtnn: error: message`` once for the whole job and end every rank with status 2."""
    mpi = _mpi_world(start=True)
    if mpi is not None:
        world = mpi.COMM_WORLD
        request = world.Ibarrier()
        deadline = time.monotonic() + float(os.environ.get(SYNC_SECONDS_VAR, "10"))
        while not request.Test():
            if time.monotonic() > deadline:
                print(f"pydtnn: error (rank {world.Get_rank()}): {message}", file=sys.stderr)
                flush_output()
                abort(world, USER_ERROR_STATUS)
            time.sleep(0.005)
    _end_together(mpi, USER_ERROR_STATUS, f"pydtnn: error: {message}")


def end_job(status: int, line: str, launcher_ending: bool = False) -> None:
    """Every rank calls this together (they agreed in a collective): rank 0 prints ``line`` on stderr
    and every rank ends with ``status``, as quietly as the MPI allows. ``launcher_ending``: the launcher
    itself is ending the job (Open MPI's, signalled): rank 0 also writes the line straight to it."""
    mpi = _mpi_world(start=False)
    if launcher_ending and mpi is not None and mpi.COMM_WORLD.Get_rank() == 0:
        tell_launcher(line)
    _end_together(mpi, status, line)


def launcher_stderr():
    """The path of the stderr of Open MPI's launcher (prterun) when it is this process's parent, else None."""
    if os.environ.get("PRTE_LAUNCHED") != "1":
        return None
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/comm") as f:
            name = f.read().strip()
    except OSError:
        return None
    return f"/proc/{parent}/fd/2" if name in ("prterun", "prte", "mpirun", "mpiexec") else None


def tell_launcher(line: str) -> bool:
    """Write ``line`` straight to Open MPI's launcher's stderr (the terminal or log its user reads), which
    no longer forwards what the ranks print once it ends the job; whether it could."""
    path = launcher_stderr()
    if path is None:
        return False
    try:
        with open(path, "a") as f:        # a log file: at its end, never over what is there
            f.write(line + "\n")
    except OSError:
        return False
    return True


def _unread_bytes(fd: int) -> int:
    """Bytes written to ``fd`` that its reader has not read yet (pipes only; 0 for anything else)."""
    try:
        import fcntl
        import stat
        import struct
        import termios
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return 0
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ImportError, AttributeError):
        return 0


def _wait_until_read(fds=(1, 2), limit_s: float = 3.0) -> None:
    """Wait until mpiexec has read our stdout and stderr pipes (what we printed reaches the user)."""
    deadline = time.monotonic() + limit_s
    while any(_unread_bytes(fd) for fd in fds) and time.monotonic() < deadline:
        time.sleep(0.002)


def _end_together(mpi, status, line):
    if mpi is None:
        if not environment.launched_by_mpi():
            print(line, file=sys.stderr)
            flush_output()
            sys.exit(status)
        if (environment.launcher_rank() or 0) == 0:
            print(line, file=sys.stderr)
        else:
            time.sleep(0.5)          # let rank 0 print before an mpiexec that kills on first exit does
        flush_output()
        os._exit(status)             # not sys.exit: `python -m mpi4py` would turn it into an MPI_Abort
    world = mpi.COMM_WORLD
    if world.Get_rank() == 0:
        print(line, file=sys.stderr)
    flush_output()
    _wait_until_read()
    world.Barrier()                  # rank 0's line is out before any rank ends
    if _is_open_mpi(mpi):
        # The line is out and read; whatever the runtime prints while it tears down goes nowhere (its
        # libevent sometimes warns about a closed descriptor: "[warn] Epoll MOD(1) on fd 20 failed ...
        # Bad file descriptor", seen once in CI, a known Open MPI teardown race, ompi#2004)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        mpi.Finalize()
        os._exit(status)
    if world.Get_rank() != 0:        # rank 0's abort ends this process
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(status)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    abort(world, status)


def abort(world, status: int) -> None:
    """MPI_Abort, and never return: MPICH's may return before mpiexec ends this process."""
    try:
        world.Abort(status)
    finally:
        os._exit(status)


def abort_on_bug() -> None:
    """A bug (any other exception): its traceback, then the whole job ends with status 1; never a hang.
    Returns only outside a multi-process MPI job, where the caller re-raises."""
    mpi = _mpi_world(start=False)
    if mpi is None:
        return
    traceback.print_exc()
    flush_output()
    abort(mpi.COMM_WORLD, 1)
