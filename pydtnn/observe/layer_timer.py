"""Times each top-level layer's forward and backward while set as ``model.layer_timer``.

    model.layer_timer = LayerTimer(model.backend, timeline=timeline, profile=profile, waited=lambda: timer.step_wait_s)
    model.forward(x, training=True)         # each layer: a timeline event and/or a profile sample
    model.layer_timer = None                # the model's loops call nothing per layer again

`Model.forward` and `Model.backward` check ``layer_timer`` once per pass: with None (tracing off, or a
step outside --trace_steps, and no --profile_layers) no timer is called per layer. Layers are the model's
top-level ones, named as in `Model.summary()` (a block is one event: its paths' layers run inside it).
The device is synchronized around each layer so that a GPU layer's event lasts its kernels, not their
launch. The profile's seconds exclude the collectives inside a layer (synchronized BatchNorm waits,
counted by ``waited``); the timeline shows them nested in the layer's event.
"""
from __future__ import annotations

import time

__all__ = ["LayerTimer"]


class LayerTimer:
    def __init__(self, backend, timeline=None, profile=None, waited=lambda: 0.0):
        self.synchronize = backend.synchronize
        self.timeline, self.profile, self.waited = timeline, profile, waited

    def run(self, layer, phase: str, fn, data, *args):
        """``fn(data, *args)`` timed as ``layer``'s ``phase`` ("forward" or "backward")."""
        self.synchronize()
        w0, t0 = self.waited(), time.perf_counter()
        out = fn(data, *args)
        self.synchronize()
        t1 = time.perf_counter()
        if self.timeline is not None:
            origin = self.timeline.t0
            self.timeline.add(layer.name, t0 - origin, t1 - origin, phase, layer=layer.type_name)
        if self.profile is not None:
            self.profile.add(layer, phase, (t1 - t0) - (self.waited() - w0), len(data))
        return out

    def span(self, name: str, phase: str, fn, *args):
        """``fn(*args)`` as a timeline event only (the loss: not a layer of the profile's table)."""
        if self.timeline is None:
            return fn(*args)
        self.synchronize()
        t0 = self.timeline.now()
        out = fn(*args)
        self.synchronize()
        self.timeline.add(name, t0, self.timeline.now(), phase)
        return out
