"""The GPU backend: CuPy arrays, NCHW, cuDNN convolutions (see `backend`)."""
from pydtnn.backends.gpu.backend import GPUBackend  # noqa: F401
