"""Moved to `pydtnn.training.loop`; this name stays for one release."""
from pydtnn.training.loop import Preempted, Trainer  # noqa: F401
