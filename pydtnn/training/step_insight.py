"""Seeing inside the loop's steps: the per-layer timer (--tracing, --profile_layers) and each step's
timing for the callbacks' logs.

The layer timer (`pydtnn.observe.layer_timer`) is set on the model only in the steps it times: the traced
ones, and with --profile_layers every step but the run's first (allocations, compilation).
"""
from __future__ import annotations

from pydtnn.observe.layer_profile import LayerProfile
from pydtnn.observe.layer_timer import LayerTimer


class StepInsight:
    def __init__(self, model, timeline, tracing, profile_layers, waited):
        """`timeline`: the Trainer's (it records when `tracing`); `waited()`: the step's wait seconds so far."""
        self.model, self.timeline, self.tracing = model, timeline, tracing
        self.layer_profile = LayerProfile() if profile_layers else None
        self._layer_timer = (LayerTimer(model.backend, timeline if tracing else None, self.layer_profile,
                                        waited=waited)
                             if tracing or profile_layers else None)
        self._steps_run = 0                   # steps run by this Trainer (the first is no layer profile's)

    def begin_step(self, step, b_i):
        """Before the 1-based global ``step``: the timeline's step; the layer timer in the steps it times."""
        self.timeline.set_step(step, b_i)
        timed = self._layer_timer is not None and (
            (self.tracing and self.timeline.active) or (self.layer_profile is not None and self._steps_run > 0))
        self.model.layer_timer = self._layer_timer if timed else None

    def end_step(self, sizes, record, seconds):
        """After the step (its agreed `record`, this rank's wall `seconds` of it): the layer timer off, the
        layer profile's step time; for the callbacks' logs (identical on every rank) the step's throughput
        and each replica's b_i, compute and wait seconds."""
        self.model.layer_timer = None
        if self.layer_profile is not None and self._steps_run > 0:
            self.layer_profile.add_step(seconds)
        self._steps_run += 1
        out = {"samples_per_s": sum(sizes) / seconds}
        for r, b in enumerate(sizes):
            out[f"rank{r}_b"] = int(b)
            out[f"rank{r}_compute_s"] = float(record.compute_s_per_sample[r] * b)
            out[f"rank{r}_wait_s"] = float(record.wait_s[r])
        return out
