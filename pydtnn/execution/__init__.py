"""Passes run when a model is packed: fused execution and shared storage, wired from what layers declare."""
