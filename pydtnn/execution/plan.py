"""The one entry point of the execution passes: `plan(layers)`, run when the model is packed."""
from __future__ import annotations

from pydtnn.execution.concat_chain import DenseChain, link_concat_chains
from pydtnn.execution.relu_fusion import FusedRelu, pair_relus


class ExecutionPlan:
    """What the passes wired (`Model.execution`): `fused_relus`, each a layer and the Relu it runs inside
    it, and `chains`, the dense layers that share one array."""

    def __init__(self, fused_relus: list[FusedRelu], chains: list[DenseChain]):
        self.fused_relus, self.chains = fused_relus, chains

    def unwire(self):
        """Detach every layer from this plan (before the model is planned anew)."""
        for wiring in self.fused_relus + self.chains:
            wiring.unwire()

    def __repr__(self):
        return f"ExecutionPlan(fused_relus={self.fused_relus}, chains={self.chains})"


def plan(layers) -> ExecutionPlan:
    """Wire `layers` (blocks' paths included) from what they declare: fused Relus, then dense chains."""
    return ExecutionPlan(pair_relus(layers), link_concat_chains(layers))
