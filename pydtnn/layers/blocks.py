"""AdditionBlock and ConcatenationBlock: parallel paths over one input, merged by sum or channel concat.

Each path is a list of layers; [] is the identity path. Paths' parameters are laid out in the model's flat
buffer in forward order (path 0 first), and backward visits the paths in reverse so that gradients become
final from the end of the buffer towards its start (what the bucketed reducer relies on).

Both declare what the execution passes may pair (pydtnn/execution/) and take the partners as keywords of
forward and backward, from the model's plan, which holds the pairs: an AdditionBlock applies a Relu right
after it in its merge (`relu=`) and hands its last sum to the block before it (`sum_out=` / `sum_in=`);
consecutive (path, []) ConcatenationBlocks share one array (`chain=`, a DenseChain). Both run their paths'
layers through the plan (`plan=`), which hands each its own partners; run without it (a block called on its
own), a block runs its layers alone.
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


def _call(plan, layer, phase, **options):
    """`layer`'s forward_internal or backward_internal with `options`, and with what `plan` (the model's
    ExecutionPlan, None for a block run on its own) paired the layer with."""
    if plan is not None:
        return plan.call(layer, phase, **options)
    fn = getattr(layer, f"{phase}_internal")
    return functools.partial(fn, **options) if options else fn


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

    def runs_paths_with_plan(self):
        return True

    def forward(self, x, training=False, *, plan=None):
        return self.merge(self._forward_paths(x, training, plan))

    def backward(self, dy, *, plan=None):
        return self._backward_paths(dy, plan)

    def _forward_paths(self, x, training, plan):
        outs = []
        for path in self.paths:
            y = x
            for layer in path:
                y = self.run_sublayer(layer, "forward", _call(plan, layer, "forward"), y, training)
            outs.append(y)
        return outs

    def _backward_paths(self, dy, plan, sum_out=None):
        """dL/dx; with `sum_out` (a SumHandoff) that can give, path 0's part is left to the block before this
        one and the other paths' sum returned."""
        dx = None
        for k, (path, dpath) in reversed(list(enumerate(zip(self.paths, self.split(dy))))):
            for i in range(len(path) - 1, -1, -1):
                layer = path[i]
                if i == 0 and dx is not None and _adds(layer):      # the paths' sum in its own pass
                    dpath, dx = self.run_sublayer(layer, "backward", _call(plan, layer, "backward", addend=dx),
                                                  dpath), None
                else:
                    dpath = self.run_sublayer(layer, "backward", _call(plan, layer, "backward"), dpath)
            if dx is not None and k == 0 and sum_out is not None and sum_out.can_give():
                sum_out.give(dx)                # the block before adds it in its mask's pass (sum_handoff)
                return dpath
            dx = dpath if dx is None else self.backend.add(dx, dpath)
        return dx


class AdditionBlock(_Block):
    runs_paths_with_plan = _Block.runs_paths_with_plan

    def fuses_next_relu(self):
        """A Relu right after this block runs in its merge where the backend's add takes relu= (`fuses_relu`)."""
        return bool(getattr(self.backend, "fuses_relu", False))

    def gives_sum(self):
        return True

    def takes_sum(self):
        return True

    def forward(self, x, training=False, *, relu=None, plan=None):
        """relu: the FusedRelu of the Relu after this block, applied in the merge."""
        outs = self._forward_paths(x, training, plan)
        if relu is None:
            return self.merge(outs)
        return relu.hand_on(self.merge(outs, relu=True))

    def backward(self, dy, *, relu=None, sum_in=None, sum_out=None, plan=None):
        """sum_in / sum_out: the SumHandoffs that have this block add the next block's last part in its
        mask's pass, and leave its own to the block before it."""
        if relu is not None:                    # the fused Relu passed dy on: its mask comes first
            part = sum_in.take() if sum_in is not None else None    # the next block's other part
            dy = self.backend.relu_backward(dy, relu.y, addend=part)
        return self._backward_paths(dy, plan, sum_out)

    def merge_shape(self, shapes):
        if any(s != shapes[0] for s in shapes):
            raise self.shape_error(f"paths give different shapes {shapes}; an addition needs equal shapes")
        return shapes[0]

    def merge(self, outs, relu=False):
        """The sum of the paths' outputs; relu'd where `relu` (the fused Relu's, in the last add)."""
        if len(outs) == 1 and not relu:
            return outs[0]
        if len(outs) == 1:
            y = self.backend.relu_forward(outs[0])
        else:           # one pass into a new array; the fused Relu in the last one
            y = self.backend.add(outs[0], outs[1], relu=relu and len(outs) == 2)
            for i, o in enumerate(outs[2:]):
                y = self.backend.add(y, o, relu=relu and i == len(outs) - 3)
        return y

    def split(self, dy):
        return [dy] * len(self.paths)


class ConcatenationBlock(_Block):
    runs_paths_with_plan = _Block.runs_paths_with_plan

    def shares_chain_array(self):
        """A chain of (path, []) blocks on a channels-last 4-D layout shares one array (DenseNet's dense layers)."""
        return (len(self.paths) == 2 and not self.paths[1] and bool(self.paths[0])
                and len(self.shape) == 3 and getattr(self.backend, "channel_axis", 1) == 3)

    def forward(self, x, training=False, *, chain=None, plan=None):
        """chain: the DenseChain whose shared array this block writes into."""
        if chain is None:
            return self.merge(self._forward_paths(x, training, plan))
        if training:
            chain.hand_on_moments(self, x)
        return self.merge(self._forward_paths(x, training, plan), chain=chain)

    def merge_shape(self, shapes):
        if any(len(s) != len(shapes[0]) or s[1:] != shapes[0][1:] for s in shapes):
            raise self.shape_error(f"paths give shapes {shapes}; a concatenation needs equal shapes but channels")
        self.sizes = [s[0] for s in shapes]
        return (sum(self.sizes),) + tuple(shapes[0][1:])

    def _axis(self, ndim):
        return self.backend.channel_axis if ndim == 4 else 1

    def merge(self, outs, chain=None):
        """The paths' outputs along the channels: a slice of `chain`'s shared array where given, else a copy."""
        if chain is not None:
            return chain.merge(self, *outs)
        return self.xp.concatenate(outs, axis=self._axis(outs[0].ndim))

    def split(self, dy):
        axis, pieces, start = self._axis(dy.ndim), [], 0
        for size in self.sizes:
            index = [slice(None)] * dy.ndim
            index[axis] = slice(start, start + size)
            pieces.append(dy[tuple(index)])
            start += size
        return pieces
