"""Model: shape inference, flat buffers, summary, errors, and learning a synthetic problem."""
import numpy as np
import pytest

from pydtnn import Model
from pydtnn.backends import get_backend
from pydtnn.errors import ConfigError, PyDTNNError, ShapeError
from pydtnn.layers import (FC, AdditionBlock, BatchNormalization, Conv2D, Dropout, Flatten, Input, MaxPool2D,
                           AveragePool2D)
from pydtnn.optimizers import SGD, Adam


def small_cnn(dtype="float32", seed=0, nclasses=4):
    model = Model(backend="cpu", dtype=dtype, seed=seed)
    model.add(Input(shape=(1, 12, 12)))
    model.add(Conv2D(nfilters=6, filter_shape=(3, 3), padding=1, activation="relu", weights_initializer="he_uniform"))
    model.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    model.add(AdditionBlock([Conv2D(nfilters=6, filter_shape=(3, 3), padding=1), BatchNormalization()], []))
    model.add(Flatten())
    model.add(Dropout(0.1))
    model.add(FC(shape=(nclasses,), activation="softmax"))
    return model


def test_flat_buffers_are_views():
    model = small_cnn()
    conv = model.layers[1]
    assert model.params.ndim == 1 and model.params.size == model.nparams
    assert np.shares_memory(conv.weights, model.params) and np.shares_memory(conv.dw, model.grads)
    assert conv.weights.shape == (6, 1, 3, 3) and conv.biases.shape == (6,)
    model.params[:] = 0.5
    assert np.all(conv.weights == 0.5)
    offsets = sorted(model.param_offsets.values())
    assert offsets[0][0] == 0 and sum(s for _, s in offsets) == model.nparams


def test_seeded_initialization():
    a, b, c = small_cnn(seed=3), small_cnn(seed=3), small_cnn(seed=4)
    assert np.array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)
    assert np.array_equal(small_cnn("float64", seed=3).params.astype(np.float32), a.params)


def test_summary_lists_layers_and_totals():
    model = small_cnn()
    text = model.summary()
    for word in ["conv2d", "max_pool2d", "addition_block", "batch_normalization", "fc", "softmax",
                 "(6, 1, 3, 3)", f"{model.nparams:,}", "path 1 (identity)"]:
        assert word in text, word
    expected = (6 * 9 + 6) + (6 * 6 * 9 + 6) + 12 + (6 * 36 * 4 + 4)
    assert model.nparams == expected


def test_forward_output_and_training_modes():
    model = small_cnn()
    x = np.random.default_rng(0).standard_normal((5, 1, 12, 12)).astype(np.float32)
    y = model.forward(x)
    assert y.shape == (5, 4) and y.dtype == np.float32
    assert np.allclose(y.sum(axis=1), 1, atol=1e-5)
    assert np.array_equal(model.forward(x), y)            # inference is deterministic (no dropout)


@pytest.mark.parametrize("build,match", [
    (lambda m: m.add(Conv2D(nfilters=2, filter_shape=(3, 3))), "first layer must be Input"),
    (lambda m: (m.add(Input(shape=(1, 4, 4))), m.add(Conv2D(nfilters=2, filter_shape=(5, 5)))),
     r"conv2d.*does not fit the 4x4"),
    (lambda m: (m.add(Input(shape=(1, 4, 4))), m.add(FC(shape=(3,)))), r"layer fc .*Flatten"),
    (lambda m: (m.add(Input(shape=(3, 8, 8))), m.add(AdditionBlock([Conv2D(nfilters=4, filter_shape=(1, 1))], []))),
     r"addition_block.*different shapes"),
    (lambda m: (m.add(Input(shape=(3, 8, 8))), m.add(Conv2D(nfilters=5, grouping="depthwise", filter_shape=(3, 3)))),
     r"depthwise"),
    (lambda m: (m.add(Input(shape=(3, 3, 3))), m.add(MaxPool2D(pool_shape=(4, 4)))), r"max_pool2d.*does not fit"),
    (lambda m: (m.add(Input(shape=(3, 8, 8))), m.add(Conv2D(nfilters=0))), r"conv2d.*nfilters"),
    (lambda m: (m.add(Input(shape=(8,))), m.add(AveragePool2D())), r"average_pool2d.*\(C, H, W\)"),
])
def test_shape_errors_name_the_layer(build, match):
    with pytest.raises(ShapeError, match=match):
        build(Model())


def test_bad_arguments():
    with pytest.raises(ConfigError, match="backend"):
        Model(backend="tpu")
    with pytest.raises(ConfigError, match="float16"):
        Model(dtype="float16")
    with_input = Model()
    with_input.add(Input(shape=(3,)))
    with pytest.raises(ConfigError, match="activation"):
        with_input.add(FC(shape=(2,), activation="swish"))
    with pytest.raises(ConfigError, match="Dropout rate"):
        Dropout(1.5)
    with pytest.raises(ConfigError, match="stride"):
        Conv2D(nfilters=2, stride="two")
    model = Model()
    model.add(Input(shape=(1, 4, 4)))
    with pytest.raises(ShapeError, match="expected"):
        model.forward(np.zeros((2, 1, 5, 5), dtype=np.float32))
    assert issubclass(ShapeError, PyDTNNError)


def learnable_images(n, nclasses=4, seed=0):
    """Each class lights up one quadrant of a 12x12 image, plus noise: learnable, not trivial."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, nclasses, size=n)
    x = rng.normal(0, 0.6, size=(n, 1, 12, 12))
    for k in range(nclasses):
        r, c = divmod(k, 2)
        x[y == k, 0, r * 6:(r + 1) * 6, c * 6:(c + 1) * 6] += 1.0
    return x, y


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_training_learns(dtype):
    x, y = learnable_images(600, seed=1)
    xv, yv = learnable_images(200, seed=2)
    model = small_cnn(dtype)
    before = model.evaluate(xv.astype(dtype), yv)
    history = model.fit(x.astype(dtype), y, epochs=3, batch_size=32, optimizer=SGD(learning_rate=0.05),
                        validation_data=(xv.astype(dtype), yv))
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    assert history["val_categorical_accuracy"][-1] > 0.9 > 0.25 + 0.2     # chance is 0.25
    assert history["val_loss"][-1] < before["loss"]


def test_mlp_with_adam_and_bce():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 6))
    y = np.stack([(x[:, 0] + x[:, 1] > 0), (x[:, 2] > 0.5)], axis=1).astype(float)
    model = Model(dtype="float64", seed=0)
    model.add(Input(shape=(6,)))
    model.add(FC(shape=(16,), activation="relu"))
    model.add(FC(shape=(2,), activation="sigmoid"))
    h = model.fit(x, y, epochs=15, batch_size=20, optimizer=Adam(learning_rate=0.01, beta1=0.9),
                  loss="binary_cross_entropy", metrics=["regression_mae"])
    assert h["loss"][-1] < 0.3 and h["regression_mae"][-1] < 0.2


def test_two_backends_in_one_process():
    a = Model(backend=get_backend("cpu", "float32", 0))
    b = Model(backend="cpu", dtype="float64")
    assert a.backend is not b.backend and a.dtype != b.dtype
