"""Moved to `pydtnn.launch.config` and `pydtnn.launch.agreement`; this name stays for one release."""
from pydtnn.launch.config import *  # noqa: F401,F403
from pydtnn.launch.agreement import *  # noqa: F401,F403
from pydtnn.launch.config import RunConfig, configure  # noqa: F401
