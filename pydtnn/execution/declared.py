"""What a layer declares to the passes (the hooks in `pydtnn.layers.base.Layer`), read by its own class."""
from __future__ import annotations


def declared(layer, hook: str) -> bool:
    """Whether `layer`'s own class defines the declaration `hook` and it answers yes for this layer. A
    subclass does not inherit a declaration: it may compute something else, and declares again if it can."""
    own = vars(type(layer)).get(hook)
    return own is not None and bool(own(layer))


def planned_paths(layer) -> list:
    """The paths of `layer` the passes pair layers in: a block's, where it declares `runs_paths_with_plan` (its
    forward and backward take `plan=` and call its paths' layers through it); none otherwise, whose layers
    then only ever run alone."""
    return layer.paths if declared(layer, "runs_paths_with_plan") else []
