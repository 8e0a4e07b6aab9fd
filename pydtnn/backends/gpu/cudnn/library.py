"""Finding and loading libcudnn.so.9 for the legacy C API (the cuDNN frontend loads its own copy the same way)."""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import site
import sys
import sysconfig

from pydtnn.errors import ConfigError

_CUDNN_SUBDIRS = ("nvidia/cudnn/lib", "nvidia/cu13/lib", "nvidia/cu12/lib")


def _site_dirs():
    dirs = list(sys.path)
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:   # some virtualenvs' site module
        pass
    dirs.append(sysconfig.get_path("purelib"))
    seen, out = set(), []
    for d in dirs:
        if d and d not in seen:
            seen.add(d)
            out.append(d)
    return out


def find_libcudnn(env=None, search_paths=None, system=True):
    """Path of libcudnn.so.9, or None. Looks, in order, at $PYDTNN_CUDNN_LIB, the LD_LIBRARY_PATH folders,
    the nvidia-cudnn-cu12/cu13 wheels (site-packages/nvidia/cudnn/lib, .../nvidia/cu1x/lib) and, with
    `system`, the system's libraries (ldconfig). The same order as the cuDNN frontend's own loader, so
    both end up with the same library in one process."""
    env = os.environ if env is None else env
    override = env.get("PYDTNN_CUDNN_LIB")
    if override:
        return override if os.path.isfile(override) else None
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    for base in (_site_dirs() if search_paths is None else search_paths):
        dirs += [os.path.join(base, sub) for sub in _CUDNN_SUBDIRS]
    for d in dirs:
        for name in ("libcudnn.so.9", "libcudnn.so"):
            path = os.path.join(d, name)
            if os.path.isfile(path):
                return path
        found = sorted(glob.glob(os.path.join(d, "libcudnn.so.9.*")))
        if found:
            return found[-1]
    if system:
        return ctypes.util.find_library("cudnn")     # a soname ("libcudnn.so.9") that dlopen resolves
    return None


def load_libcudnn():
    path = find_libcudnn()
    if path is None:
        raise ConfigError("libcudnn.so.9 not found: pip install nvidia-cudnn-cu13 (or -cu12), "
                          "or set PYDTNN_CUDNN_LIB to the library's path")
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise ConfigError(f"cannot load cuDNN from {path}: {' '.join(str(e).split())}") from None
