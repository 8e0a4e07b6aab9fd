"""Times each top-level layer's forward and backward while set as ``model.layer_timer``.

    model.layer_timer = LayerTimer(model.backend, timeline=timeline, profile=profile, waited=lambda: timer.step_wait_s)
    model.forward(x, training=True)         # each layer: a timeline event and/or a profile sample
    model.layer_timer = None                # the model's loops call nothing per layer again

`Model.forward` and `Model.backward` check ``layer_timer`` once per pass: with None (tracing off, or a
step outside --trace_steps, and no --profile_layers) no timer is called per layer. Layers are named as in
`Model.summary()`; a layer with sublayers (a block, a Composite) is an event, and each of its sublayers an
event nested in it with the block as its ``parent`` (the timer sets itself as the block's `sublayer_timer`
while it runs), so a ResNet bottleneck shows which of its convolutions is slow.
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

    def run(self, layer, phase: str, fn, data, *args, parent=None):
        """``fn(data, *args)`` timed as ``layer``'s ``phase`` ("forward" or "backward"); ``parent``: the
        layer whose sublayer it is (None: a top-level layer)."""
        nested = bool(layer.sublayers())
        if self.profile is not None:
            self.profile.enter(layer, parent)        # the block's row before its sublayers' rows
        self.synchronize()
        w0, t0 = self.waited(), time.perf_counter()
        if nested:
            layer.sublayer_timer = self
        try:
            out = fn(data, *args)
        finally:
            if nested:
                layer.sublayer_timer = None
        self.synchronize()
        t1 = time.perf_counter()
        if self.timeline is not None:
            origin = self.timeline.t0
            extra = {"parent": parent.name} if parent is not None else {}
            self.timeline.add(layer.name, t0 - origin, t1 - origin, phase, layer=layer.type_name, **extra)
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
