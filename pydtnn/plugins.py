"""A user's own code named on the command line: a model or dataset file (`--model FILE.py`, `--dataset FILE.py`),
or a plug-in named "FILE.py:NAME" or "module:NAME" (`--balance`, `--gradient_weighting`).

Every file is imported the same way (`import_user_file`): its folder is importable while it runs, so it may import
modules beside it. Whatever the user's code raises (at import, in `create_model` / `create_dataset`, in a
plug-in's constructor or methods: `user_code`) becomes one ConfigError: its first line names the file or the
flag and the exception, and at most `USER_FRAMES` of the user's own frames follow it (file, line, the code), so
a launcher's user sees `pydtnn: error: ...` and where their code failed, never a wall of our import machinery
or of the MPI runtime. The original exception stays chained (`__cause__`) for a Python caller.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import sysconfig
import traceback

from pydtnn.errors import ConfigError, PyDTNNError

USER_FRAMES = 2          # the user's innermost frames shown under the error's line (two lines each)


# --------------------------------------------------------------------------- a user's file, imported

def one_line(e) -> str:
    """The first line of an exception's message."""
    text = str(e).strip().splitlines()
    return text[0] if text else "(no message)"


def _project_folders() -> tuple:
    """This project's code: the package and its models and datasets (links to the repository's folders)."""
    here = os.path.dirname(os.path.realpath(__file__))
    return tuple(f + os.sep for f in (here, os.path.join(os.path.dirname(here), "models"),
                                      os.path.join(os.path.dirname(here), "datasets")))


def _not_users_code() -> tuple:
    """Folders whose frames are never the user's: this project's, the standard library and the installed
    packages."""
    folders = {f.rstrip(os.sep) for f in _project_folders()}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            folders.add(os.path.realpath(sysconfig.get_paths()[key]))
        except KeyError:
            pass
    return tuple(f.rstrip(os.sep) + os.sep for f in folders)


def user_frames(error, limit: int = USER_FRAMES) -> list[str]:
    """The last `limit` frames of `error`'s traceback that run the user's own code, as traceback prints
    them (`  File "...", line N, in f` and the line of code)."""
    skip = _not_users_code()
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith("<") and os.path.isfile(f.filename)
              and not os.path.realpath(f.filename).startswith(skip)]
    if isinstance(error, SyntaxError) and error.filename and error.lineno:       # the line that does not parse
        frames.append(traceback.FrameSummary(error.filename, error.lineno, "<module>", line=error.text or ""))
    lines = []
    for f in frames[-limit:] if limit else []:
        lines.append(f'  File "{f.filename}", line {f.lineno}, in {f.name}')
        if f.line:
            lines.append(f"    {f.line.strip()}")
    return lines


def raised_by_users_code(error) -> bool:
    """Whether `error` was raised by the user's own code: the innermost frame that is neither the standard
    library nor an installed package (numpy called by the user's code counts as the user's) is the user's,
    not this project's. A user's layer, callback or dataset split that raises inside training is then the
    user's mistake, one line and its frames; an exception this project raises is a bug of ours."""
    skip, project = _not_users_code(), _project_folders()
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = os.path.realpath(frame.filename)
        if (frame.filename.startswith("<") or not os.path.isfile(path)          # compiled (mpi4py's Cython)
                or (path.startswith(skip) and not path.startswith(project))):
            continue                    # the standard library or a package: look at who called it
        return not path.startswith(project)
    return False


def user_error(label: str, error) -> ConfigError:
    """The ConfigError for an exception the user's code raised: ``label: Type: message`` on its first line,
    then the user's own frames (`user_frames`)."""
    return ConfigError("\n".join([f"{label}: {type(error).__name__}: {one_line(error)}", *user_frames(error)]))


@contextlib.contextmanager
def user_code(label: str):
    """Run the user's code: an exception it raises becomes `user_error` (one line and the user's frames);
    the project's own errors (a PyDTNNError raised inside, e.g. a layer that does not fit) pass as they are."""
    try:
        yield
    except PyDTNNError:
        raise
    except Exception as e:                         # noqa: BLE001  (the user's code: anything it raises)
        raise user_error(label, e) from e


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
    except Exception as e:                         # noqa: BLE001  (not Python, a missing module, a bug: one error)
        sys.modules.pop(module_name, None)
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
        raise user_error(f"{what} {path} failed to load{where}", e) from e
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
    """Import a .py file (`import_user_file`), every failure while it runs one error starting with `label`."""
    return import_user_file(path, f"{label}: file")


def _import(name, label):
    try:
        return importlib.import_module(name)
    except Exception as e:                         # noqa: BLE001
        raise user_error(f"{label}: cannot import {name}", e) from None


def construct(spec: str, what: str, base=None, kwargs=None):
    """Load a class and construct it with `kwargs` (default none; checked against `base` when given)."""
    cls = load(spec, what)
    if not isinstance(cls, type) or (base is not None and not issubclass(cls, base)):
        kind = f"a subclass of {base.__module__}.{base.__name__}" if base is not None else "a class"
        raise ConfigError(f"{what} {spec}: expected {kind}, got {type(cls).__name__} {getattr(cls, '__name__', '')}")
    kwargs = dict(kwargs or {})
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    with user_code(f"{what} {spec}: {cls.__name__}({args}) failed"):
        return cls(**kwargs)
