"""What a layer declares to the passes (the hooks in `pydtnn.layers.base.Layer`), read by its own class."""
from __future__ import annotations


def declared(layer, hook: str) -> bool:
    """Whether `layer`'s own class defines the declaration `hook` and it answers yes for this layer. A
    subclass does not inherit a declaration: it may compute something else, and declares again if it can."""
    own = vars(type(layer)).get(hook)
    return own is not None and bool(own(layer))
