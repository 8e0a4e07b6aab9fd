"""A user's own code named on the command line: "FILE.py:NAME" or "module:NAME" (policies, weightings, ...).

Every failure (no such file, not Python, an import or an exception while the file runs, no such name) is
one ConfigError line naming the flag and the spec: a launcher's user sees `pydtnn: error: ...`, not a
traceback of our import machinery.
"""
from __future__ import annotations

import importlib
import os

from pydtnn.errors import ConfigError
from pydtnn.user_files import import_user_file, one_line


def is_spec(text) -> bool:
    """Whether `text` names a user's object ("FILE.py:NAME" or "module:NAME") rather than a built-in name."""
    return isinstance(text, str) and ":" in text


def load(spec: str, what: str):
    """The object NAME of "FILE.py:NAME" / "module:NAME"; `what` names the flag in errors (e.g. "--balance")."""
    where, sep, name = str(spec).rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ConfigError(f"{what} {spec}: expected FILE.py:NAME or module:NAME")
    label = f"{what} {spec}"
    module = load_file(where, label) if where.endswith(".py") or os.sep in where else _import(where, label)
    if not hasattr(module, name):
        raise ConfigError(f"{what} {spec}: {where} defines no {name}")
    return getattr(module, name)


def load_file(path: str, label: str):
    """Import a .py file (`pydtnn.user_files`), with every failure while it runs one line starting with `label`."""
    try:
        return import_user_file(path, f"{label}: file")
    except ConfigError:
        raise
    except Exception as e:                         # noqa: BLE001  (a bug in the file's code too: one line)
        raise ConfigError(f"{label}: {path} failed to load: {type(e).__name__}: {one_line(e)}") from None


def _import(name, label):
    try:
        return importlib.import_module(name)
    except Exception as e:                         # noqa: BLE001
        raise ConfigError(f"{label}: cannot import {name}: {type(e).__name__}: {one_line(e)}") from None


def construct(spec: str, what: str, base=None):
    """Load a class and construct it with no arguments (checked against `base` when given)."""
    cls = load(spec, what)
    if not isinstance(cls, type) or (base is not None and not issubclass(cls, base)):
        kind = f"a subclass of {base.__module__}.{base.__name__}" if base is not None else "a class"
        raise ConfigError(f"{what} {spec}: expected {kind}, got {type(cls).__name__} {getattr(cls, '__name__', '')}")
    try:
        return cls()
    except Exception as e:                         # noqa: BLE001
        raise ConfigError(f"{what} {spec}: {cls.__name__}() failed: {type(e).__name__}: {one_line(e)}") from None
