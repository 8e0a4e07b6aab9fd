"""NCHWView: a backend seen in NCHW layout, for checking layers that declare `internal_layout = True`.

It wraps a real backend (the CPU's NHWC one) and runs the very same kernels, converting the image
arguments to the wrapped backend's layout and image results back. A layer that honours
`backend.channel_axis` gives the same numbers on the real backend and on its view; one that computes as
if NCHW while declaring the internal layout does not (`pydtnn.testing.check_gradients` compares the two).

Only the image arguments and results of the image kernels (`IMAGE_KERNELS`) are converted; weights,
statistics, the opaque ctx and every other method (`xp`, `softmax` on attention scores...) are the
wrapped backend's as they are. A new backend kernel that takes or returns 4-D images belongs in that
table. The random generator draws 4-D shapes in the wrapped layout and transposes, so a Dropout mask is
the same element by element in both.
"""
from __future__ import annotations

from pydtnn.backends.contract import Backend

# kernel -> (positions of its image arguments, keyword arguments that are images, what of its result is an
# image: "all" for one array, a tuple of positions in a tuple result). Weights, statistics and the opaque
# ctx stay as they are (a ctx holds the wrapped layout's arrays and goes back to the wrapped kernels).
IMAGE_KERNELS = {
    "conv2d_forward": ((0,), (), (0,)),
    "conv2d_backward_data": ((0,), (), "all"),
    "conv2d_backward_weights": ((0,), (), ()),
    "conv2d_context": ((0,), (), ()),
    "pool2d_forward": ((0,), (), (0,)),
    "pool2d_backward": ((0,), (), "all"),
    "batchnorm_forward_train": ((0,), (), (0,)),
    "batchnorm_forward_infer": ((0,), (), "all"),
    "batchnorm_backward": ((0,), ("relu_y", "addend"), (0,)),
    "bias_relu_backward": ((0, 1), (), (0,)),
    "relu_forward": ((0,), (), "all"),
    "relu_backward": ((0, 1), ("addend",), "all"),
    "add": ((0, 1), (), "all"),
}


class _NCHWRandom:
    """The wrapped generator, drawing 4-D shapes in the wrapped layout (so masks match element by element)."""

    def __init__(self, view):
        self._view = view

    def random(self, size=None, dtype=None):
        inner = self._view.inner
        kw = {} if dtype is None else {"dtype": dtype}
        if size is not None and len(size) == 4:
            n, c, h, w = size
            return inner.to_user(inner.rng.random(inner.internal_shape(n, (c, h, w)), **kw))
        return inner.rng.random(size, **kw)

    def __getattr__(self, name):
        return getattr(self._view.inner.rng, name)


class NCHWView(Backend):
    layout = "NCHW"

    def __init__(self, inner: Backend):       # noqa: D107 - the base __init__ is abstract
        self.inner = inner
        self.name, self.xp, self.dtype = inner.name, inner.xp, inner.dtype
        self.rng = _NCHWRandom(self)

    def _in(self, a):
        return self.inner.to_internal(a) if getattr(a, "ndim", 0) == 4 else a

    def _out(self, a):
        return self.inner.to_user(a) if getattr(a, "ndim", 0) == 4 else a

    def _wrap(self, name):
        kernel = getattr(self.inner, name)
        image_args, image_kwargs, image_results = IMAGE_KERNELS[name]

        def call(*args, **kwargs):
            args = [self._in(a) if i in image_args else a for i, a in enumerate(args)]
            kwargs = {k: self._in(v) if k in image_kwargs else v for k, v in kwargs.items()}
            result = kernel(*args, **kwargs)
            if image_results == "all":
                return self._out(result)
            return tuple(self._out(r) if i in image_results else r for i, r in enumerate(result))
        return call

    def __getattribute__(self, name):
        # image kernels, the base class's defaults included, are the wrapped backend's, converted
        if name in IMAGE_KERNELS:
            return object.__getattribute__(self, "_wrap")(name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name):            # what the base class does not define: the wrapped backend's
        return getattr(self.inner, name)

    # the capabilities and kernels the base class declares are the wrapped backend's (the base's defaults
    # would hide them from __getattr__); batchnorm_moments reads the opaque ctx, no image
    @property
    def fuses_relu(self):
        return getattr(self.inner, "fuses_relu", False)

    @property
    def fuses_conv_relu(self):
        return getattr(self.inner, "fuses_conv_relu", False)

    @property
    def reuses_bn_moments(self):
        return getattr(self.inner, "reuses_bn_moments", False)

    def batchnorm_moments(self, ctx):
        return self.inner.batchnorm_moments(ctx)

    def erfc(self, x):
        return self.inner.erfc(x)

    def softmax(self, s, causal=False):
        return self.inner.softmax(s, causal=causal)

    def softmax_backward(self, y, g):
        return self.inner.softmax_backward(y, g)

    def attention_forward(self, *args, **kw):
        return self.inner.attention_forward(*args, **kw)

    def attention_backward(self, *args, **kw):
        return self.inner.attention_backward(*args, **kw)

    def asarray(self, a):
        return self.inner.asarray(a)

    def to_numpy(self, a):
        return self.inner.to_numpy(a)

    def to_internal(self, x_nchw):
        return self.inner.asarray(x_nchw)

    def to_user(self, x):
        return x

    def seed(self, seed: int) -> None:
        self.inner.seed(seed)

    def synchronize(self) -> None:
        self.inner.synchronize()
