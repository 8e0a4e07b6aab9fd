"""`Model.backward(dy)` with its default arguments on a model whose input is integer ids (an Embedding first)
returns None for the input gradient, as PyTorch and Keras have none for integer inputs, and still fills every
parameter's gradient; a model of float inputs still returns dL/dx, and a layer that owes dL/dx and returns
None is still refused."""
import numpy as np
import pytest

from pydtnn import Model
from pydtnn.layers import FC, Embedding, Flatten, Input, Layer
from pydtnn.models import build_model


def _ids_model(input_dtype):
    m = Model(dtype="float64", seed=0)
    m.add(Input(shape=(5,), dtype=input_dtype))
    m.add(Embedding(20, 4))
    m.add(Flatten())
    m.add(FC(shape=(3,)))
    return m


@pytest.mark.parametrize("input_dtype", ["int64", None])     # None: integer-valued float ids (Keras's way)
def test_backward_with_default_arguments_returns_no_input_gradient_and_every_parameter_gradient(input_dtype):
    ids = np.random.default_rng(0).integers(0, 20, (6, 5))
    x = ids if input_dtype else ids.astype(np.float64)
    model = _ids_model(input_dtype)
    dy = np.random.default_rng(1).standard_normal((6, 3))
    model.forward(x, training=True)
    assert model.backward(dy) is None
    with_default = model.grads.copy()
    model.grads[...] = np.nan                        # what the training path (need_dx=False) writes, from garbage
    model.forward(x, training=True)
    assert model.backward(dy, need_dx=False) is None
    assert np.array_equal(with_default, model.grads) and np.count_nonzero(with_default) > 0
    table_grad = model.layers[1].dw                  # the rows the ids picked, and only those
    assert set(np.flatnonzero(np.abs(table_grad).sum(axis=1))) <= set(ids.ravel())


def test_the_zoo_byte_model_backward_with_default_arguments():
    model = build_model("bytelm_small", Model(dtype="float64", seed=0))
    ids = np.random.default_rng(0).integers(0, 256, (2, 64))
    out = model.forward(ids, training=True)
    assert model.backward(np.ones_like(out)) is None and np.all(np.isfinite(model.grads))


def test_a_float_input_still_gets_its_gradient():
    model = Model(dtype="float64", seed=0)
    model.add(Input(shape=(5,)))
    model.add(FC(shape=(3,)))
    x = np.random.default_rng(0).standard_normal((4, 5))
    model.forward(x, training=True)
    dy = np.random.default_rng(1).standard_normal((4, 3))
    dx = model.backward(dy)
    assert np.allclose(dx, dy @ model.layers[1].weights.T, rtol=1e-14, atol=0)


class _ForgetsDx(Layer):
    """A float layer whose backward returns None although its input is differentiable: a contract breach."""

    def build(self, in_shape):
        return in_shape

    def forward(self, x, training=False):
        return x * 2.0

    def backward(self, dy):
        return None


def test_a_layer_that_owes_the_input_gradient_and_returns_none_is_still_refused():
    model = Model(dtype="float64", seed=0)
    model.add(Input(shape=(5,)))
    model.add(_ForgetsDx())
    out = model.forward(np.ones((2, 5)), training=True)
    with pytest.raises(TypeError, match="backward returned None, but the layer before it needs dL/dx"):
        model.backward(np.ones_like(out))
