"""Composite: a layer made of sublayers, as Keras's subclassed layers are.

Assign the sublayers as attributes in `__init__` (a Layer, or a list of them); they are found in the order of
assignment. By default they run in sequence; override `build` to wire them otherwise (call
`self.build_sublayer(layer, in_shape)` for each, in forward order) and `forward` / `backward` to combine them
(`self.forward_sublayer(layer, x, training)` / `self.backward_sublayer(layer, dy)`).

The sublayers' parameters are views of the model's flat buffers like any other, placed right after the
composite's own (if it declares some), in the order the sublayers were built; `Model.summary()` lists them
indented under the composite. See docs/custom_layers.md.
"""
from __future__ import annotations

from pydtnn.errors import ConfigError
from pydtnn.layers.base import Layer


class Composite(Layer):
    # The arrays routed between sublayers are in the backend's internal layout (no transposes): combine them
    # with element-wise math, or along self.channel_axis. Set False to see NCHW (two transposes per sublayer).
    internal_layout = True

    def __setattr__(self, name, value):
        found = [value] if isinstance(value, Layer) else (
            list(value) if isinstance(value, (list, tuple)) and value and all(isinstance(v, Layer) for v in value)
            else [])
        if found:
            children = self.__dict__.setdefault("_children", [])
            for layer in found:
                if layer is self:
                    raise ConfigError(f"{type(self).__name__}: a layer cannot be its own sublayer")
                if not any(layer is c for c in children):
                    children.append(layer)
        super().__setattr__(name, value)

    @property
    def children(self) -> list:
        """The direct sublayers, in the order they were assigned."""
        return list(self.__dict__.get("_children", []))

    # --- wiring -------------------------------------------------------------------------------------
    def initialize(self, in_shape, backend, rng, namer):
        self._rng, self._namer = rng, namer
        shape = super().initialize(in_shape, backend, rng, namer)      # calls build, which builds the sublayers
        unbuilt = [type(c).__name__ for c in self.children if c.shape is None]
        if unbuilt:
            raise ConfigError(f"layer {self.name} ({self.type_name}): build did not build its sublayer(s) "
                              f"{', '.join(unbuilt)} (call self.build_sublayer for each)")
        return shape

    def build_sublayer(self, layer: Layer, in_shape) -> tuple:
        """Attach `layer` to this composite's backend, infer its shapes and draw its weights; returns its
        per-sample output shape."""
        if not any(layer is c for c in self.children):
            raise ConfigError(f"layer {self.name} ({self.type_name}): build_sublayer got a {layer.type_name} that "
                              f"is not one of its attributes")
        if layer.activation is not None:
            raise ConfigError(f"layer {self.name} ({self.type_name}): the {layer.type_name} sublayer has "
                              f"activation={layer.activation!r}; inside a composite, make the activation a sublayer "
                              f"of its own")
        return layer.initialize(in_shape, self.backend, self._rng, self._namer)

    def build(self, in_shape):
        """Default: the sublayers in sequence."""
        if not self.children:
            raise ConfigError(f"{type(self).__name__}: a Composite needs sublayers (assign them in __init__)")
        shape = in_shape
        for layer in self.children:
            shape = self.build_sublayer(layer, shape)
        return shape

    def sublayers(self):
        out = []
        for layer in self.children:
            out.append(layer)
            out.extend(layer.sublayers())
        return out

    @property
    def nparams(self) -> int:
        return super().nparams + sum(c.nparams for c in self.children)

    # --- computation --------------------------------------------------------------------------------
    def _nchw_outside(self, a):
        return a is not None and a.ndim == 4 and not self.internal_layout and self.backend.layout != "NCHW"

    def forward_sublayer(self, layer: Layer, x, training=False):
        """`layer`'s forward on `x` (in this composite's layout)."""
        outside = self._nchw_outside(x)
        y = self.run_sublayer(layer, "forward", layer.forward_internal, self.backend.to_internal(x) if outside else x,
                              training)
        return self.backend.to_user(y) if outside and y is not None and y.ndim == 4 else y

    def backward_sublayer(self, layer: Layer, dy):
        """`layer`'s backward on `dy`: fills its gradients, returns its dL/dx (in this composite's layout)."""
        outside = self._nchw_outside(dy)
        dx = self.run_sublayer(layer, "backward", layer.backward_internal,
                               self.backend.to_internal(dy) if outside else dy)
        return self.backend.to_user(dx) if outside and dx is not None and dx.ndim == 4 else dx

    def forward(self, x, training=False):
        for layer in self.children:
            x = self.forward_sublayer(layer, x, training)
        return x

    def backward(self, dy):
        for layer in reversed(self.children):
            dy = self.backward_sublayer(layer, dy)
        return dy
