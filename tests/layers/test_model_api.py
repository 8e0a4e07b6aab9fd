"""Model.predict, Model.save / Model.load (the launcher's NPZ weights format, through pydtnn.weights)."""
import numpy as np
import pytest

from pydtnn import Model
from pydtnn.weights import load_weights, save_weights
from pydtnn.errors import CheckpointError, ConfigError
from pydtnn.layers import FC, BatchNormalization, Conv2D, Flatten, Input


def small_cnn(backend, seed):
    model = Model(backend=backend, dtype="float64", seed=seed)
    model.add(Input(shape=(2, 6, 5)))
    model.add(Conv2D(nfilters=3, filter_shape=(3, 3), padding=1, activation="relu"))
    model.add(BatchNormalization())
    model.add(Flatten())
    model.add(FC(shape=(4,), activation="softmax"))
    return model


def test_predict_batches_like_one_forward(backend_name):
    model = small_cnn(backend_name, 0)
    x = np.random.default_rng(0).standard_normal((7, 2, 6, 5))
    whole = model.backend.to_numpy(model.forward(x, training=False))
    out = model.predict(x, batch_size=3)                       # 3 + 3 + 1
    assert isinstance(out, np.ndarray) and out.shape == (7, 4)
    np.testing.assert_allclose(out, whole, rtol=1e-12)
    with pytest.raises(ConfigError, match="batch_size"):
        model.predict(x, batch_size=0)


def test_save_load_round_trip_and_launcher_format(tmp_path, backend_name):
    source = small_cnn(backend_name, 0)
    source.layers[3].mean[...] = source.backend.asarray(np.arange(3.0))   # running statistics travel too
    path = tmp_path / "w.npz"
    source.save(str(path))
    with np.load(path, allow_pickle=False) as data:                      # plain arrays, no pickle
        assert sorted(data.files) == sorted(source.state_arrays())
    target = small_cnn(backend_name, 1)
    x = np.random.default_rng(2).standard_normal((3, 2, 6, 5))
    assert not np.allclose(target.predict(x), source.predict(x))
    target.load(str(path))
    np.testing.assert_array_equal(target.predict(x), source.predict(x))
    # interchangeable with the launcher's save_weights / load_weights
    save_weights(str(tmp_path / "launcher.npz"), source)
    other = small_cnn(backend_name, 2)
    other.load(str(tmp_path / "launcher.npz"))
    load_weights(str(path), small_cnn(backend_name, 3))
    np.testing.assert_array_equal(other.predict(x), source.predict(x))


def test_load_refuses_another_model(tmp_path):
    small_cnn("cpu", 0).save(str(tmp_path / "w.npz"))
    other = Model(dtype="float64")
    other.add(Input(shape=(4,)))
    other.add(FC(shape=(2,)))
    with pytest.raises(CheckpointError, match="does not match"):
        other.load(str(tmp_path / "w.npz"))
