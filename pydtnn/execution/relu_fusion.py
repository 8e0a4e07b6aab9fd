"""Fused execution of layers that stay separate in the model: a layer that declares `fuses_next_relu` (a
BatchNormalization or an AdditionBlock where the backend's kernels take relu=: `backend.fuses_relu`, the
CPU's and the GPU's; a Conv2D, its bias and ReLU in one pass, where `backend.fuses_conv_relu`: the GPU's)
directly followed by a Relu runs both as one pass over memory.

The model and its summary keep both layers, with their own names, shapes and (no) parameters. The pair is
a `FusedRelu` that the plan holds and hands to both layers' forward and backward as `relu=` (the layers keep
nothing of it). The producer computes relu(its result) and hands that array on (`FusedRelu.hand_on`); the
Relu's forward then returns it as it is, its backward passes the gradient on unchanged, and the producer's
backward applies the ReLU's mask (`FusedRelu.y`) inside its own passes. A synchronized BatchNormalization
(--sync_batchnorm) fuses too: the mask only changes which gradients enter its sums. An AdditionBlock
computes relu(sum of its paths) in its merge and applies the mask when its backward starts.
"""
from __future__ import annotations

from pydtnn.activations import Relu
from pydtnn.execution.declared import declared, planned_paths


class FusedRelu:
    """`producer` applies the ReLU of `relu`, the Relu right after it, in its own pass; both get this object
    as `relu=` when the plan runs them."""

    def __init__(self, producer, relu):
        self.producer, self.relu = producer, relu
        self.y = None               # the producer's last output, relu'd: the mask of the producer's backward
        self._handed = False        # the producer has returned y and the Relu's forward has not run since
        self._taken = None          # what the Relu's last forward with this pair returned as it is, if anything

    def hand_on(self, y):
        """The producer's forward, which applied the ReLU: its output y goes to the Relu once. Returns y."""
        self.y, self._handed = y, True
        return y

    def take(self, x) -> bool:
        """The Relu's forward, on x: whether x is the producer's output, relu'd already (once per hand_on:
        the Relu run again computes)."""
        self._taken, self._handed = (x if self._handed else None), False
        return self._taken is not None

    @property
    def passed_on(self) -> bool:
        """Whether the Relu's last forward returned the producer's output as it is. Read from the Relu's own
        output (`Relu.y`): a Relu run on its own since then, without this pair, computed instead."""
        return self._taken is not None and self.relu.y is self._taken

    def __repr__(self):
        return f"FusedRelu({self.producer.name} + {self.relu.name})"


def pair_relus(layers) -> list[FusedRelu]:
    """Pair every layer that declares `fuses_next_relu` and is directly followed by a Relu (that class
    exactly: a subclass may compute something else) in `layers`, the planned paths of blocks included.
    Returns the pairs, in the order their producers run."""
    pairs = []
    for layer, nxt in zip(layers, list(layers[1:]) + [None]):
        for path in planned_paths(layer):
            pairs += pair_relus(path)
        if type(nxt) is Relu and declared(layer, "fuses_next_relu"):
            pairs.append(FusedRelu(layer, nxt))
    return pairs
