"""pytest plugin of scripts/gpu_check.sh (`-p gpu_check_deadline`): start no test after the time
$GPU_CHECK_DEADLINE (seconds since the epoch), so that pytest ends by itself before the stage's `timeout`
kills it and still writes its JUnit XML (which it writes only at the end)."""
import os
import time

import pytest

DEADLINE = float(os.environ.get("GPU_CHECK_DEADLINE", "inf"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if time.time() < DEADLINE:
        return None
    item.session.shouldstop = f"gpu_check deadline reached: {item.nodeid} and the tests after it were not run"
    return True                 # handled: this test is not run
