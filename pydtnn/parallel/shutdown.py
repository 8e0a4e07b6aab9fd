"""How a job ends early: a user's mistake is one line and status 2 on every rank (a preempted run, after its
checkpoint, one line and status 3); a bug ends the job.

A mistake is usually seen by every rank at once (a flag, a shared file, a NaN in the reduced loss). Then
all ranks meet at a non-blocking barrier, rank 0 prints the line, and every rank ends with status 2. If a
rank does not arrive within a few seconds the error was its own: it prints, naming itself, and aborts
the job (a launcher banner may follow; that is the price of not hanging).

How the agreed end is made quiet depends on the MPI:
- MPICH (Hydra): MPI_Abort with the rank's stderr closed. Separate exits race with Hydra's clean-up
  (a rank still finalizing is SIGKILLed and Hydra prints a banner); an abort ends the job at once with
  the status, and only the rank itself would have printed anything.
- Open MPI: MPI_Finalize, then exit with the status. prterun prints a 13-line MPI_ABORT banner for an
  abort; for a non-zero exit it still adds its own fixed notice ("prterun detected that one or more
  processes exited with non-zero status"). No process can turn it off: only a launcher setting does
  (state_base_error_non_zero_exit=0), and that also makes the job's status 0.

Before MPI starts (a bad flag), a process under a launcher of several processes initializes MPI to
agree the same way; if that fails, the launcher's environment says which process is rank 0.
"""
from __future__ import annotations

import os
import sys
import time
import traceback

from pydtnn.parallel import launcher

USER_ERROR_STATUS = 2
SYNC_SECONDS_VAR = "PYDTNN_ERROR_SYNC_S"      # how long ranks wait for each other to agree on an error


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - best effort while ending
            pass


def _mpi_world(start: bool):
    """COMM_WORLD of an initialized MPI with more than one process, else None. With ``start``, a
    process under a launcher of several processes initializes MPI first (a mistake found before it)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None and start and launcher.launched_with_many_processes():
        try:
            from mpi4py import MPI as mpi
        except Exception:  # noqa: BLE001 - no usable MPI: fall back to the launcher's environment
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
                _flush()
                world.Abort(USER_ERROR_STATUS)
            time.sleep(0.005)
    _end_together(mpi, USER_ERROR_STATUS, f"pydtnn: error: {message}")


def end_job(status: int, line: str) -> None:
    """Every rank calls this together (they agreed in a collective): rank 0 prints ``line`` on stderr
    and every rank ends with ``status``, as quietly as the MPI allows."""
    _end_together(_mpi_world(start=False), status, line)


def _end_together(mpi, status, line):
    if mpi is None:
        if not launcher.launched_by_mpi():
            print(line, file=sys.stderr)
            _flush()
            sys.exit(status)
        if (launcher.launcher_rank() or 0) == 0:
            print(line, file=sys.stderr)
        else:
            time.sleep(0.5)          # let rank 0 print before a launcher that kills on first exit does
        _flush()
        os._exit(status)             # not sys.exit: `python -m mpi4py` would turn it into an MPI_Abort
    world = mpi.COMM_WORLD
    if world.Get_rank() == 0:
        print(line, file=sys.stderr)
    _flush()
    world.Barrier()                  # rank 0's line is out before any rank ends
    if _is_open_mpi(mpi):
        mpi.Finalize()
        os._exit(status)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    world.Abort(status)


def abort_on_bug() -> None:
    """A bug (any other exception): its traceback, then the whole job ends; never a hang. Returns only
    outside a multi-process MPI job, where the caller re-raises."""
    mpi = _mpi_world(start=False)
    if mpi is None:
        return
    traceback.print_exc()
    _flush()
    mpi.COMM_WORLD.Abort(1)
