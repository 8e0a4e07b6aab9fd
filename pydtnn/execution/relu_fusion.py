"""Fused execution of layers that stay separate in the model: a BatchNormalization, or an AdditionBlock,
directly followed by a Relu runs as one pass over memory where the backend offers it (`backend.fuses_relu`,
the CPU's).

The model and its summary keep both layers, with their own names, shapes and (no) parameters. In
execution the BatchNormalization computes relu(bn(x)) and hands that array to its Relu, whose forward then
returns it as it is; the Relu's backward passes the gradient on unchanged and the BatchNormalization's
backward applies the ReLU's mask inside its own two passes. A synchronized BatchNormalization
(--sync_batchnorm) fuses too: the mask only changes which gradients enter its sums. An AdditionBlock
computes relu(sum of its paths) in its merge and applies the mask when its backward starts.
"""
from __future__ import annotations


def link_relus(layers) -> int:
    """Pair every BatchNormalization or AdditionBlock directly followed by a Relu in `layers`, blocks' paths
    included (their own classes exactly: a subclass may compute something else). Returns the number of pairs."""
    from pydtnn.activations import Relu
    from pydtnn.layers.batchnorm import BatchNormalization
    from pydtnn.layers.blocks import AdditionBlock
    pairs = 0
    for layer, nxt in zip(layers, list(layers[1:]) + [None]):
        if type(layer) in (BatchNormalization, AdditionBlock):
            fuse = type(nxt) is Relu and getattr(layer.backend, "fuses_relu", False)
            layer.fused_relu = nxt if fuse else None
            pairs += fuse
        for path in getattr(layer, "paths", []):
            pairs += link_relus(path)
    return pairs
