"""The one entry point of the execution passes: `plan(layers)`, run when the model is packed, and the
`ExecutionPlan` it returns, which holds every pairing and says how to call each layer."""
from __future__ import annotations

import functools

from pydtnn.execution.concat_chain import DenseChain, link_concat_chains
from pydtnn.execution.declared import declared, planned_paths
from pydtnn.execution.relu_fusion import FusedRelu, pair_relus
from pydtnn.execution.sum_handoff import SumHandoff, handing_sums, link_sum_handoffs


class ExecutionPlan:
    """What the passes paired (`Model.execution`): `fused_relus`, each a layer and the Relu it runs inside
    it; `chains`, the dense layers that share one array; `handoffs`, blocks whose last sum the block before
    them adds in its mask's pass (during `backward_pass()`); `blocks`, those whose paths run through the plan.

    The layers keep none of it: the model, and a planned block for its paths, call a layer through
    `call(layer, phase)`, which hands the layer its partners as keywords of its forward or backward (what its
    declarations promise it takes: `relu=`, `moments=`, `chain=`, `sum_out=`, `sum_in=`, `plan=`). A layer
    paired with nothing is called as written, so a user's layer never sees a keyword it did not declare."""

    def __init__(self, fused_relus: list[FusedRelu], chains: list[DenseChain], handoffs: list[SumHandoff] = (),
                 blocks=()):
        self.fused_relus, self.chains, self.handoffs = list(fused_relus), list(chains), list(handoffs)
        self.blocks = list(blocks)
        self._options = {"forward": {}, "backward": {}}       # phase -> layer -> keyword -> partner

        def give(layer, phases, **partners):
            for phase in phases:
                self._options[phase].setdefault(layer, {}).update(partners)
        both = ("forward", "backward")
        for pair in self.fused_relus:
            give(pair.producer, both, relu=pair)
            give(pair.relu, both, relu=pair)
        for chain in self.chains:
            for block in chain.blocks:
                give(block, ("forward",), chain=chain)
            for _, taker in chain.hand_offs:
                give(taker, ("forward",), moments=chain)
        for handoff in self.handoffs:
            give(handoff.taker, ("backward",), sum_in=handoff)
            give(handoff.giver, ("backward",), sum_out=handoff)
        for block in self.blocks:
            give(block, both, plan=self)

    def call(self, layer, phase: str, **options):
        """`layer.forward_internal` or `layer.backward_internal` (`phase` "forward" or "backward") with
        `options` and the partners this plan paired the layer with for that phase. Looked up on the layer at
        each call: a wrapper set on the instance (a timer) is what runs."""
        fn = getattr(layer, f"{phase}_internal")
        partners = self._options[phase].get(layer)
        if partners:
            options = {**partners, **options}
        return functools.partial(fn, **options) if options else fn

    def partners(self, layer) -> dict:
        """keyword -> partner of everything this plan paired `layer` with (its forward's and its backward's;
        `plan=` left out): {} for a layer paired with nothing."""
        out = {**self._options["forward"].get(layer, {}), **self._options["backward"].get(layer, {})}
        out.pop("plan", None)
        return out

    def without(self, *passes: str) -> ExecutionPlan:
        """This plan less the pairings of `passes` ("fused_relus", "chains", "handoffs"): what the model runs
        without them (a comparison)."""
        kept = {name: [] if name in passes else getattr(self, name)
                for name in ("fused_relus", "chains", "handoffs")}
        return ExecutionPlan(blocks=self.blocks, **kept)

    def backward_pass(self):
        """The model's backward pass runs inside this (no handed sum is pending before or after it)."""
        return handing_sums(self.handoffs)

    def __repr__(self):
        return f"ExecutionPlan(fused_relus={self.fused_relus}, chains={self.chains}, handoffs={self.handoffs})"


def _planned_blocks(layers) -> list:
    """The blocks among `layers` (nested ones included) that declare `runs_paths_with_plan`."""
    out = []
    for layer in layers:
        if declared(layer, "runs_paths_with_plan"):
            out.append(layer)
        for path in planned_paths(layer):
            out += _planned_blocks(path)
    return out


def plan(layers) -> ExecutionPlan:
    """Pair `layers` (the planned paths of blocks included) from what they declare: fused Relus, dense
    chains, then the sums handed between top-level blocks."""
    fused = pair_relus(layers)              # first: the handoffs join blocks whose ReLU is fused
    return ExecutionPlan(fused, link_concat_chains(layers), link_sum_handoffs(layers, fused),
                         _planned_blocks(layers))
