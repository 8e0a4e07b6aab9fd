"""Seeing inside a step: the per-layer timeline (Chrome/Perfetto), the per-layer profile table, per-step
metrics (CSV, TensorBoard) and the per-replica plot. Nothing here runs unless a flag asks for it."""
