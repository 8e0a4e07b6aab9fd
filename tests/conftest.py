import os
import sys

# Tests see the repository's package even without an install (the README installs it editable anyway).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))      # tests/gpu_standin, tests/mpi_helpers

import pytest  # noqa: E402

from pydtnn.backends import available_backends  # noqa: E402


@pytest.fixture(params=available_backends() + ["gpu-standin"])
def backend_name(request):
    """Conformance tests run on every backend this machine has ("gpu" only where CuPy sees a device), and
    on "gpu-standin": the real GPU backend over the host stand-in of CuPy/cuDNN (tests/gpu_standin), a
    test of our GPU glue that runs anywhere, NOT a GPU verification. For it the fixture gives a float64
    GPUBackend object (Model accepts a backend object as well as a name)."""
    if request.param != "gpu-standin":
        yield request.param
        return
    import gpu_standin
    with gpu_standin.active():
        from pydtnn.backends.gpu import GPUBackend
        yield GPUBackend(dtype="float64", seed=0)
