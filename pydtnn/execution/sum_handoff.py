"""An AdditionBlock's last sum handed to the block before it: in a ResNet, block k + 1's backward ends with
dx = dx_shortcut + dx_main, and block k's backward begins with its fused ReLU's mask, (dx) * (y_k > 0); the
two run as one pass, relu_backward(dx_main, y_k, addend=dx_shortcut), which skips writing the sum and reading
it back (a full activation tensor each way, per block) and one kernel and one array per block.

Paired for top-level layers [B_k, Relu, B_k+1] where B_k is an AdditionBlock whose ReLU is fused
(`relu_fusion`) and B_k+1 an AdditionBlock: `giver` B_k+1 and `taker` B_k share a SumHandoff, which the plan
hands to their backward as `sum_out=` and `sum_in=`. It acts only inside `Model.backward`, which runs the
three in that order with what the plan paired them with, and only when the Relu passed B_k's output on (its
backward then passes the gradient on unchanged); a block's backward called on its own gets no handoff and
sums as before. IEEE addition is commutative, so the gradient is the same, bit for bit.
"""
from __future__ import annotations

import contextlib

from pydtnn.execution.declared import declared


class SumHandoff:
    def __init__(self, taker, giver, fused):
        self.taker, self.giver = taker, giver
        self.fused = fused          # the taker's FusedRelu, whose mask's pass adds the part
        self._part = None

    def can_give(self) -> bool:
        """Whether the giver may leave its last sum to the taker now."""
        return self.fused.passed_on

    def give(self, part):
        """The giver's other part of its input gradient (the taker adds it in its mask's pass)."""
        self._part = part

    def take(self):
        """The part the giver left (None if it summed itself), once."""
        part, self._part = self._part, None
        return part

    def __repr__(self):
        return f"SumHandoff({self.giver.name} -> {self.taker.name})"


def link_sum_handoffs(layers, fused_relus) -> list:
    """A SumHandoff for every [block, its fused Relu, block] of `layers` (top level), `fused_relus` the pairs
    of `relu_fusion`."""
    fused_by = {pair.producer: pair for pair in fused_relus}
    out = []
    for taker, relu, giver in zip(layers, layers[1:], layers[2:]):
        fused = fused_by.get(taker)
        if (fused is not None and fused.relu is relu and declared(taker, "takes_sum")
                and declared(giver, "gives_sum")):
            out.append(SumHandoff(taker, giver, fused))
    return out


@contextlib.contextmanager
def handing_sums(handoffs):
    """A model's backward pass: no part is pending before or after it (one a failed pass left behind)."""
    for h in handoffs:
        h._part = None
    try:
        yield
    finally:
        for h in handoffs:
            h._part = None
