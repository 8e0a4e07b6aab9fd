"""The Layer base class: shape inference, parameters as views of the model's flat buffers, forward/backward.

A layer is written once for every backend: its math goes through `self.xp` (numpy or cupy) and the
heavy kernels of `self.backend`. Shapes seen by users are per-sample and NCHW-ordered: (C, H, W) for
images, (F,) for features.

Layout boundary: a layer's `forward`/`backward` get and return 4-D arrays in NCHW (axis 1 = channels) on
every backend, unless its class sets `internal_layout = True`: then they are in the backend's internal
layout (`backend.layout`, channels on `backend.channel_axis`), which is what every built-in layer does to
avoid transposes. The model and the blocks call `forward_internal`/`backward_internal`, which convert
only around a layer that did not opt in, and only when the backend's layout is not NCHW already.
The whole contract is in docs/custom_layers.md.
"""
from __future__ import annotations

import numpy as np

from pydtnn.errors import ConfigError, ShapeError
from pydtnn.initializers import get_initializer


def pair(value, what, layer_name):
    """An int or a 2-sequence of ints -> (a, b)."""
    if isinstance(value, (int, np.integer)):
        return int(value), int(value)
    try:
        a, b = value
        return int(a), int(b)
    except (TypeError, ValueError):
        raise ConfigError(f"{layer_name}: {what} must be an int or a pair of ints, got {value!r}") from None


