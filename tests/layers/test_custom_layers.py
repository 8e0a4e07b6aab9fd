"""User layers: NCHW on every backend, the public gradient checker, and the examples of docs/custom_layers.md."""
import os
import re

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from pydtnn import Model
from pydtnn.activations import LeakyRelu, Sigmoid, Softmax, Tanh
from pydtnn.layers import (FC, AdditionBlock, AveragePool2D, BatchNormalization, ConcatenationBlock, Conv2D,
                           Dropout, Flatten, Input, Layer, MaxPool2D)
from pydtnn.layers.base import ParamAttr
from pydtnn.testing import check_gradients

from paths import REPO_DIR  # noqa: E402
DOCS = os.path.join(REPO_DIR, "docs", "custom_layers.md")


class PerChannelScale(Layer):
    """Written against NCHW only: channels on axis 1, whatever the backend keeps inside."""
    scale = ParamAttr("scale")
    dscale = ParamAttr("scale", grad=True)

    def build(self, in_shape):
        self.add_weight("scale", (in_shape[0],), initializer="glorot_uniform")   # not ones: dx != dy
        return in_shape

    def forward(self, x, training=False):
        self.seen_shape = tuple(x.shape)
        self.x = x
        return x * self.scale[None, :, None, None]

    def backward(self, dy):
        self.seen_grad_shape = tuple(dy.shape)
        self.dscale[...] = (dy * self.x).sum(axis=(0, 2, 3))
        return dy * self.scale[None, :, None, None]


