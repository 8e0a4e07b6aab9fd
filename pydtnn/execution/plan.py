"""The one entry point of the execution passes: `plan(layers)`, run when the model is packed."""
from __future__ import annotations

from pydtnn.execution.concat_chain import DenseChain, link_concat_chains
from pydtnn.execution.relu_fusion import FusedRelu, pair_relus
from pydtnn.execution.sum_handoff import SumHandoff, handing_sums, link_sum_handoffs


class ExecutionPlan:
    """What the passes wired (`Model.execution`): `fused_relus`, each a layer and the Relu it runs inside
    it; `chains`, the dense layers that share one array; `handoffs`, blocks whose last sum the block before
    them adds in its mask's pass (during `backward_pass()`)."""

    def __init__(self, fused_relus: list[FusedRelu], chains: list[DenseChain], handoffs: list[SumHandoff] = ()):
        self.fused_relus, self.chains, self.handoffs = fused_relus, chains, list(handoffs)

    def backward_pass(self):
        """The model's backward pass runs inside this (the handoffs act)."""
        return handing_sums(self.handoffs)

    def unwire(self):
        """Detach every layer from this plan (before the model is planned anew)."""
        for wiring in self.fused_relus + self.chains + self.handoffs:
            wiring.unwire()

    def __repr__(self):
        return f"ExecutionPlan(fused_relus={self.fused_relus}, chains={self.chains}, handoffs={self.handoffs})"


def plan(layers) -> ExecutionPlan:
    """Wire `layers` (blocks' paths included) from what they declare: fused Relus, dense chains, then the
    sums handed between top-level blocks."""
    fused = pair_relus(layers)              # first: the handoffs join blocks whose ReLU is fused
    return ExecutionPlan(fused, link_concat_chains(layers), link_sum_handoffs(layers))
