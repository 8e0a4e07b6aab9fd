"""A language model's own numbers: tokens per second and perplexity.

A model trained with categorical cross-entropy (no label smoothing) on per-position class labels, outputs
(T, ..., classes), predicts T tokens per sample; its mean loss is the mean negative log-likelihood per token,
so exp(loss) is the perplexity. The loop adds `perplexity` (and `val_perplexity`) and `tokens_per_s` to the
epoch's history row and line, and the report's throughput in tokens per second.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["tokens_per_sample", "add_language_model_logs", "epoch_line_suffix"]


def tokens_per_sample(dataset, loss) -> int | None:
    """Tokens each sample predicts when the run is a language model's, else None."""
    shape = tuple(getattr(dataset, "output_shape", ()) or ())
    per_position = (len(shape) >= 2 and getattr(dataset, "target_shape", None) is not None
                    and shape[-1] == getattr(dataset, "nclasses", None))
    exact_nll = getattr(loss, "name", None) == "categorical_cross_entropy" and not getattr(loss, "label_smoothing", 0)
    return int(np.prod(shape[:-1])) if per_position and exact_nll else None


def _perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf        # exp overflows a float past ~709


def add_language_model_logs(logs: dict, tokens: int) -> None:
    """`perplexity`, `val_perplexity` (with validation) and `tokens_per_s` into an epoch's history row."""
    logs["perplexity"] = _perplexity(logs["loss"])
    if "val_loss" in logs:
        logs["val_perplexity"] = _perplexity(logs["val_loss"])
    logs["tokens_per_s"] = logs["samples_per_s"] * tokens


def epoch_line_suffix(logs: dict) -> str:
    """What a language model's epoch line adds after the time: its tokens per second."""
    return f", {logs['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in logs else ""