def conv_reference(x, w, b):
    """NumPy 3x3 convolution, padding 1, stride 1 (NCHW): y, and a function giving (dx, dw, db) from dy."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = sliding_window_view(xp, (3, 3), axis=(2, 3))                   # (N, C, H, W, 3, 3)
    y = np.einsum("nchwij,kcij->nkhw", win, w) + b[None, :, None, None]

    def grads(dy):
        dw = np.einsum("nchwij,nkhw->kcij", win, dy)
        dxp = np.zeros_like(xp)
        h, wd = x.shape[2:]
        for i in range(3):
            for j in range(3):
                dxp[:, :, i:i + h, j:j + wd] += np.einsum("nkhw,kc->nchw", dy, w[:, :, i, j])
        return dxp[:, :, 1:-1, 1:-1], dw, dy.sum(axis=(0, 2, 3))
    return y, grads


def test_nchw_layer_after_conv_matches_numpy(backend_name):
    n, c, h, w, k = 2, 3, 8, 5, 4            # H != W != C, so a wrong axis cannot pass by symmetry
    model = Model(backend=backend_name, dtype="float64", seed=3)
    model.add(Input(shape=(c, h, w)))
    conv = model.add(Conv2D(nfilters=k, filter_shape=(3, 3), padding=1, biases_initializer="glorot_uniform"))
    scale = model.add(PerChannelScale())
    scale.scale[...] = model.backend.asarray(np.array([0.5, -1.5, 2.0, 3.0]))
    assert scale.channel_axis == 1 and conv.channel_axis == model.backend.channel_axis
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((n, c, h, w)), rng.standard_normal((n, k, h, w))
    cw, cb, s = (model.backend.to_numpy(a).copy() for a in (conv.weights, conv.biases, scale.scale))

    out = model.backend.to_numpy(model.forward(x, training=True))
    dx = model.backend.to_numpy(model.backward(model.backend.asarray(dy)))

    conv_out, conv_grads = conv_reference(x, cw, cb)
    assert scale.seen_shape == (n, k, h, w) and scale.seen_grad_shape == (n, k, h, w)
    np.testing.assert_allclose(out, conv_out * s[None, :, None, None], rtol=1e-12, atol=1e-12)
    ref_dx, ref_dw, ref_db = conv_grads(dy * s[None, :, None, None])
    np.testing.assert_allclose(model.backend.to_numpy(scale.dscale), (dy * conv_out).sum(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(model.backend.to_numpy(conv.dw), ref_dw, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.backend.to_numpy(conv.db), ref_db, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-10, atol=1e-12)


def test_nchw_layer_inside_a_block(backend_name):
    """The boundary holds inside block paths too, and check_gradients sees the whole block."""
    block = AdditionBlock([Conv2D(nfilters=3, filter_shape=(3, 3), padding=1), PerChannelScale()], [])
    errors = check_gradients(block, (3, 6, 5), backend=backend_name)
    assert "per_channel_scale/scale" in errors and block.paths[0][1].seen_shape == (2, 3, 6, 5)


BUILTINS = [
    (lambda: Conv2D(nfilters=4, filter_shape=(3, 3), padding=1), (3, 7, 9)),
    (lambda: Conv2D(nfilters=3, filter_shape=(3, 3), stride=2, padding=1), (2, 8, 7)),
    (lambda: Conv2D(grouping="depthwise", filter_shape=(3, 3), padding=1), (4, 7, 7)),
    (lambda: FC(shape=(5,)), (7,)),
    (lambda: BatchNormalization(), (3, 5, 4)),
    (lambda: BatchNormalization(), (6,)),
    (lambda: MaxPool2D(pool_shape=(2, 2), stride=2), (2, 6, 8)),
    (lambda: AveragePool2D(pool_shape=(3, 3), stride=2, padding=1), (2, 7, 9)),
    (lambda: LeakyRelu(), (2, 3, 5)),
    (lambda: Sigmoid(), (2, 3, 5)),
    (lambda: Tanh(), (6,)),
    (lambda: Softmax(), (6,)),
    (lambda: Dropout(0.4), (2, 3, 4)),
    (lambda: Flatten(), (2, 3, 4)),
    (lambda: AdditionBlock([Conv2D(nfilters=3, filter_shape=(3, 3), padding=1), BatchNormalization()], []),
     (3, 6, 5)),
    (lambda: ConcatenationBlock([Conv2D(nfilters=2, filter_shape=(3, 3), padding=1, activation="tanh")], []),
     (3, 6, 5)),
]


@pytest.mark.parametrize("make,shape", BUILTINS, ids=[f"{m().type_name}{s}" for m, s in BUILTINS])
def test_check_gradients_passes_builtins(make, shape, backend_name):
    errors = check_gradients(make(), shape, backend=backend_name)
    assert "x" in errors and all(e <= 1e-6 for e in errors.values())


class WrongInputGradient(PerChannelScale):
    def backward(self, dy):
        super().backward(dy)
        return dy                            # forgets the scale


class WrongWeightGradient(PerChannelScale):
    def backward(self, dy):
        dx = super().backward(dy)
        self.dscale[...] = self.dscale * 1.01  # 1 % off
        return dx


class ModifiesItsInput(Layer):
    def forward(self, x, training=False):
        x *= 2                               # forbidden: the array may be shared
        return x

    def backward(self, dy):
        return 2 * dy


@pytest.mark.parametrize("layer,worst", [(WrongInputGradient, "'x'"),
                                         (WrongWeightGradient, "'wrong_weight_gradient/scale'")])
def test_check_gradients_catches_a_wrong_backward(layer, worst, backend_name):
    with pytest.raises(AssertionError, match=re.escape(f"the gradient of {worst}")):
        check_gradients(layer(), (3, 4, 5), backend=backend_name)


def test_check_gradients_catches_in_place_input_writes(backend_name):
    with pytest.raises(AssertionError, match="modified its input"):
        check_gradients(ModifiesItsInput(), (3, 4, 5), backend=backend_name)


def docs_code():
    text = open(DOCS).read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 4, "docs/custom_layers.md lost its examples"
    return "\n".join(blocks)


def test_docs_examples_run(backend_name):
    code = docs_code()
    assert code.count('backend="cpu"') >= 4
    namespace = {"BACKEND": backend_name}       # a name, or the stand-in's backend object
    exec(compile(code.replace('backend="cpu"', "backend=BACKEND"), DOCS, "exec"), namespace)
    # the documented per-channel scale really scales channels (axis 1), not rows
    layer = namespace["ChannelScale"]()
    model = Model(backend=backend_name, dtype="float64")
    model.add(Input(shape=(3, 8, 5)))
    model.add(layer)
    layer.scale[...] = model.backend.asarray(np.array([1.0, 2.0, 3.0]))
    x = np.ones((2, 3, 8, 5))
    out = model.backend.to_numpy(model.forward(x))
    np.testing.assert_array_equal(out, x * np.array([1.0, 2.0, 3.0])[None, :, None, None])


def test_builtin_layers_opt_out_of_the_boundary():
    """Every built-in layer declares the internal layout, so built-in models never transpose for it."""
    import pydtnn.layers as layers
    builtins = [getattr(layers, n) for n in layers.__all__ if n != "Layer"]
    assert len(builtins) == 26 and all(cls.internal_layout for cls in builtins)
    assert Layer.internal_layout is False


def count_conversions(monkeypatch, with_user_layer):
    model = Model(backend="cpu", dtype="float64")
    model.add(Input(shape=(3, 6, 5)))
    model.add(Conv2D(nfilters=3, filter_shape=(3, 3), padding=1, activation="relu"))
    if with_user_layer:
        model.add(PerChannelScale())
    model.add(Flatten())
    model.add(FC(shape=(2,)))
    calls = []
    for name in ("to_user", "to_internal"):
        real = getattr(model.backend, name)
        monkeypatch.setattr(model.backend, name, lambda a, real=real, name=name: calls.append(name) or real(a))
    model.forward(np.ones((2, 3, 6, 5)), training=True)
    model.backward(model.backend.asarray(np.ones((2, 2))))
    return len(calls)


def test_conversions_happen_only_around_the_user_layer(monkeypatch):
    """On the CPU (NHWC inside) a user layer costs one to_user + one to_internal each way; the built-ins
    convert only at the model's edges (Input and Flatten, each way), as before the boundary existed."""
    builtin_only = count_conversions(monkeypatch, False)
    assert builtin_only == 4
    assert count_conversions(monkeypatch, True) == builtin_only + 4


