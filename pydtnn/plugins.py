"""A user's own code named on the command line: a model or dataset file (`--model FILE.py`, `--dataset FILE.py`),
or a plug-in named "FILE.py:NAME" or "module:NAME" (`--balance`, `--gradient_weighting`).

Every file is imported the same way (`import_user_file`): its folder is importable while it runs, so it may import
modules beside it. A file that is not Python or imports a missing module is one ConfigError line naming the file;
a bug in a model or dataset file's own code keeps its traceback. A plug-in's every failure (no such file, not
Python, an import or an exception while the file runs, no such name) is one ConfigError line naming the flag and
the spec: a launcher's user sees `pydtnn: error: ...`, not a traceback of our import machinery.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys

from pydtnn.errors import ConfigError, PyDTNNError


# --------------------------------------------------------------------------- a user's file, imported

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


# ------------------------------------------------------------------------------ plug-ins: FILE.py:NAME


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
    """Import a .py file (`import_user_file`), with every failure while it runs one line starting with `label`."""
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


def construct(spec: str, what: str, base=None, kwargs=None):
    """Load a class and construct it with `kwargs` (default none; checked against `base` when given)."""
    cls = load(spec, what)
    if not isinstance(cls, type) or (base is not None and not issubclass(cls, base)):
        kind = f"a subclass of {base.__module__}.{base.__name__}" if base is not None else "a class"
        raise ConfigError(f"{what} {spec}: expected {kind}, got {type(cls).__name__} {getattr(cls, '__name__', '')}")
    kwargs = dict(kwargs or {})
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    try:
        return cls(**kwargs)
    except Exception as e:                         # noqa: BLE001
        raise ConfigError(f"{what} {spec}: {cls.__name__}({args}) failed: {type(e).__name__}: {one_line(e)}") from None


# ------------------------------------------------------------------------- a user's code, failing

def user_frames(error: BaseException, limit: int = 2) -> list[str]:
    """The innermost `limit` frames of `error`'s traceback that are the user's own code (not pydtnn's, not
    Python's or an installed package's), as traceback prints them: what helps a user find the bug."""
    import traceback
    package = os.path.dirname(os.path.abspath(__file__))
    libraries = {os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    lines = []
    for frame in traceback.extract_tb(error.__traceback__):
        path = os.path.abspath(frame.filename)
        if path.startswith(package + os.sep) or any(path.startswith(p + os.sep) for p in libraries) \
                or frame.filename.startswith("<"):
            continue
        lines.append([f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}'] +
                     ([f"    {frame.line.strip()}"] if frame.line else []))
    return [line for frame in lines[-limit:] for line in frame]


def failure(label: str, error: BaseException) -> str:
    """``label: Type: first line of the message``, then the user's own frames (`user_frames`): the text of
    the ConfigError that a user's code raising becomes."""
    return "\n".join([f"{label}: {type(error).__name__}: {one_line(error)}", *user_frames(error)])
