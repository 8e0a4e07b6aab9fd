"""Every layer, activation and block: backward against central finite differences in float64."""
import numpy as np
import pytest

from gradcheck import assert_gradients
from pydtnn import Model
from pydtnn.activations import LeakyRelu, Relu, Sigmoid, Softmax, Tanh
from pydtnn.layers import (FC, AdditionBlock, AveragePool2D, BatchNormalization, ConcatenationBlock, Conv2D,
                           Dropout, Flatten, Input, MaxPool2D)


def build(backend, in_shape, *layers, seed=0):
    model = Model(backend=backend, dtype="float64", seed=seed)
    model.add(Input(shape=in_shape))
    for layer in layers:
        model.add(layer)
    return model


def batch(shape, n=3, seed=1):
    return np.random.default_rng(seed).standard_normal((n,) + tuple(shape))


CONV_CASES = [
    # (input C,H,W), Conv2D kwargs
    ((3, 7, 9), dict(nfilters=4, filter_shape=(3, 3), padding=1)),
    ((2, 8, 7), dict(nfilters=3, filter_shape=(3, 3), stride=2)),
    ((2, 9, 8), dict(nfilters=3, filter_shape=(3, 3), stride=2, padding=2)),
    ((3, 10, 11), dict(nfilters=2, filter_shape=(3, 3), dilation=2, padding=2)),
    ((2, 11, 9), dict(nfilters=2, filter_shape=(3, 3), dilation=2, stride=2, padding=1)),
    ((1, 5, 6), dict(nfilters=3, filter_shape=(2, 3), stride=(1, 2))),
    ((3, 6, 6), dict(nfilters=5, filter_shape=(5, 5), padding=2, use_bias=False)),
    ((4, 7, 7), dict(grouping="depthwise", filter_shape=(3, 3), padding=1)),
    ((4, 9, 8), dict(grouping="depthwise", filter_shape=(3, 3), stride=2, padding=1, use_bias=False)),
    ((3, 6, 5), dict(nfilters=5, grouping="pointwise")),
    ((3, 7, 7), dict(nfilters=4, filter_shape=(1, 1), stride=2)),
]


@pytest.mark.parametrize("in_shape,kw", CONV_CASES, ids=[str(c[1]) for c in CONV_CASES])
def test_conv2d(in_shape, kw, backend_name):
    model = build(backend_name, in_shape, Conv2D(**kw, weights_initializer="he_normal", biases_initializer="glorot_uniform"
                                   if kw.get("use_bias", True) else "zeros"))
    assert_gradients(model, batch(in_shape))


POOL_CASES = [
    ((2, 6, 8), dict(pool_shape=(2, 2), stride=2)),
    ((2, 7, 9), dict(pool_shape=(3, 3), stride=2, padding=1)),
    ((3, 5, 6), dict(pool_shape=(2, 3), stride=1)),
    ((2, 5, 7), dict(pool_shape=(0, 0))),
]


@pytest.mark.parametrize("pool", [MaxPool2D, AveragePool2D])
@pytest.mark.parametrize("in_shape,kw", POOL_CASES, ids=[str(c[1]) for c in POOL_CASES])
def test_pooling(pool, in_shape, kw, backend_name):
    # random normal inputs have no ties, so max pooling is differentiable at them
    assert_gradients(build(backend_name, in_shape, pool(**kw)), batch(in_shape))


@pytest.mark.parametrize("in_shape", [(3, 5, 4), (7,)])
def test_batchnorm_training(in_shape, backend_name):
    model = build(backend_name, in_shape, BatchNormalization())
    model.layers[1].gamma[...] = model.backend.asarray(np.linspace(0.5, 1.5, in_shape[0]))
    model.layers[1].beta[...] = model.backend.asarray(np.linspace(-1, 1, in_shape[0]))
    assert_gradients(model, batch(in_shape, n=4))