# --- Composite: layers made of layers -----------------------------------------------------------------
from pydtnn.errors import ConfigError  # noqa: E402
from pydtnn.layers import Composite  # noqa: E402
from pydtnn.activations import Relu  # noqa: E402


class ConvResidual(Composite):
    """y = x + conv2(relu(conv1(x))): 4-D arrays routed between sublayers and added."""

    def __init__(self, channels, name=None):
        super().__init__(name=name)
        self.conv1 = Conv2D(nfilters=channels, filter_shape=(3, 3), padding=1)
        self.relu = Relu()
        self.conv2 = Conv2D(nfilters=channels, filter_shape=(3, 3), padding=1)

    def forward(self, x, training=False):
        return x + super().forward(x, training)

    def backward(self, dy):
        return dy + super().backward(dy)


class ConvResidualNCHW(ConvResidual):
    internal_layout = False


@pytest.mark.parametrize("layer", [ConvResidual, ConvResidualNCHW])
def test_a_composite_of_convolutions_passes_the_gradient_check(layer, backend_name):
    errors = check_gradients(layer(3), (3, 5, 4), backend=backend_name, seed=1)
    assert {"conv2d/weights", "conv2d_1/weights"} <= set(errors)


def test_a_composite_sees_the_same_numbers_in_either_layout():
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 4))
    outs = []
    for layer in (ConvResidual(3), ConvResidualNCHW(3)):
        model = Model(backend="cpu", dtype="float64", seed=0)
        model.add(Input(shape=(3, 5, 4)))
        model.add(layer)
        outs.append(model.forward(x))
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=1e-12)   # same weights, same sums: rounding only


def test_a_composites_weights_are_views_of_the_models_flat_buffer():
    model = Model(backend="cpu", dtype="float64", seed=0)
    model.add(Input(shape=(3, 5, 4)))
    block = model.add(ConvResidual(3))
    assert model.nparams == block.nparams == 2 * (3 * 3 * 3 * 3 + 3)
    params, grads = model.params, model.grads          # packed on first use
    assert np.shares_memory(block.conv1.weights, params) and np.shares_memory(block.conv2.dw, grads)
    lines = model.summary().splitlines()
    assert any(line.startswith("  conv2d_1 ") for line in lines)


class Unbuilt(Composite):
    def __init__(self):
        super().__init__()
        self.a, self.b = FC(shape=(2,)), FC(shape=(2,))

    def build(self, in_shape):
        return self.build_sublayer(self.a, in_shape)


class WithShortcut(Composite):
    def __init__(self):
        super().__init__()
        self.a = FC(shape=(2,), activation="relu")


@pytest.mark.parametrize("layer, needle", [(Unbuilt, "did not build its sublayer(s) FC"),
                                           (WithShortcut, "make the activation a sublayer")])
def test_composite_mistakes_are_config_errors(layer, needle):
    model = Model(backend="cpu")
    model.add(Input(shape=(4,)))
    with pytest.raises(ConfigError, match=re.escape(needle)):
        model.add(layer())
