"""AdditionBlock and ConcatenationBlock: parallel paths over one input, merged by sum or channel concat.

Each path is a list of layers; [] is the identity path. Paths' parameters are laid out in the model's flat
buffer in forward order (path 0 first), and backward visits the paths in reverse so that gradients become
final from the end of the buffer towards its start (what the bucketed reducer relies on).

Both declare what the execution passes may wire (pydtnn/execution/): an AdditionBlock applies a Relu right
after it in its merge; consecutive (path, []) ConcatenationBlocks share one array, a DenseChain.
"""
import functools
import inspect

from pydtnn.layers.base import Layer


def _adds(layer) -> bool:
    """Whether a block may hand `layer` the other paths' gradient (`Layer.backward_adds`): declared, in the
    internal layout, and its class's backward still takes `addend` (a subclass may override it without)."""
    return layer.backward_adds and layer.internal_layout and _takes_addend(type(layer))


@functools.lru_cache(maxsize=None)
def _takes_addend(cls) -> bool:
    return "addend" in inspect.signature(cls.backward).parameters


class _Block(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)
    def __init__(self, *paths, name=None):
        super().__init__(name=name)
        if not paths:
            raise ValueError(f"{type(self).__name__} needs at least one path")
        self.paths = [list(p) for p in paths]

    def initialize(self, in_shape, backend, rng, namer):
        from pydtnn.activations import expand_activations     # activations imports the layers' package
        self.backend, self.xp = backend, backend.xp
        if self.name is None:
            self.name = namer(self)
        self.in_shape = tuple(in_shape)
        self.paths = [expand_activations(p) for p in self.paths]
        out_shapes = []
        for path in self.paths:
            shape = self.in_shape
            for layer in path:
                shape = layer.initialize(shape, backend, rng, namer)
            out_shapes.append(shape)
        self.shape = tuple(self.merge_shape(out_shapes))
        return self.shape

    def sublayers(self):
        out = []
        for path in self.paths:
            for layer in path:
                out.append(layer)
                out.extend(layer.sublayers())
        return out

    def weight_shape_str(self):
        return ""

    @property
    def nparams(self):
        return sum(l.nparams for path in self.paths for l in path)

    def forward(self, x, training=False):
        outs = []
        for path in self.paths:
            y = x
            for layer in path:
                y = self.run_sublayer(layer, "forward", layer.forward_internal, y, training)
            outs.append(y)
        return self.merge(outs)

    def backward(self, dy):
        dx = None
        for k, (path, dpath) in reversed(list(enumerate(zip(self.paths, self.split(dy))))):
            for i in range(len(path) - 1, -1, -1):
                layer = path[i]
                if i == 0 and dx is not None and _adds(layer):      # the paths' sum in its own pass
                    dpath, dx = self.run_sublayer(layer, "backward", functools.partial(layer.backward, addend=dx),
                                                  dpath), None
                else:
                    dpath = self.run_sublayer(layer, "backward", layer.backward_internal, dpath)
            if dx is not None and k == 0 and self.sum_to is not None and self.sum_to.can_give():
                self.sum_to.give(dx)             # the block before adds it in its mask's pass (sum_handoff)
                return dpath
            dx = dpath if dx is None else self.backend.add(dx, dpath)
        return dx


class AdditionBlock(_Block):
    def fuses_next_relu(self):
        """A Relu right after this block runs in its merge where the backend's add takes relu= (`fuses_relu`)."""
        return bool(getattr(self.backend, "fuses_relu", False))

    def gives_sum(self):
        return True

    def takes_sum(self):
        return True

    def backward(self, dy):
        if self.fused_relu is not None:         # the fused Relu passed dy on: its mask comes first
            part = self.sum_from.take() if self.sum_from is not None else None    # the next block's other part
            dy = self.backend.relu_backward(dy, self.fused_relu.y, addend=part)
        return super().backward(dy)

    def merge_shape(self, shapes):
        if any(s != shapes[0] for s in shapes):
            raise self.shape_error(f"paths give different shapes {shapes}; an addition needs equal shapes")
        return shapes[0]

    def merge(self, outs):
        relu = self.fused_relu is not None
        if len(outs) == 1 and not relu:
            return outs[0]
        if len(outs) == 1:
            y = self.backend.relu_forward(outs[0])
        else:           # one pass into a new array; the fused Relu in the last one
            y = self.backend.add(outs[0], outs[1], relu=relu and len(outs) == 2)
            for i, o in enumerate(outs[2:]):
                y = self.backend.add(y, o, relu=relu and i == len(outs) - 3)
        return self.fused_relu.hand_on(y) if relu else y

    def split(self, dy):
        return [dy] * len(self.paths)


class ConcatenationBlock(_Block):
    def shares_chain_array(self):
        """A chain of (path, []) blocks on a channels-last 4-D layout shares one array (DenseNet's dense layers)."""
        return (len(self.paths) == 2 and not self.paths[1] and bool(self.paths[0])
                and len(self.shape) == 3 and getattr(self.backend, "channel_axis", 1) == 3)

    def forward(self, x, training=False):
        if training and self.chain is not None:
            self.chain.hand_on_moments(self, x)
        return super().forward(x, training)

    def merge_shape(self, shapes):
        if any(len(s) != len(shapes[0]) or s[1:] != shapes[0][1:] for s in shapes):
            raise self.shape_error(f"paths give shapes {shapes}; a concatenation needs equal shapes but channels")
        self.sizes = [s[0] for s in shapes]
        return (sum(self.sizes),) + tuple(shapes[0][1:])

    def _axis(self, ndim):
        return self.backend.channel_axis if ndim == 4 else 1

    def merge(self, outs):
        if self.chain is not None:
            return self.chain.merge(self, *outs)
        return self.xp.concatenate(outs, axis=self._axis(outs[0].ndim))

    def split(self, dy):
        axis, pieces, start = self._axis(dy.ndim), [], 0
        for size in self.sizes:
            index = [slice(None)] * dy.ndim
            index[axis] = slice(start, start + size)
            pieces.append(dy[tuple(index)])
            start += size
        return pieces
