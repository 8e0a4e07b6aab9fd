"""Finding and loading libcublas for the backend's own cuBLAS calls (`cublas`): the copy CuPy already loaded
where there is one, so that one process holds one cuBLAS."""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os

from pydtnn.backends.gpu.cudnn.library import _site_dirs
from pydtnn.errors import ConfigError

_CUBLAS_SUBDIRS = ("nvidia/cublas/lib", "nvidia/cu13/lib", "nvidia/cu12/lib")
ENV_VAR = "PYDTNN_CUBLAS_LIB"


def _is_cublas(path: str, major=None) -> bool:
    """libcublas.so[.N...] (of CUDA `major` when given), not libcublasLt."""
    return os.path.basename(path).startswith(f"libcublas.so.{major}" if major else "libcublas.so")


def loaded_libcublas(major=None, maps_path="/proc/self/maps"):
    """Path of the libcublas (of CUDA `major`) this process has mapped already (CuPy's), or None."""
    try:
        with open(maps_path) as f:
            for line in f:
                fields = line.split(maxsplit=5)         # address perms offset dev inode [path]
                path = fields[5].strip() if len(fields) == 6 else ""
                if path.startswith("/") and _is_cublas(path, major) and os.path.isfile(path):
                    return path
    except OSError:             # no /proc (not Linux): the search below
        pass
    return None


def find_libcublas(major=None, env=None, search_paths=None, system=True, maps_path="/proc/self/maps"):
    """Path (or soname) of libcublas.so.`major`, or None. Looks, in order, at $PYDTNN_CUBLAS_LIB, the copy
    already mapped into the process, the LD_LIBRARY_PATH folders, the nvidia-cublas wheels
    (site-packages/nvidia/cublas/lib, .../nvidia/cu1x/lib) and, with `system`, the system's libraries.
    `major`: the CUDA major version (None: any)."""
    env = os.environ if env is None else env
    override = env.get(ENV_VAR)
    if override:
        return override if os.path.isfile(override) else None
    mapped = loaded_libcublas(major, maps_path)
    if mapped is not None:
        return mapped
    names = [f"libcublas.so.{major}"] if major else []
    names.append("libcublas.so")
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    for base in (_site_dirs() if search_paths is None else search_paths):
        dirs += [os.path.join(base, sub) for sub in _CUBLAS_SUBDIRS]
    for d in dirs:
        for name in names:
            path = os.path.join(d, name)
            if os.path.isfile(path):
                return path
        found = sorted(glob.glob(os.path.join(d, f"libcublas.so.{major or ''}*")))
        if found:
            return found[-1]
    if system:
        return ctypes.util.find_library("cublas")
    return None


def _cuda_major():
    """The CUDA runtime's major version (12, 13...) as CuPy reports it; None when CuPy cannot say."""
    try:
        import cupy
        return int(cupy.cuda.runtime.runtimeGetVersion()) // 1000
    except Exception:  # noqa: BLE001 - only narrows the search
        return None


def load_libcublas():
    try:        # CuPy's binding links libcublas: once imported, the process maps the very copy CuPy uses
        import cupy_backends.cuda.libs.cublas  # noqa: F401
    except Exception:  # noqa: BLE001 - a CuPy without it: the search finds one itself
        pass
    major = _cuda_major()
    path = find_libcublas(major)
    if path is None:
        raise ConfigError(f"libcublas.so.{major or 'N'} not found: install cuBLAS (the nvidia-cublas wheel of your "
                          f"CUDA version, or the CUDA toolkit), or set {ENV_VAR} to the library's path")
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise ConfigError(f"cannot load cuBLAS from {path}: {' '.join(str(e).split())}") from None
