"""PyDTNN: heterogeneity-aware data-parallel training of deep neural networks."""
__version__ = "0.1.0"

from pydtnn.errors import PyDTNNError  # noqa: E402


def __getattr__(name):
    # Lazy so that `import pydtnn.errors` stays cheap (the CLI imports errors before numpy work).
    if name == "Model":
        from pydtnn.model import Model
        return Model
    raise AttributeError(name)


__all__ = ["Model", "PyDTNNError", "__version__"]
