"""GPU plumbing shared by the GPU backend and the NCCL communicator.

- `import_cupy()`: CuPy and the number of visible devices, or ONE clear `ConfigError` line when CuPy is
  missing, has no driver or sees no device.
- `local_rank(env)` / `choose_device(env, count, device)`: which device this process uses. Pure functions
  of the environment and the device count (tested on machines without a GPU): the launcher's local rank
  modulo the number of visible devices, so the ranks of one node spread over its GPUs.
- `use_device(device)`: choose and make current, BEFORE anything is allocated (a CuPy array, a cuDNN
  handle or an NCCL communicator belongs to the device current when it is created).
"""
from __future__ import annotations

import os

from pydtnn.errors import ConfigError

GPU_HINT = "the GPU backend needs CuPy and an NVIDIA GPU: pip install '.[gpu]'"

# Local rank as exported by Open MPI, MPICH/Hydra, PMI/PMIx launchers, MVAPICH and Slurm, in this order.
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "PMIX_LOCAL_RANK",
                   "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")


def _one_line(text) -> str:
    return " ".join(str(text).split())


def local_rank(env=None) -> int:
    """This process's rank among the processes of its node (0 when no launcher says)."""
    env = os.environ if env is None else env
    for var in LOCAL_RANK_VARS:
        value = env.get(var)
        if value is None:
            continue
        try:
            rank = int(str(value).strip())
        except ValueError:
            continue
        if rank >= 0:
            return rank
    return 0


def choose_device(env, device_count: int, device=None) -> int:
    """The device index to use: `device` when given (checked), else the local rank modulo `device_count`."""
    if device_count < 1:
        raise ConfigError(f"{GPU_HINT} (no CUDA device is visible)")
    if device is not None:
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < device_count:
            raise ConfigError(f"GPU device must be an int in 0..{device_count - 1}, got {device!r}")
        return device
    return local_rank(env) % device_count


def import_cupy():
    """(cupy, number of visible devices); ConfigError (one line) when the GPU stack is unusable."""
    try:
        import cupy
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:  # ImportError, or CUDARuntimeError without a driver / device
        raise ConfigError(f"{GPU_HINT} ({_one_line(f'{type(e).__name__}: {e}')})") from None
    if count < 1:
        raise ConfigError(f"{GPU_HINT} (no CUDA device is visible)")
    return cupy, count


def use_device(device=None, env=None):
    """Choose this process's device (see `choose_device`) and make it current; returns (cupy, index)."""
    cupy, count = import_cupy()
    index = choose_device(os.environ if env is None else env, count, device)
    cupy.cuda.Device(index).use()
    return cupy, index
