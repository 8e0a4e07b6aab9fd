"""The CPU backend: NumPy arrays, NHWC inside, BLAS + numba kernels (see `backend`)."""
from pydtnn.backends.cpu.backend import CPUBackend  # noqa: F401
from pydtnn.backends.cpu.parts import default_threads  # noqa: F401
