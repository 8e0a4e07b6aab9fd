"""pytest plugin of scripts/gpu_check.sh (`-p gpu_check_deadline`): start no test after the time
$GPU_CHECK_DEADLINE (seconds since the epoch), so that pytest ends by itself before the stage's `timeout`
stops it, and still writes its JUnit XML (which it writes only at the end). The stage then reports
"stopped at its limit" (the message below tells it), not a failure."""
import os
import time

import pytest

DEADLINE = float(os.environ.get("GPU_CHECK_DEADLINE", "inf"))
REACHED = "gpu_check deadline reached"          # scripts/gpu_check.sh looks for these words


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if time.time() < DEADLINE:
        return None
    run = item
    while run.parent is not None:               # the root of the collection tree is the whole run
        run = run.parent
    run.shouldstop = f"{REACHED}: {item.nodeid} and the tests after it were not run"
    return True                                 # handled: this test is not run
