"""A user's own code named on the command line: "FILE.py:NAME" or "module:NAME" (policies, weightings, ...).

Every failure (no such file, not Python, an import or an exception while the file runs, no such name) is
one ConfigError line naming the flag and the spec: a launcher's user sees `pydtnn: error: ...`, not a
traceback of our import machinery.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys

from pydtnn.errors import ConfigError


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


def load_file(path: str, label: str, errors=(Exception,)):
    """Import a .py file as a fresh module (its folder importable while it runs). An exception of `errors`
    while it runs is one ConfigError line starting with `label` (what names the file: a flag and its value)."""
    full = os.path.abspath(os.fspath(path))
    if not os.path.isfile(full):
        raise ConfigError(f"{label}: {path} does not exist (no such file)")
    module_name = "pydtnn_user_" + hashlib.sha1(full.encode()).hexdigest()[:12]
    loader_spec = importlib.util.spec_from_file_location(module_name, full)
    if loader_spec is None or loader_spec.loader is None:
        raise ConfigError(f"{label}: {path} cannot be imported as Python (is it a .py file?)")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        with importable_folder(os.path.dirname(full)):
            loader_spec.loader.exec_module(module)
    except errors as e:
        sys.modules.pop(module_name, None)
        raise ConfigError(f"{label}: {path} failed to load{_line_of(e)}: {type(e).__name__}: {one_line(e)}") from None
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


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


def one_line(e) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else "(no message)"


def _line_of(e) -> str:
    return f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""


@contextlib.contextmanager
def importable_folder(folder):
    """Put `folder` first on sys.path for the duration (a user's file's `import mylayers` finds its
    neighbour), then take off exactly the entry added: nothing leaks to later imports."""
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):      # the file took it off itself
                sys.path.remove(folder)
