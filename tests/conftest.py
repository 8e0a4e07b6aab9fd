import os
import sys

# Tests see the repository's package even without an install (the README installs it editable anyway).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from pydtnn.backends import available_backends  # noqa: E402


@pytest.fixture(params=available_backends())
def backend_name(request):
    """Conformance tests run on every backend this machine has ("gpu" only where CuPy sees a device)."""
    return request.param