class Layer:
    """Base layer. Subclasses override `build`, `forward`, `backward` and, if trainable, `param_specs`
    (or call `add_weight` from `build`)."""

    # False: forward/backward see 4-D arrays as NCHW on every backend (the model converts at the boundary).
    # True: they see the backend's internal layout (NHWC on the CPU); built-in layers declare it.
    internal_layout = False
    # True for a layer whose backward(dy, addend=a) returns dx + a, a summed in its own pass over memory: a
    # block hands it the other paths' gradients of the same input (BatchNormalization on every backend)
    backward_adds = False
    # False for a layer whose input has no gradient (Embedding's integer ids): its backward returns None
    differentiable_input = True
    # A layer with sublayers (a block, a Composite) runs them through `run_sublayer`; while a per-layer timer
    # (pydtnn.observe.layer_timer) times this layer it sets itself here, and each sublayer gets its own event
    sublayer_timer = None

    def run_sublayer(self, layer, phase: str, fn, data, *args):
        """``fn(data, *args)``: `layer`'s ``phase`` ("forward" or "backward"), timed when a timer is set."""
        timer = self.sublayer_timer
        return fn(data, *args) if timer is None else timer.run(layer, phase, fn, data, *args, parent=self)

    def __init__(self, activation=None, name=None):
        self.activation = activation        # shortcut: the model adds this activation layer right after
        self.name = name                    # set by the model when None ("conv2d_3")
        self.backend = None
        self.xp = None
        self.in_shape = None                # per-sample input shape
        self.shape = None                   # per-sample output shape
        self._param_values = {}             # name -> array (a view of the model's flat buffer once packed)
        self._grad_values = {}
        self.input_grad_needed = True       # False for the first layer in training: nothing uses its dx
        self._added_weights = {}            # add_weight: name -> (shape, initializer, fan_in, fan_out)

    # --- wiring -------------------------------------------------------------------------------------
    @property
    def type_name(self) -> str:
        return type(self).__name__

    def initialize(self, in_shape, backend, rng, namer):
        """Attach to a backend, infer the output shape, and draw initial parameters (host, float64)."""
        self.backend, self.xp = backend, backend.xp
        if self.name is None:
            self.name = namer(self)
        self.in_shape = tuple(int(d) for d in in_shape)
        self.shape = tuple(int(d) for d in self.build(self.in_shape))
        if any(d <= 0 for d in self.shape):
            raise ShapeError(f"layer {self.name} ({self.type_name}): input {self.in_shape} gives an empty "
                             f"output {self.shape}")
        for pname, (pshape, init, fan_in, fan_out) in self.param_specs().items():
            values = get_initializer(init)(pshape, fan_in, fan_out, rng)
            self._param_values[pname] = backend.asarray(values)
            self._grad_values[pname] = backend.xp.zeros(pshape, dtype=backend.dtype)
        self.after_initialize(rng)
        return self.shape

    def build(self, in_shape):
        """Check the input shape and return the output shape (raise ShapeError naming the layer)."""
        return in_shape

    def after_initialize(self, rng):
        """Hook for non-trainable state (BatchNormalization's running statistics)."""

    def param_specs(self) -> dict:
        """name -> (shape, initializer, fan_in, fan_out), in a fixed order (by default, the `add_weight`s)."""
        return dict(self._added_weights)

    def add_weight(self, name, shape, initializer="zeros", fan_in=None, fan_out=None):
        """Declare a parameter from `build` (a shortcut for overriding `param_specs`).

        Its value and gradient are then `self.get_param(name)` / `self.get_grad(name)`, or attributes
        through `ParamAttr(name)` / `ParamAttr(name, grad=True)` declared on the class. `fan_in` /
        `fan_out` feed the He/Glorot/LeCun initializers; they default to the product of all axes but the
        first, and to the first axis.
        """
        shape = tuple(int(d) for d in shape)
        if name in self._added_weights:
            raise ConfigError(f"layer {self.name} ({self.type_name}): weight {name!r} declared twice")
        if fan_in is None:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        if fan_out is None:
            fan_out = shape[0]
        self._added_weights[name] = (shape, initializer, int(fan_in), int(fan_out))

    def shape_error(self, message):
        return ShapeError(f"layer {self.name} ({self.type_name}) with input shape {self.in_shape}: {message}")

    # --- parameters ---------------------------------------------------------------------------------
    def param_names(self):
        return list(self._param_values)

    def get_param(self, pname):
        return self._param_values[pname]

    def get_grad(self, pname):
        return self._grad_values[pname]

    def bind_flat(self, pname, param_view, grad_view):
        """Make a parameter and its gradient views of the model's flat buffers (values are copied in)."""
        param_view[...] = self._param_values[pname]
        grad_view[...] = 0
        self._param_values[pname] = param_view
        self._grad_values[pname] = grad_view

    def state_arrays(self) -> dict:
        """Non-trainable arrays that belong in checkpoints (running statistics)."""
        return {}

    def sublayers(self):
        """Nested layers in forward order (blocks override)."""
        return []

    @property
    def channel_axis(self) -> int:
        """The channel axis of the 4-D arrays this layer's forward/backward see (1 unless internal_layout)."""
        return self.backend.channel_axis if self.internal_layout else 1

    @property
    def nparams(self) -> int:
        return sum(int(np.prod(s)) for s, *_ in self.param_specs().values())

    def weight_shape_str(self) -> str:
        return ", ".join(str(tuple(s)) for s, *_ in self.param_specs().values())

    # --- declarations: what the execution passes (pydtnn/execution/) may do with this layer -----------
    # Nothing by default. The passes read them when the model is packed and pair layers; the plan they make
    # (`Model.execution`) holds the pairs and hands a layer its partners as keywords of the forward or backward
    # call it makes (the layer keeps none of them: called without them, as on its own, it runs unfused). A
    # declaration promises those keywords. It holds for the class that defines it, not for its subclasses
    # (which may compute something else): a subclass that still can declares again
    # (`fuses_next_relu = Base.fuses_next_relu`).

    def fuses_next_relu(self) -> bool:
        """Whether a Relu right after this layer can run inside it. Paired, forward and backward get `relu=`,
        a FusedRelu: forward returns `relu.hand_on(relu(result))` and backward first applies that ReLU's mask,
        `backend.relu_backward(dy, relu.y)`; the Relu passes both on unchanged."""
        return False

    def gives_sum(self) -> bool:
        """Whether this layer's backward can end without its last sum: with `sum_out=` (a SumHandoff), when
        `sum_out.can_give()`, `sum_out.give(part)` and return the other part (`pydtnn.execution.sum_handoff`)."""
        return False

    def takes_sum(self) -> bool:
        """Whether this layer's backward (of a fused ReLU) can add the part its giver left, `sum_in.take()`
        (`sum_in=`, a SumHandoff), in the mask's pass."""
        return False

    def takes_known_moments(self) -> bool:
        """Whether, first in a dense chain's block, a training forward can use the per-channel batch moments
        of its input's last channels, summed before (`moments=`, a DenseChain: `moments.take_moments(self)`,
        None if none), and `batch_moments()` gives its own last ones (or None)."""
        return False

    def shares_chain_array(self) -> bool:
        """Whether this block can put its new maps in front of its input inside one array shared with the
        blocks around it (`chain=`, a DenseChain, in forward: `chain.merge(self, new, x)`)."""
        return False

    def runs_paths_with_plan(self) -> bool:
        """Whether this block's forward and backward take `plan=` (the model's ExecutionPlan) and call the
        layers of its `paths` through it, `plan.call(layer, "forward")`: the passes then pair layers inside
        its paths too."""
        return False

    # --- computation --------------------------------------------------------------------------------
    def forward(self, x, training=False):
        raise NotImplementedError

    def backward(self, dy):
        raise NotImplementedError

    # --- what the model and blocks call: forward/backward on arrays in the backend's internal layout ---
    def _needs_boundary(self, a):
        return a is not None and a.ndim == 4 and not self.internal_layout and self.backend.layout != "NCHW"

    # `options`: the partners the execution plan paired this layer with (keywords its declarations promise)
    def forward_internal(self, x, training=False, **options):
        if self._needs_boundary(x):
            x = self.backend.to_user(x)
        y = self.forward(x, training, **options)
        if y is not None and self._needs_boundary(y):
            y = self.backend.to_internal(y)
        return y

    def backward_internal(self, dy, **options):
        if self._needs_boundary(dy):
            dy = self.backend.to_user(dy)
        dx = self.backward(dy, **options)
        if dx is None:
            if self.input_grad_needed and self.differentiable_input:
                raise TypeError(f"layer {self.name} ({self.type_name}): backward returned None, but the layer "
                                f"before it needs dL/dx (None is allowed only when self.input_grad_needed is "
                                f"False)")
        elif self._needs_boundary(dx):
            dx = self.backend.to_internal(dx)
        return dx


class ParamAttr:
    """Descriptor exposing a named parameter or gradient as an attribute (layer.weights, layer.dw)."""

    def __init__(self, pname, grad=False):
        self.pname, self.grad = pname, grad

    def __get__(self, layer, owner=None):
        if layer is None:
            return self
        store = layer._grad_values if self.grad else layer._param_values
        return store.get(self.pname)

    def __set__(self, layer, value):
        store = layer._grad_values if self.grad else layer._param_values
        if self.pname in store and hasattr(store[self.pname], "shape"):
            store[self.pname][...] = value          # keep it a view of the flat buffer
        else:
            store[self.pname] = value
