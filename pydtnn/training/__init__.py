"""The training loop (`loop.Trainer`) and what it owns: its side of a step, checkpoints and preemption,
the speed probe, prefetching, progress, its own callbacks, and `Model.fit`'s entry (`fit`)."""
