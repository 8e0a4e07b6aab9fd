"""User-facing errors: one clear line that says what went wrong and where.

A `PyDTNNError` is a user's mistake (a flag, a path, a corrupt file, a shape that does not fit, a NaN
loss). The CLI prints its message on one line and every rank exits with status 2. Anything else is a bug
and keeps its traceback.
"""


class PyDTNNError(Exception):
    """Base class of every error caused by the user's input."""


class ShapeError(PyDTNNError):
    """A layer does not fit its input (the message names the layer)."""


class ConfigError(PyDTNNError):
    """A bad flag, argument or option value."""


class DatasetError(PyDTNNError):
    """A dataset file is missing, truncated or corrupt (the message names the file)."""


class CheckpointError(PyDTNNError):
    """A checkpoint is missing, corrupt, or belongs to another model."""


class NumericalError(PyDTNNError):
    """Training diverged: the loss became NaN or infinite."""


class OutputError(PyDTNNError):
    """An output file or folder cannot be written (the message names it and the cause)."""


# Numbered for `pydtnn.parallel.comm.agree_on_error`: ranks tell each other which kind of error they met.
ERROR_CLASSES = (PyDTNNError, ShapeError, ConfigError, DatasetError, CheckpointError, NumericalError, OutputError)


def error_code(error) -> int:
    """0 for no error, else 1 + the index of its class in ERROR_CLASSES (a subclass counts as its base)."""
    if error is None:
        return 0
    return 1 + max(i for i, cls in enumerate(ERROR_CLASSES) if isinstance(error, cls))
