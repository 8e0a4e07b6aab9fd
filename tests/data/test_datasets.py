"""Dataset layer: loaders (IDX, CIFAR binary, NPZ shards, synthetic), splits, augmentation, downloads.

Every fixture is generated in a tmp dir; the only real data is the MNIST test set in
tests/data/mnist-t10k (see tests/data/README.md). Downloads are tested against a local http.server on 127.0.0.1 (no network).
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import os
import re
import struct
import tarfile
import threading

import numpy as np
import pytest

from pydtnn.datasets import Dataset, Split, load_dataset
from pydtnn.datasets import cifar10, download, imagenet, mnist
from pydtnn.datasets.base import ArraySource, Augmentation, hash_uniform
from pydtnn.errors import ConfigError, DatasetError

from paths import TESTS_DIR  # noqa: E402
MNIST_T10K = os.path.join(TESTS_DIR, "data", "mnist-t10k")      # the real MNIST test set, carried by the repository

# Label counts of the 10,000 MNIST test images (the well-known histogram).
T10K_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


# --------------------------------------------------------------------------------------------------
# fixture writers
# --------------------------------------------------------------------------------------------------
def _idx_bytes(arr: np.ndarray) -> bytes:
    """An independent IDX writer (struct by hand), to check mnist.write_idx and read_idx against."""
    code = {np.dtype(np.uint8): 0x08, np.dtype(np.int16): 0x0B, np.dtype(np.int32): 0x0C}[arr.dtype]
    return (bytes([0, 0, code, arr.ndim]) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
            + arr.astype(arr.dtype.newbyteorder(">")).tobytes())


def _mnist_arrays(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8),
            rng.integers(0, 10, size=n).astype(np.uint8))


def _write_mnist(folder, which, n, seed=0, gz=True):
    os.makedirs(folder, exist_ok=True)
    x, y = _mnist_arrays(n, seed)
    img, lab = mnist.FILES[which]
    ext = ".gz" if gz else ""
    for stem, arr in ((img, x), (lab, y)):
        data = _idx_bytes(arr)
        with open(os.path.join(folder, stem + ext), "wb") as f:
            f.write(gzip.compress(data) if gz else data)
    return x, y


def _write_cifar(folder, n_per_batch=4, n_test=3, seed=0):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for name in cifar10.TRAIN_FILES:
        x = rng.integers(0, 256, size=(n_per_batch, 3, 32, 32), dtype=np.uint8)
        y = rng.integers(0, 10, size=n_per_batch)
        rec = np.concatenate([y.astype(np.uint8)[:, None], x.reshape(n_per_batch, -1)], axis=1)
        rec.tofile(os.path.join(folder, name))
        xs.append(x)
        ys.append(y)
    xt = rng.integers(0, 256, size=(n_test, 3, 32, 32), dtype=np.uint8)
    yt = rng.integers(0, 10, size=n_test)
    cifar10.write_batch(os.path.join(folder, "test_batch.bin"), xt, yt)
    return np.concatenate(xs), np.concatenate(ys), xt, yt


def _write_shards(folder, sizes, shape=(3, 6, 5), nclasses=5, seed=0):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for i, n in enumerate(sizes):
        x = rng.integers(0, 256, size=(n,) + shape, dtype=np.uint8)
        y = rng.integers(1, nclasses + 1, size=n).astype(np.int16)     # 1-based, as upstream
        save = np.savez_compressed if i % 2 else np.savez
        save(os.path.join(folder, f"shard_{i:04d}.npz"), x=x, y=y)
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def _one_line(err) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------------------------------------
# IDX / MNIST
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [True, False])
def test_idx_round_trip(tmp_path, gz):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(7, 5, 4), dtype=np.uint8)
    wide = rng.integers(-3000, 3000, size=(6, 2)).astype(np.int16)
    ext = ".gz" if gz else ""
    p1, p2, p3 = (str(tmp_path / f"{n}{ext}") for n in ("a", "b", "c"))
    mnist.write_idx(p1, images)
    mnist.write_idx(p2, wide)
    with open(p3, "wb") as f:                                   # an independent writer
        f.write(gzip.compress(_idx_bytes(images)) if gz else _idx_bytes(images))
    with open(p1, "rb") as f:
        assert (f.read(2) == b"\x1f\x8b") == gz
    np.testing.assert_array_equal(mnist.read_idx(p1, mnist.IMAGES_MAGIC), images)
    np.testing.assert_array_equal(mnist.read_idx(p3, mnist.IMAGES_MAGIC), images)
    back = mnist.read_idx(p2)
    assert back.dtype == np.int16 and back.dtype.isnative
    np.testing.assert_array_equal(back, wide)


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_generated_folder(tmp_path, gz):
    xtr, ytr = _write_mnist(str(tmp_path), "train", 30, seed=1, gz=gz)
    xte, yte = _write_mnist(str(tmp_path), "test", 12, seed=2, gz=gz)
    ds = load_dataset("mnist", train_path=str(tmp_path), normalize=False)
    assert isinstance(ds, Dataset) and isinstance(ds.train, Split)
    assert ds.name == "mnist" and ds.input_shape == (1, 28, 28) and ds.nclasses == 10
    assert len(ds.train) == 30 and len(ds.test) == 12 and ds.val is None
    x, y = ds.train.take(np.arange(30))
    assert x.dtype == np.float32 and y.dtype == np.int64 and x.shape == (30, 1, 28, 28)
    np.testing.assert_allclose(x[:, 0], xtr / 255.0, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(y, ytr)
    xt, yt = ds.test.take([11, 0, 5])
    np.testing.assert_allclose(xt[:, 0], xte[[11, 0, 5]] / 255.0, atol=1e-6)
    np.testing.assert_array_equal(yt, yte[[11, 0, 5]])
    # Normalized: (x/255 - 0.1307) / 0.3081
    xn, _ = load_dataset("mnist", train_path=str(tmp_path)).train.take([3])
    np.testing.assert_allclose(xn[0, 0], (xtr[3] / 255.0 - 0.1307) / 0.3081, rtol=1e-5, atol=1e-5)


def test_real_mnist_t10k_loads():
    ds = load_dataset("mnist", train_path=MNIST_T10K)
    assert len(ds.train) == 10_000 and ds.input_shape == (1, 28, 28)
    assert ds.test is None and ds.val is None               # the t10k pair is the pool
    x, y = ds.train.take(np.arange(10_000))
    assert x.shape == (10_000, 1, 28, 28) and x.dtype == np.float32
    assert y.min() == 0 and y.max() == 9
    assert np.bincount(y, minlength=10).tolist() == T10K_COUNTS
    assert np.isfinite(x).all()
    # Standardized with the training-set constants: the test set is close to mean 0, std 1.
    assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1.0) < 0.05
    raw, _ = load_dataset("mnist", train_path=MNIST_T10K, normalize=False).train.take(np.arange(100))
    assert raw.min() == 0.0 and raw.max() == 1.0


def test_real_mnist_pool_carves_last_fifth_as_validation():
    full = load_dataset("mnist", train_path=MNIST_T10K, normalize=False)
    ds = load_dataset("mnist", train_path=MNIST_T10K, validation_split=0.2, normalize=False)
    assert (len(ds.train), len(ds.val)) == (8_000, 2_000) and ds.test is None
    xv, yv = ds.val.take(np.arange(2_000))
    xf, yf = full.train.take(np.arange(8_000, 10_000))
    np.testing.assert_array_equal(xv, xf)
    np.testing.assert_array_equal(yv, yf)
    xt, _ = ds.train.take([0, 7_999])
    np.testing.assert_array_equal(xt, full.train.take([0, 7_999])[0])
    with pytest.raises(IndexError):
        ds.train.take([8_000])
    with pytest.raises(ConfigError) as err:
        load_dataset("mnist", train_path=MNIST_T10K, test_as_validation=True)
    assert "validation_split" in _one_line(err)


def test_mnist_test_as_validation(tmp_path):
    _write_mnist(str(tmp_path), "train", 20)
    _write_mnist(str(tmp_path), "test", 6, seed=3)
    ds = load_dataset("mnist", train_path=str(tmp_path), test_as_validation=True)
    assert ds.val is ds.test and len(ds.val) == 6 and len(ds.train) == 20
    other = tmp_path / "other"
    _write_mnist(str(other), "test", 4, seed=4)
    ds2 = load_dataset("mnist", train_path=str(tmp_path), test_path=str(other))
    assert len(ds2.test) == 4


def _truncate(path, keep):
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:keep] if keep >= 0 else data[:len(data) + keep])


def _corrupt_gzip_middle(path):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xA5
    with open(path, "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize("case", ["truncated_gz", "truncated_raw", "corrupt_gz", "bad_magic",
                                  "count_mismatch", "missing_labels", "label_range", "trailing_bytes"])
def test_mnist_bad_files_raise_dataset_error(tmp_path, case):
    gz = case in ("truncated_gz", "corrupt_gz")
    _write_mnist(str(tmp_path), "train", 40, gz=gz)
    ext = ".gz" if gz else ""
    img = str(tmp_path / ("train-images-idx3-ubyte" + ext))
    lab = str(tmp_path / ("train-labels-idx1-ubyte" + ext))
    culprit = img
    if case == "truncated_gz":
        _truncate(img, -200)
    elif case == "truncated_raw":
        _truncate(img, -1)
    elif case == "corrupt_gz":
        _corrupt_gzip_middle(img)
    elif case == "bad_magic":
        with open(img, "r+b") as f:
            f.write(struct.pack(">I", 0x00000801))             # a labels magic on the images file
    elif case == "count_mismatch":
        with open(lab, "wb") as f:
            f.write(_idx_bytes(np.zeros(39, dtype=np.uint8)))
        culprit = lab
    elif case == "missing_labels":
        os.remove(lab)
        culprit = lab
    elif case == "label_range":
        with open(lab, "wb") as f:
            f.write(_idx_bytes(np.full(40, 10, dtype=np.uint8)))
        culprit = lab
    elif case == "trailing_bytes":
        with open(img, "ab") as f:
            f.write(b"\0\0\0")
    with pytest.raises(DatasetError) as err:
        load_dataset("mnist", train_path=str(tmp_path))
    msg = _one_line(err)
    assert os.path.basename(culprit) in msg, msg


def test_mnist_missing_folder_and_files(tmp_path, monkeypatch):
    with pytest.raises(DatasetError) as err:
        load_dataset("mnist", train_path=str(tmp_path / "nope"))
    assert "nope" in _one_line(err)
    with pytest.raises(DatasetError) as err:
        load_dataset("mnist", train_path=str(tmp_path))           # empty folder
    assert "train-images-idx3-ubyte" in _one_line(err)
    _write_mnist(str(tmp_path), "train", 5)
    with pytest.raises(DatasetError) as err:                      # explicit test folder without files
        load_dataset("mnist", train_path=str(tmp_path), test_path=str(tmp_path))
    assert "t10k-images-idx3-ubyte" in _one_line(err)
    # No path and nothing in the cache: says how to get the data.
    monkeypatch.setenv("PYDTNN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DatasetError) as err:
        load_dataset("mnist")
    assert "download" in _one_line(err)


# --------------------------------------------------------------------------------------------------
# CIFAR-10
# --------------------------------------------------------------------------------------------------
def test_cifar10_binary_fixture(tmp_path):
    xtr, ytr, xte, yte = _write_cifar(str(tmp_path / "cifar-10-batches-bin"))
    for folder in (tmp_path, tmp_path / "cifar-10-batches-bin"):   # parent or the batches folder
        ds = load_dataset("cifar10", train_path=str(folder), normalize=False)
        assert ds.input_shape == (3, 32, 32) and ds.nclasses == 10
        assert len(ds.train) == 20 and len(ds.test) == 3
        x, y = ds.train.take(np.arange(20))
        np.testing.assert_allclose(x, xtr / 255.0, atol=1e-6)
        np.testing.assert_array_equal(y, ytr)
        xt, yt = ds.test.take(np.arange(3))
        np.testing.assert_allclose(xt, xte / 255.0, atol=1e-6)
        np.testing.assert_array_equal(yt, yte)
    ds = load_dataset("cifar10", train_path=str(tmp_path), validation_split=0.25)
    assert (len(ds.train), len(ds.val)) == (15, 5)
    x, _ = ds.val.take([0])
    mean = np.array([0.4914, 0.4822, 0.4465])[:, None, None]
    std = np.array([0.2470, 0.2435, 0.2616])[:, None, None]
    np.testing.assert_allclose(x[0], (xtr[15] / 255.0 - mean) / std, rtol=1e-5, atol=1e-5)
    assert ds.train.source.x.dtype == np.uint8               # raw bytes in memory, float per batch


@pytest.mark.parametrize("case", ["truncated", "label", "missing"])
def test_cifar10_bad_files(tmp_path, case):
    _write_cifar(str(tmp_path))
    path = tmp_path / "data_batch_3.bin"
    if case == "truncated":
        _truncate(str(path), -100)
    elif case == "label":
        data = bytearray(path.read_bytes())
        data[cifar10.RECORD] = 12                                  # label byte of record 1
        path.write_bytes(bytes(data))
    else:
        path.unlink()
    with pytest.raises(DatasetError) as err:
        load_dataset("cifar10", train_path=str(tmp_path))
    assert "data_batch_3.bin" in _one_line(err)


# --------------------------------------------------------------------------------------------------
# ImageNet NPZ shards
# --------------------------------------------------------------------------------------------------
def test_imagenet_shards_load_and_relabel(tmp_path):
    x_all, y_all = _write_shards(str(tmp_path / "train"), [5, 7, 4])
    xt_all, yt_all = _write_shards(str(tmp_path / "test"), [3, 2], seed=9)
    ds = load_dataset("imagenet", train_path=str(tmp_path / "train"), test_path=str(tmp_path / "test"),
                      nclasses=5, normalize=False)
    assert ds.input_shape == (3, 6, 5) and ds.nclasses == 5
    assert len(ds.train) == 16 and len(ds.test) == 5
    idx = np.array([15, 0, 6, 5, 11, 12, 4])
    x, y = ds.train.take(idx)
    np.testing.assert_allclose(x, x_all[idx] / 255.0, atol=1e-6)
    np.testing.assert_array_equal(y, y_all[idx].astype(np.int64) - 1)    # 1-based -> 0-based
    assert y.min() >= 0 and y.max() <= 4
    xt, yt = ds.test.take(np.arange(5))
    np.testing.assert_array_equal(yt, yt_all - 1)
    np.testing.assert_allclose(xt, xt_all / 255.0, atol=1e-6)
    # Normalized with the ImageNet constants.
    xn, _ = load_dataset("imagenet", train_path=str(tmp_path / "train"), nclasses=5).train.take([2])
    mean = np.array([0.485, 0.456, 0.406])[:, None, None]
    std = np.array([0.229, 0.224, 0.225])[:, None, None]
    np.testing.assert_allclose(xn[0], (x_all[2] / 255.0 - mean) / std, rtol=1e-5, atol=1e-5)


def test_imagenet_index_reads_headers_only(tmp_path, monkeypatch):
    _write_shards(str(tmp_path), [5, 7, 4])
    calls = []
    real_load = np.load
    monkeypatch.setattr(np, "load", lambda *a, **k: calls.append(a) or real_load(*a, **k))
    src = imagenet.ShardSource(str(tmp_path), nclasses=5)
    assert calls == [] and src.loads == 0 and len(src) == 16
    assert src.offsets.tolist() == [0, 5, 12, 16]


def _runs(seq):
    """Values of seq with consecutive repeats collapsed."""
    seq = list(seq)
    return [v for i, v in enumerate(seq) if i == 0 or seq[i - 1] != v]


def test_imagenet_shard_blocked_order_and_streaming(tmp_path):
    sizes = [5, 7, 4]
    _write_shards(str(tmp_path), sizes)
    ds = load_dataset("imagenet", train_path=str(tmp_path), nclasses=5)
    src = ds.train.source
    offsets = np.array([0, 5, 12, 16])
    orders = set()
    for epoch in range(6):
        order = ds.train.epoch_order(seed=3, epoch=epoch)
        assert order.dtype == np.int64 and sorted(order.tolist()) == list(range(16))
        shard_of = np.searchsorted(offsets, order, side="right") - 1
        runs = _runs(shard_of)
        assert sorted(runs) == [0, 1, 2]                  # each shard visited in one contiguous run
        orders.add(tuple(order))
        np.testing.assert_array_equal(order, ds.train.epoch_order(seed=3, epoch=epoch))
        # Streaming an epoch in batches of 3 reads each shard exactly once, keeping <= 2 in memory.
        before = src.loads
        for s in range(0, 16, 3):
            ds.train.take(order[s:s + 3], epoch=epoch)
            assert len(src._cache) <= 2
        assert src.loads - before == 3
        src._cache.clear()
    assert len(orders) > 1                                # epochs differ


def test_imagenet_validation_split_across_shards(tmp_path):
    x_all, y_all = _write_shards(str(tmp_path), [5, 7, 4])
    ds = load_dataset("imagenet", train_path=str(tmp_path), nclasses=5, validation_split=0.25,
                      normalize=False)
    assert (len(ds.train), len(ds.val)) == (12, 4)
    xv, yv = ds.val.take(np.arange(4))
    np.testing.assert_allclose(xv, x_all[12:] / 255.0, atol=1e-6)
    order = ds.train.epoch_order(0, 0)
    assert sorted(order.tolist()) == list(range(12))
    assert sorted(_runs(np.searchsorted([0, 5, 12], order, side="right") - 1)) == [0, 1]


@pytest.mark.parametrize("case", ["truncated", "label0", "pickle", "no_y", "not_zip"])
def test_imagenet_bad_shards(tmp_path, case):
    _write_shards(str(tmp_path), [5, 7, 4])
    bad = tmp_path / "shard_0001.npz"
    if case == "truncated":
        _truncate(str(bad), -300)
    elif case == "label0":
        np.savez(bad, x=np.zeros((7, 3, 6, 5), np.uint8), y=np.zeros(7, np.int16))   # 0 is not 1-based
    elif case == "pickle":
        np.savez(bad, x=np.zeros((7, 3, 6, 5), np.uint8), y=np.array([1] * 7, dtype=object))
    elif case == "no_y":
        np.savez(bad, x=np.zeros((7, 3, 6, 5), np.uint8))
    else:
        bad.write_bytes(b"this is not a zip archive at all")
    with pytest.raises(DatasetError) as err:
        ds = load_dataset("imagenet", train_path=str(tmp_path), nclasses=5)
        ds.train.take(np.arange(16))
    assert "shard_0001.npz" in _one_line(err)


def test_imagenet_empty_folder_and_missing_path(tmp_path):
    with pytest.raises(DatasetError) as err:
        load_dataset("imagenet", train_path=str(tmp_path))
    assert str(tmp_path) in _one_line(err)
    with pytest.raises(ConfigError):
        load_dataset("imagenet")


# --------------------------------------------------------------------------------------------------
# synthetic
# --------------------------------------------------------------------------------------------------
def test_synthetic_deterministic():
    a = load_dataset("synthetic", input_shape=(3, 12, 10), nclasses=7, synthetic_samples=200, seed=5)
    b = load_dataset("synthetic", input_shape=(3, 12, 10), nclasses=7, synthetic_samples=200, seed=5)
    c = load_dataset("synthetic", input_shape=(3, 12, 10), nclasses=7, synthetic_samples=200, seed=6)
    assert a.input_shape == (3, 12, 10) and a.nclasses == 7 and len(a.train) == 200 and len(a.test) == 40
    xa, ya = a.train.take(np.arange(200))
    xb, yb = b.train.take(np.arange(200))
    xc, _ = c.train.take(np.arange(200))
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(xa, xc)
    assert np.bincount(ya, minlength=7).min() >= 200 // 7       # balanced
    d = load_dataset("synthetic")
    assert d.input_shape == (1, 28, 28) and d.nclasses == 10


@pytest.mark.parametrize("shape,k", [((1, 28, 28), 10), ((3, 8, 8), 20)])
def test_synthetic_is_learnable(shape, k):
    ds = load_dataset("synthetic", input_shape=shape, nclasses=k, synthetic_samples=2000, seed=1)
    x, y = ds.train.take(np.arange(len(ds.train)))
    xt, yt = ds.test.take(np.arange(len(ds.test)))
    a = np.c_[x.reshape(len(x), -1), np.ones(len(x))].astype(np.float64)
    at = np.c_[xt.reshape(len(xt), -1), np.ones(len(xt))]
    w = np.linalg.solve(a.T @ a + 10.0 * np.eye(a.shape[1]), a.T @ np.eye(k)[y])   # ridge regression
    acc = float(np.mean(np.argmax(at @ w, axis=1) == yt))
    assert acc > 0.8, acc                                       # chance is 1/k (0.1, 0.05)
    # Not a constant task either: a single class-mean template is not the whole story per sample.
    assert float(x.std()) > 0.5


# --------------------------------------------------------------------------------------------------
# augmentation
# --------------------------------------------------------------------------------------------------
def _asym_split(n=16, shape=(2, 6, 9), **aug):
    rng = np.random.default_rng(0)
    x = rng.integers(1, 256, size=(n,) + shape, dtype=np.uint8)
    src = ArraySource(x, np.arange(n) % 3)
    return Split(src, nclasses=3, augmentation=Augmentation(seed=4, **aug)), x


def test_flip_mirrors_width_axis():
    split, x = _asym_split(flip=True, flip_prob=1.0)
    idx = np.arange(16)
    plain, _ = split.take(idx)                          # no epoch: no augmentation
    np.testing.assert_allclose(plain, x / 255.0, atol=1e-6)
    flipped, _ = split.take(idx, epoch=0)
    np.testing.assert_array_equal(flipped, plain[..., ::-1])      # width (last axis), not height
    assert not np.array_equal(flipped, plain[:, :, ::-1, :])
    never, _ = Split(split.source, nclasses=3,
                     augmentation=Augmentation(flip=True, flip_prob=0.0)).take(idx, epoch=0)
    np.testing.assert_array_equal(never, plain)


def test_flip_probability_and_epoch_dependence():
    u0 = hash_uniform(0, 0, 1, np.arange(20_000))
    u1 = hash_uniform(0, 1, 1, np.arange(20_000))
    assert abs(float(np.mean(u0 < 0.5)) - 0.5) < 0.02 and 0.0 <= u0.min() and u0.max() < 1.0
    assert abs(float(np.mean(u0 < 0.2)) - 0.2) < 0.02
    assert 0.4 < float(np.mean((u0 < 0.5) == (u1 < 0.5))) < 0.6      # independent across epochs
    split, _ = _asym_split(n=64, flip=True, flip_prob=0.5)
    plain, _ = split.take(np.arange(64))
    e0, _ = split.take(np.arange(64), epoch=0)
    e1, _ = split.take(np.arange(64), epoch=1)
    f0 = np.all(e0 == plain[..., ::-1], axis=(1, 2, 3))
    kept0 = np.all(e0 == plain, axis=(1, 2, 3))
    assert np.all(f0 | kept0) and 10 < f0.sum() < 54
    assert not np.array_equal(e0, e1)


def test_crop_keeps_shape_and_window():
    n, shape, cs = 12, (3, 10, 8), 5
    src = ArraySource(np.full((n,) + shape, 200, dtype=np.uint8), np.zeros(n, np.int64))
    split = Split(src, nclasses=1, augmentation=Augmentation(seed=1, crop=True, crop_size=cs, crop_prob=1.0))
    x, _ = split.take(np.arange(n), epoch=2)
    assert x.shape == (n,) + shape and x.dtype == np.float32
    tops = set()
    for i in range(n):
        nz = x[i] != 0
        assert np.all(nz == nz[0])                           # same window on every channel
        rows, cols = np.flatnonzero(nz[0].any(1)), np.flatnonzero(nz[0].any(0))
        assert len(rows) == cs and len(cols) == cs and nz[0].sum() == cs * cs
        assert rows[-1] - rows[0] == cs - 1 and cols[-1] - cols[0] == cs - 1
        np.testing.assert_allclose(x[i][nz], 200 / 255.0, rtol=1e-6)
        tops.add((rows[0], cols[0]))
    assert len(tops) > 1                                     # the window moves
    ds = load_dataset("synthetic", input_shape=(3, 32, 32), synthetic_samples=64, crop_images=True,
                      crop_images_size=16, crop_images_prob=0.5)
    xa, _ = ds.train.take(np.arange(64), epoch=0)
    assert xa.shape == (64, 3, 32, 32)
    with pytest.raises(ConfigError):
        load_dataset("synthetic", input_shape=(1, 8, 8), synthetic_samples=8, crop_images=True,
                     crop_images_size=9)


def test_augmentation_independent_of_rank_split():
    ds = load_dataset("synthetic", input_shape=(3, 16, 16), nclasses=4, synthetic_samples=300, seed=2,
                      flip_images=True, crop_images=True, crop_images_size=10)
    order = ds.train.epoch_order(seed=2, epoch=3)
    idx = order[:96]
    whole_x, whole_y = ds.train.take(idx, epoch=3)
    for a in (1, 17, 48, 95):
        (x1, y1), (x2, y2) = ds.train.take(idx[:a], epoch=3), ds.train.take(idx[a:], epoch=3)
        np.testing.assert_array_equal(whole_x, np.concatenate([x1, x2]))
        np.testing.assert_array_equal(whole_y, np.concatenate([y1, y2]))
    # Three uneven "replicas" as well, and a sample keeps its augmentation wherever it sits.
    parts = [ds.train.take(p, epoch=3)[0] for p in np.split(idx, [10, 70])]
    np.testing.assert_array_equal(whole_x, np.concatenate(parts))
    np.testing.assert_array_equal(ds.train.take(idx[::-1], epoch=3)[0], whole_x[::-1])
    assert not np.array_equal(ds.train.take(idx, epoch=4)[0], whole_x)


def test_no_augmentation_on_val_and_test():
    ds = load_dataset("synthetic", synthetic_samples=100, validation_split=0.2, flip_images=True,
                      flip_images_prob=1.0)
    assert ds.val.augmentation is None and ds.test.augmentation is None
    np.testing.assert_array_equal(ds.val.take(np.arange(20), epoch=1)[0], ds.val.take(np.arange(20))[0])
    np.testing.assert_array_equal(ds.test.take(np.arange(20), epoch=1)[0], ds.test.take(np.arange(20))[0])
    assert ds.train.augmentation is not None


# --------------------------------------------------------------------------------------------------
# epoch order and options
# --------------------------------------------------------------------------------------------------
def test_epoch_order():
    ds = load_dataset("synthetic", synthetic_samples=500)
    o = ds.train.epoch_order(seed=7, epoch=2)
    assert o.dtype == np.int64 and sorted(o.tolist()) == list(range(500))
    np.testing.assert_array_equal(o, ds.train.epoch_order(seed=7, epoch=2))
    np.testing.assert_array_equal(o, np.random.default_rng([7, 2]).permutation(500))
    assert not np.array_equal(o, ds.train.epoch_order(seed=7, epoch=3))
    assert not np.array_equal(o, ds.train.epoch_order(seed=8, epoch=2))


def test_validation_split_is_last_fraction():
    full = load_dataset("synthetic", synthetic_samples=100, seed=3)
    ds = load_dataset("synthetic", synthetic_samples=100, seed=3, validation_split=0.3)
    assert (len(ds.train), len(ds.val)) == (70, 30)
    np.testing.assert_array_equal(ds.val.take(np.arange(30))[0], full.train.take(np.arange(70, 100))[0])
    np.testing.assert_array_equal(ds.train.take(np.arange(70))[1], full.train.take(np.arange(70))[1])


@pytest.mark.parametrize("kwargs", [
    dict(validation_split=1.0), dict(validation_split=-0.1), dict(validation_split=0.2, test_as_validation=True),
    dict(flip_images_prob=1.5), dict(crop_images=True, crop_images_size=0), dict(validation_split="x"),
])
def test_bad_options_raise_config_error(kwargs):
    with pytest.raises(ConfigError) as err:
        load_dataset("synthetic", synthetic_samples=10, **kwargs)
    assert _one_line(err)


def test_bad_name_and_shape_checks(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_dataset("imagenette")
    assert "mnist" in _one_line(err)
    _write_mnist(str(tmp_path), "train", 5)
    with pytest.raises(ConfigError):
        load_dataset("mnist", train_path=str(tmp_path), nclasses=100)
    with pytest.raises(ConfigError):
        load_dataset("mnist", train_path=str(tmp_path), input_shape=(3, 32, 32))
    ds = load_dataset("mnist", train_path=str(tmp_path), input_shape=(1, 28, 28), nclasses=10)
    assert len(ds.train) == 5


# --------------------------------------------------------------------------------------------------
# downloads, against a local HTTP server
# --------------------------------------------------------------------------------------------------
class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves server.files; Range support and connection drops are switched on the server object."""

    def do_GET(self):
        srv = self.server
        rng = self.headers.get("Range")
        with srv.lock:
            srv.log.append((self.path, rng))
            drop = srv.drops > 0
            srv.drops -= drop
        data = srv.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        start = 0
        m = re.fullmatch(r"bytes=(\d+)-", rng or "")
        if m and srv.ranges:
            start = int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if drop:                                   # send half, then hang up
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server(monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    started = []

    def start(files, ranges=True, drops=0):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        srv.daemon_threads = True
        srv.files, srv.ranges, srv.drops, srv.log, srv.lock = dict(files), ranges, drops, [], threading.Lock()
        thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        started.append((srv, thread))
        return srv, f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv, thread in started:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


PAYLOAD = np.random.default_rng(0).integers(0, 256, size=300_000, dtype=np.uint8).tobytes()
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


def test_fetch_plain(tmp_path, http_server):
    srv, base = http_server({"/f.bin": PAYLOAD})
    dest = tmp_path / "sub" / "f.bin"
    assert download.fetch(base + "/f.bin", str(dest), sha256=PAYLOAD_SHA, progress=False) == str(dest)
    assert dest.read_bytes() == PAYLOAD and not os.path.exists(str(dest) + ".part")
    assert srv.log == [("/f.bin", None)]


def test_fetch_resumes_part_file_with_range(tmp_path, http_server):
    srv, base = http_server({"/f.bin": PAYLOAD})
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(PAYLOAD[:123_456])
    download.fetch(base + "/f.bin", str(dest), sha256=PAYLOAD_SHA, progress=False)
    assert dest.read_bytes() == PAYLOAD
    assert srv.log == [("/f.bin", "bytes=123456-")]


def test_fetch_without_range_support_restarts(tmp_path, http_server):
    srv, base = http_server({"/f.bin": PAYLOAD}, ranges=False)
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(b"stale bytes that must not survive")
    download.fetch(base + "/f.bin", str(dest), sha256=PAYLOAD_SHA, progress=False)
    assert dest.read_bytes() == PAYLOAD                 # the 200 answer replaced the part file
    assert srv.log[0][1] is not None and len(srv.log) == 1


def test_fetch_dropped_connection_then_resume(tmp_path, http_server):
    srv, base = http_server({"/f.bin": PAYLOAD}, drops=1)
    dest = tmp_path / "f.bin"
    part = tmp_path / "f.bin.part"
    with pytest.raises(DatasetError) as err:
        download.fetch(base + "/f.bin", str(dest), sha256=PAYLOAD_SHA, progress=False, retries=0)
    assert "f.bin" in _one_line(err)
    assert not dest.exists()                            # atomic: no final file after a failure
    assert part.stat().st_size == len(PAYLOAD) // 2     # the part is kept for a resume
    download.fetch(base + "/f.bin", str(dest), sha256=PAYLOAD_SHA, progress=False)
    assert dest.read_bytes() == PAYLOAD and not part.exists()
    assert srv.log == [("/f.bin", None), ("/f.bin", f"bytes={len(PAYLOAD) // 2}-")]


def test_fetch_retries_resume_automatically(tmp_path, http_server):
    srv, base = http_server({"/f.bin": PAYLOAD}, drops=2)
    dest = tmp_path / "f.bin"
    download.fetch(base + "/f.bin", str(dest), sha256=PAYLOAD_SHA, progress=False, retries=3)
    assert dest.read_bytes() == PAYLOAD
    assert [r for _, r in srv.log] == [None, f"bytes={len(PAYLOAD) // 2}-",
                                       f"bytes={len(PAYLOAD) // 2 + (len(PAYLOAD) - len(PAYLOAD) // 2) // 2}-"]


def test_fetch_dropped_without_range_support(tmp_path, http_server):
    srv, base = http_server({"/f.bin": PAYLOAD}, ranges=False, drops=1)
    dest = tmp_path / "f.bin"
    download.fetch(base + "/f.bin", str(dest), sha256=PAYLOAD_SHA, progress=False, retries=1)
    assert dest.read_bytes() == PAYLOAD and len(srv.log) == 2


def test_fetch_checksum_mismatch_removes_part(tmp_path, http_server):
    _, base = http_server({"/f.bin": PAYLOAD})
    dest = tmp_path / "f.bin"
    with pytest.raises(DatasetError) as err:
        download.fetch(base + "/f.bin", str(dest), sha256="0" * 64, progress=False)
    msg = _one_line(err)
    assert "checksum" in msg and "f.bin" in msg
    assert not dest.exists() and not os.path.exists(str(dest) + ".part")


def test_fetch_complete_part_and_http_errors(tmp_path, http_server):
    srv, base = http_server({"/f.bin": PAYLOAD})
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(PAYLOAD)          # finished earlier, not yet renamed: 416
    download.fetch(base + "/f.bin", str(dest), sha256=PAYLOAD_SHA, progress=False)
    assert dest.read_bytes() == PAYLOAD and srv.log == [("/f.bin", f"bytes={len(PAYLOAD)}-")]
    with pytest.raises(DatasetError) as err:
        download.fetch(base + "/missing.bin", str(tmp_path / "m.bin"), progress=False)
    assert "404" in _one_line(err)
    assert not (tmp_path / "m.bin").exists()


def test_download_mnist_into_cache_with_mirror_fallback(tmp_path, http_server, monkeypatch):
    files, sums = {}, {}
    for which, n in (("train", 20), ("test", 8)):
        x, y = _mnist_arrays(n, seed=len(files))
        for stem, arr in zip(mnist.FILES[which], (x, y)):
            data = gzip.compress(_idx_bytes(arr))
            files[f"/good/{stem}.gz"] = data
            sums[f"{stem}.gz"] = hashlib.sha256(data).hexdigest()
    srv, base = http_server(files)
    monkeypatch.setattr(download, "MNIST_MIRRORS", [base + "/broken/", base + "/good/"])
    monkeypatch.setattr(download, "MNIST_SHA256", sums)
    monkeypatch.setenv("PYDTNN_CACHE", str(tmp_path / "cache"))
    assert download.default_cache_dir() == str(tmp_path / "cache")
    ds = load_dataset("mnist", download=True)
    assert len(ds.train) == 20 and len(ds.test) == 8
    assert sorted(os.listdir(tmp_path / "cache" / "mnist")) == sorted(sums)
    n_requests = len(srv.log)
    assert n_requests == 8                                   # 4 x (404 on the broken mirror, then 200)
    ds2 = load_dataset("mnist", download=True)               # already cached: no request
    assert len(srv.log) == n_requests and len(ds2.train) == 20
    monkeypatch.setenv("PYDTNN_CACHE", str(tmp_path / "other"))
    ds3 = load_dataset("mnist", download=True, cache_dir=str(tmp_path / "cache"))
    assert len(srv.log) == n_requests and len(ds3.test) == 8


def test_download_cifar10_archive_extracts_only_batches(tmp_path, http_server, monkeypatch):
    src = tmp_path / "src"
    xtr, ytr, _, _ = _write_cifar(str(src / "cifar-10-batches-bin"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in sorted(os.listdir(src / "cifar-10-batches-bin")):
            tar.add(str(src / "cifar-10-batches-bin" / name), arcname=f"cifar-10-batches-bin/{name}")
        evil = tarfile.TarInfo("../evil.txt")
        evil.size = 4
        tar.addfile(evil, io.BytesIO(b"evil"))
    data = buf.getvalue()
    srv, base = http_server({"/cifar.tgz": data})
    monkeypatch.setattr(download, "CIFAR10_URLS", [base + "/cifar.tgz"])
    monkeypatch.setattr(download, "CIFAR10_SHA256", hashlib.sha256(data).hexdigest())
    cache = tmp_path / "cache"
    ds = load_dataset("cifar10", download=True, cache_dir=str(cache), normalize=False)
    assert len(ds.train) == 20 and len(ds.test) == 3
    np.testing.assert_array_equal(ds.train.take(np.arange(20))[1], ytr)
    assert not (tmp_path / "evil.txt").exists() and not (cache / "evil.txt").exists()
    assert len(srv.log) == 1
    load_dataset("cifar10", download=True, cache_dir=str(cache))
    assert len(srv.log) == 1
    with pytest.raises(ConfigError):
        download.download_dataset("imagenet", str(cache))
