"""The launcher's parts below `pydtnn.cli`: flags, the run configuration, its checks."""
