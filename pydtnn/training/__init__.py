"""The training loop and what it owns: checkpoints, prefetching, progress, its own callbacks."""
