"""Passes run when a model is packed: fused execution and shared storage, wired from what layers declare
(the declaration hooks of `pydtnn.layers.base.Layer`). `plan(layers)` runs them all and returns the
`ExecutionPlan` that lists what it wired (`Model.execution`)."""
from pydtnn.execution.plan import ExecutionPlan, plan

__all__ = ["ExecutionPlan", "plan"]
