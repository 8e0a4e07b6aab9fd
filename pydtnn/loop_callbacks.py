"""Moved to `pydtnn.training.loop_callbacks`; this name stays for one release."""
from pydtnn.training.loop_callbacks import HistoryWriter, ProgressBar  # noqa: F401
