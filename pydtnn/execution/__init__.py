"""Passes run when a model is packed: fused execution and shared storage, paired from what layers declare
(the declaration hooks of `pydtnn.layers.base.Layer`). `plan(layers)` runs them all and returns the
`ExecutionPlan` that holds the pairs (`Model.execution`) and says how the model calls each layer: with its
partners as keywords of its forward or backward. The layers keep none of them."""
from pydtnn.execution.plan import ExecutionPlan, plan

__all__ = ["ExecutionPlan", "plan"]
