"""Moved to `pydtnn.plugins`; this name stays for one release."""
from pydtnn.plugins import import_user_file, importable_folder, one_line, user_function  # noqa: F401
