"""The CPU backend: NumPy arrays, NHWC inside, BLAS + numba kernels (see `backend`)."""
from pydtnn.backends.cpu.backend import CPUBackend, default_threads  # noqa: F401
