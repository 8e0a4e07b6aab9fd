"""The gradient checker catches every wrong layer we know of (issue 21), and a backward returning None is
an error naming its layer. Each wrong layer is shown passing the checks the old checker ran, then failing."""
import re

import numpy as np
import pytest

from pydtnn import Model
from pydtnn.layers import FC, Input, Layer
from pydtnn.layers.base import ParamAttr
from pydtnn.testing import check_gradients


class ForgetsItsScale(Layer):
    """y = x * scale[c] with scale initialised to ones, whose dx forgets the scale: right only at scale = 1."""
    scale, dscale = ParamAttr("scale"), ParamAttr("scale", grad=True)

    def build(self, in_shape):
        self.add_weight("scale", (in_shape[0],), initializer="ones")
        return in_shape

    def forward(self, x, training=False):
        self.x = x
        return x * self.scale[None, :, None, None]

    def backward(self, dy):
        self.dscale[...] = (dy * self.x).sum(axis=(0, 2, 3))
        return dy                                    # should be dy * scale


class Accumulates(ForgetsItsScale):
    """Right dx, but adds its weight gradient to the buffer instead of writing it."""

    def backward(self, dy):
        self.dscale[...] += (dy * self.x).sum(axis=(0, 2, 3))
        return dy * self.scale[None, :, None, None]


class CentresAxisOne(Layer):
    """Subtracts the mean over the channels, y = x - mean_c(x), but reads axis 1 while declaring the
    internal layout: on the CPU (NHWC inside) that is the mean over H."""
    internal_layout = True

    def forward(self, x, training=False):
        return x - x.mean(axis=1, keepdims=True)

    def backward(self, dy):
        return dy - dy.mean(axis=1, keepdims=True)


class CentresChannels(CentresAxisOne):
    """The same layer written right: the backend's channel axis."""

    def forward(self, x, training=False):
        return x - x.mean(axis=self.channel_axis, keepdims=True)

    def backward(self, dy):
        return dy - dy.mean(axis=self.channel_axis, keepdims=True)


SHAPE = (3, 4, 5)            # C != H != W: a wrong axis cannot pass by symmetry


def test_a_scale_right_only_at_ones_passes_at_the_initial_values_and_fails_randomized(backend_name):
    check_gradients(ForgetsItsScale(), SHAPE, backend=backend_name, randomize_params=False)   # the old check
    with pytest.raises(AssertionError, match=re.escape("the gradient of 'x' disagrees")):
        check_gradients(ForgetsItsScale(), SHAPE, backend=backend_name)


def test_an_accumulating_backward_fails(backend_name):
    layer = Accumulates()
    model = Model(backend=backend_name, dtype="float64")
    model.add(Input(shape=SHAPE))
    model.add(layer)
    x = np.random.default_rng(0).standard_normal((2,) + SHAPE)
    grads = []
    for _ in range(3):                    # what training sees: the same batch, a growing gradient
        model.forward(x, training=True)
        model.backward(model.backend.asarray(np.ones((2,) + SHAPE)))
        grads.append(model.backend.to_numpy(layer.dscale).copy())
    np.testing.assert_allclose(grads[2], 3 * grads[0])
    with pytest.raises(AssertionError, match=r"'accumulates/scale' differs between two backward passes.*"
                                             r"not accumulate"):
        check_gradients(Accumulates(), SHAPE, backend=backend_name)


def test_a_layer_that_computes_as_if_nchw_in_the_internal_layout_fails():
    model = Model(backend="cpu", dtype="float64")
    assert model.backend.layout == "NHWC"
    # its own function is smooth and its backward matches it: finite differences alone cannot tell
    from pydtnn.testing import gradient_errors
    model.add(Input(shape=SHAPE))
    model.add(CentresAxisOne())
    errors = gradient_errors(model, np.random.default_rng(0).standard_normal((2,) + SHAPE))
    assert max(errors.values()) < 1e-7
    with pytest.raises(AssertionError, match=r"declares internal_layout = True but its forward on the NHWC "
                                             r"layout .* differs"):
        check_gradients(CentresAxisOne(), SHAPE, backend="cpu")
    assert check_gradients(CentresChannels(), SHAPE, backend="cpu")["x"] < 1e-8


class ReturnsNothing(FC):
    def backward(self, dy):
        super().backward(dy)                # forgets the return


def test_a_backward_returning_none_names_the_layer(backend_name):
    model = Model(backend=backend_name, dtype="float64")
    model.add(Input(shape=(4,)))
    model.add(FC(shape=(3,)))
    model.add(ReturnsNothing(shape=(2,), name="head"))
    model.forward(np.ones((2, 4)), training=True)
    with pytest.raises(TypeError, match=r"layer head \(ReturnsNothing\): backward returned None"):
        model.backward(model.backend.asarray(np.ones((2, 2))))


def test_the_first_layer_may_skip_its_input_gradient(backend_name):
    model = Model(backend=backend_name, dtype="float64")
    model.add(Input(shape=(4,)))
    model.add(FC(shape=(3,)))
    model.forward(np.ones((2, 4)), training=True)
    assert model.backward(model.backend.asarray(np.ones((2, 3))), need_dx=False) is None
