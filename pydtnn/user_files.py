"""Import a user's Python file (a model, a dataset, a plug-in) the same way everywhere.

The file's folder is importable while the file runs, so it may import modules beside it. A file that is
not Python or imports a missing module is a one-line ConfigError naming the file; a bug in the file's own
code keeps its traceback.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys

from pydtnn.errors import ConfigError, PyDTNNError


def one_line(e) -> str:
    """The first line of an exception's message."""
    text = str(e).strip().splitlines()
    return text[0] if text else "(no message)"


@contextlib.contextmanager
def importable_folder(folder):
    """Put `folder` first on sys.path for the duration, then take off exactly the entry added: nothing
    leaks to later imports."""
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added:
            try:
                sys.path.remove(folder)
            except ValueError:       # the file took it off itself
                pass


def import_user_file(path, what: str):
    """Import the .py file at `path` as a fresh module; `what` names it in errors ("model file")."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise ConfigError(f"{what} {path} does not exist")
    module_name = f"pydtnn_user_{what.split()[0]}_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{what} {path} cannot be imported as Python (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        with importable_folder(os.path.dirname(path)):
            spec.loader.exec_module(module)
    except (SyntaxError, ImportError, PyDTNNError) as e:     # not Python, a missing module: one line
        sys.modules.pop(module_name, None)
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
        raise ConfigError(f"{what} {path} failed to load{where}: {type(e).__name__}: {one_line(e)}") from e
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def user_function(path, name: str, what: str, signature: str):
    """The callable `name` that the user's file at `path` must define (ConfigError when it does not)."""
    function = getattr(import_user_file(path, what), name, None)
    if not callable(function):
        raise ConfigError(f"{what} {os.path.abspath(os.fspath(path))} does not define {signature}")
    return function