def test_batchnorm_inference(backend_name):
    model = build(backend_name, (3, 4, 4), BatchNormalization())
    bn = model.layers[1]
    bn.mean[...] = model.backend.asarray(np.array([0.1, -0.2, 0.3]))
    bn.var[...] = model.backend.asarray(np.array([0.5, 2.0, 1.5]))
    assert_gradients(model, batch((3, 4, 4)), training=False)


@pytest.mark.parametrize("act", [Relu, LeakyRelu, Sigmoid, Tanh])
@pytest.mark.parametrize("in_shape", [(6,), (2, 3, 5)])
def test_activations(act, in_shape, backend_name):
    assert_gradients(build(backend_name, in_shape, act()), batch(in_shape))


def test_softmax(backend_name):
    assert_gradients(build(backend_name, (6,), Softmax()), batch((6,)))


@pytest.mark.parametrize("use_bias", [True, False])
def test_fc(use_bias, backend_name):
    model = build(backend_name, (7,), FC(shape=(5,), use_bias=use_bias, biases_initializer="glorot_uniform" if use_bias else "zeros"))
    assert_gradients(model, batch((7,)))


def test_fc_activation_shortcut(backend_name):
    model = build(backend_name, (7,), FC(shape=(5,), activation="tanh"), FC(shape=(4,), activation="sigmoid"))
    assert [type(l).__name__ for l in model.layers] == ["Input", "FC", "Tanh", "FC", "Sigmoid"]
    assert_gradients(model, batch((7,)))


def test_flatten_dropout(backend_name):
    model = build(backend_name, (2, 3, 4), Flatten(), Dropout(0.4), FC(shape=(3,)))
    assert_gradients(model, batch((2, 3, 4)))


def test_addition_block_with_identity(backend_name):
    model = build(backend_name, (4, 6, 5), AdditionBlock(
        [Conv2D(nfilters=4, filter_shape=(3, 3), padding=1), BatchNormalization(), Relu()], []))
    assert_gradients(model, batch((4, 6, 5), n=4))


def test_addition_block_projection(backend_name):
    model = build(backend_name, (3, 7, 7), AdditionBlock(
        [Conv2D(nfilters=5, filter_shape=(3, 3), stride=2, padding=1, activation="relu"),
         Conv2D(nfilters=5, filter_shape=(3, 3), padding=1)],
        [Conv2D(nfilters=5, filter_shape=(1, 1), stride=2)]), Relu())
    assert_gradients(model, batch((3, 7, 7)))


def test_concatenation_block(backend_name):
    model = build(backend_name, (3, 6, 7), ConcatenationBlock(
        [Conv2D(nfilters=2, filter_shape=(3, 3), padding=1, activation="relu")],
        [Conv2D(nfilters=4, filter_shape=(1, 1)), MaxPool2D(pool_shape=(3, 3), stride=1, padding=1)],
        []))
    assert model.output_shape == (9, 6, 7)
    assert_gradients(model, batch((3, 6, 7)))


def test_concatenation_of_features(backend_name):
    model = build(backend_name, (5,), ConcatenationBlock([FC(shape=(3,))], [FC(shape=(2,), activation="relu")], []))
    assert model.output_shape == (10,)
    assert_gradients(model, batch((5,)))


def test_nested_blocks_small_cnn(backend_name):
    model = build(backend_name, (2, 9, 9),
                  Conv2D(nfilters=3, filter_shape=(3, 3), padding=1), BatchNormalization(), LeakyRelu(),
                  AdditionBlock([ConcatenationBlock([Conv2D(nfilters=2, filter_shape=(3, 3), padding=1)],
                                                    [Conv2D(nfilters=1, filter_shape=(1, 1))]),
                                 Tanh()], []),
                  MaxPool2D(pool_shape=(2, 2), stride=2), AveragePool2D(pool_shape=(0, 0)), Flatten(),
                  Dropout(0.3), FC(shape=(4,)), Softmax())
    assert_gradients(model, batch((2, 9, 9), n=4))
