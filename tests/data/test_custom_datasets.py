"""--dataset FILE.py and pydtnn.datasets.from_arrays: a researcher's own data, memory-mapped or not."""
import textwrap

import numpy as np
import pytest

from pydtnn.datasets import ArraySplit, Dataset, from_arrays, load_dataset
from pydtnn.errors import ConfigError, DatasetError
from pydtnn.plugins import USER_FRAMES

from mpi_helpers import REPO_ROOT, describe, output_of_our_processes, run_mpi  # noqa: E402

LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"


class RowRecorder:
    """An array-like that records every index it is asked for: reading it whole would show."""

    def __init__(self, a):
        self.a, self.shape, self.dtype, self.asked = a, a.shape, a.dtype, []

    def __len__(self):
        return len(self.a)

    def __getitem__(self, index):
        self.asked.append(np.array(index, copy=True))
        return self.a[index]


def test_a_batch_reads_only_its_rows_and_comes_back_in_the_asked_order():
    x = np.arange(40 * 3, dtype=np.float64).reshape(40, 3)
    y = np.arange(40) % 4
    rec = RowRecorder(x)
    ds = from_arrays(rec, y)
    xb, yb = ds.train.take([7, 2, 30])
    assert xb.dtype == np.float64 and yb.dtype == np.int64          # floats keep their precision
    np.testing.assert_array_equal(xb, x[[7, 2, 30]])
    np.testing.assert_array_equal(yb, y[[7, 2, 30]])
    assert len(rec.asked) == 1 and sorted(rec.asked[0].tolist()) == [2, 7, 30]
    assert list(rec.asked[0]) == sorted(rec.asked[0])          # ascending: sequential reads on disk
    assert ds.nclasses == 4 and ds.input_shape == (3,) and ds.target_shape is None


def test_validation_split_holds_out_the_last_rows_and_test_arrays_become_the_test_split():
    x, y = np.zeros((10, 2, 4, 4), np.float32), np.arange(10) % 3
    xt, yt = np.ones((4, 2, 4, 4), np.float32), np.array([0, 1, 2, 5])
    ds = from_arrays(x, y, xt, yt, validation_split=0.2)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (8, 2, 4)
    np.testing.assert_array_equal(ds.val.take([0, 1])[1], y[8:])
    assert ds.nclasses == 6                                     # the largest label of train AND test, + 1
    assert from_arrays(x, y, xt, yt, test_as_validation=True).val is not None


def test_float_targets_are_a_regression_of_their_shape():
    x, y = np.zeros((6, 5)), np.linspace(0, 1, 12).reshape(6, 2)
    ds = from_arrays(x, y)
    assert ds.output_shape == (2,) and ds.train.take([3])[1].dtype == np.float64


def _write(tmp_path, body, name="mydata.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_a_file_of_memory_mapped_arrays_is_kept_mapped(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(50 * 6, dtype=np.float32).reshape(50, 6))
    np.save(tmp_path / "y.npy", np.arange(50) % 5)
    path = _write(tmp_path, """
        import os
        import numpy as np
        HERE = os.path.dirname(os.path.abspath(__file__))
        def create_dataset(seed):
            load = lambda f: np.load(os.path.join(HERE, f), mmap_mode="r")
            return load("x.npy"), load("y.npy")
    """)
    ds = load_dataset(str(path), validation_split=0.1)
    assert isinstance(ds.train, ArraySplit) and isinstance(ds.train.x, np.memmap)   # not read into memory
    assert (len(ds.train), len(ds.val), ds.nclasses) == (45, 5, 5)
    np.testing.assert_array_equal(ds.train.take([44])[0][0], np.arange(44 * 6, 45 * 6))


def test_a_file_may_return_its_own_dataset_and_gets_the_seed(tmp_path):
    path = _write(tmp_path, """
        import numpy as np
        from pydtnn.datasets import from_arrays
        def create_dataset(seed):
            rng = np.random.default_rng(seed)
            return from_arrays(rng.standard_normal((20, 3)), rng.integers(0, 2, 20), name="mine")
    """)
    a, b = load_dataset(str(path), seed=1), load_dataset(str(path), seed=2)
    assert isinstance(a, Dataset) and a.name == "mine"
    assert not np.array_equal(a.train.take([0])[0], b.train.take([0])[0])
    with pytest.raises(ConfigError, match="defines its own val split"):
        load_dataset(str(path), validation_split=0.5)


BAD_FILES = {
    "no create_dataset": ("X = 1\n", "does not define create_dataset(seed)"),
    "wrong return": ("def create_dataset(seed):\n    return 42\n", "create_dataset returned int"),
    "lengths differ": ("import numpy as np\ndef create_dataset(seed):\n"
                       "    return np.zeros((5, 2)), np.zeros(4, int)\n", "x holds 5 samples"),
    "negative label": ("import numpy as np\ndef create_dataset(seed):\n"
                       "    return np.zeros((3, 2)), np.array([0, -1, 2])\n", "labels must be >= 0"),
    "1-D float targets": ("import numpy as np\ndef create_dataset(seed):\n"
                          "    return np.zeros((3, 2)), np.zeros(3)\n", "(N, 1)"),
    "not python": ("def create_dataset(seed) return\n", "failed to load (line 1)"),
    "raises at import": ("import numpy as np\nrows = 1 // 0\n", "failed to load: ZeroDivisionError"),
    "raises inside": ("def create_dataset(seed):\n    return read(seed)\n\n\ndef read(seed):\n"
                      "    raise ValueError('row 7 of my.csv has 3 fields')\n",
                      "create_dataset failed: ValueError: row 7 of my.csv has 3 fields"),
}
# the line where each raising file failed: the last of the user's frames shown under the error's line
RAISED_AT = {"not python": 1, "raises at import": 2, "raises inside": 6}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_dataset_file_is_one_line_naming_the_file(tmp_path, case):
    body, needle = BAD_FILES[case]
    path = _write(tmp_path, body)
    with pytest.raises((ConfigError, DatasetError)) as err:
        load_dataset(str(path))
    first, *frames = str(err.value).splitlines()
    assert str(path) in first and needle in first, str(err.value)
    if case in RAISED_AT:         # the user's own frames follow, the last one at the line that raised
        assert 2 <= len(frames) <= 2 * USER_FRAMES, frames
        assert frames[-2].startswith(f'  File "{path}", line {RAISED_AT[case]}, in '), frames
    else:
        assert frames == [], frames


FEATURES = """
    import os
    import numpy as np
    HERE = os.path.dirname(os.path.abspath(__file__))
    def create_dataset(seed):
        path = os.path.join(HERE, "x.npy")
        return np.load(path, mmap_mode="r"), np.load(os.path.join(HERE, "y.npy"))
"""
LINEAR = """
    from pydtnn.layers import FC, Input
    def create_model(model):
        model.add(Input(shape=(12,)))
        model.add(FC(shape=(3,), activation="softmax"))
"""


@pytest.mark.mpi
def test_two_unequal_replicas_on_a_mapped_file_equal_one_process(tmp_path):
    """The data-parallel invariant on a user's memory-mapped data: 2 replicas at 1:3 give one process's
    weights. Both runs do the same float64 sums in another order, so they agree to rounding: 3 steps of
    SGD at lr 0.1 on a 12x3 softmax layer move weights by O(0.1); a few hundred ulps of float64 (1e-13) is
    far below what a wrong weighting gives (the uniform run below: over 1e-4)."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.standard_normal((96, 12)))
    np.save(tmp_path / "y.npy", rng.integers(0, 3, 96))
    data, model = _write(tmp_path, FEATURES), _write(tmp_path, LINEAR, "linear.py")
    common = ["--model", str(model), "--dataset", str(data), "--dtype", "float64", "--global_batch_size", "32",
              "--num_epochs", "1", "--optimizer", "sgd", "--learning_rate", "0.1", "--progress_bar", "false",
              "--lr_schedulers", ""]
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    r1 = run_mpi(1, LAUNCHER, common + ["--save_weights_and_bias_filename", str(one)], timeout=180)
    assert r1.returncode == 0, describe(r1)
    r2 = run_mpi(2, LAUNCHER, common + ["--parallel", "data", "--balance", "static", "--replica_speeds", "1,3",
                                        "--save_weights_and_bias_filename", str(two)], timeout=180)
    assert r2.returncode == 0, describe(r2)
    a, b = np.load(one), np.load(two)
    assert sorted(a.files) == sorted(b.files) and a.files
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-12, err_msg=k)
    # the check can fail: uniform weights (1/2 each, not 8/32 and 24/32) give other weights
    uniform = tmp_path / "uniform.npz"
    r3 = run_mpi(2, LAUNCHER, common + ["--parallel", "data", "--balance", "static", "--replica_speeds", "1,3",
                                        "--gradient_weighting", "uniform",
                                        "--save_weights_and_bias_filename", str(uniform)], timeout=180)
    assert r3.returncode == 0, describe(r3)
    c = np.load(uniform)
    gap = max(float(np.abs(c[k] - a[k]).max()) for k in a.files)
    assert gap > 1e-4, gap


@pytest.mark.mpi
def test_a_bad_dataset_file_under_mpiexec_is_one_line_and_status_2(tmp_path):
    data = _write(tmp_path, "def create_dataset(seed):\n    return 'x'\n")
    r = run_mpi(2, LAUNCHER, ["--dataset", str(data), "--parallel", "data", "--progress_bar", "false"], timeout=120)
    assert r.returncode == 2, describe(r)
    lines = output_of_our_processes(r)
    assert len(lines) == 1 and lines[0].startswith("pydtnn: error: ") and str(data) in lines[0], describe(r)


def _linear_model():
    from pydtnn import Model
    from pydtnn.layers import FC, Input
    model = Model(backend="cpu", dtype="float64", seed=3)
    model.add(Input(shape=(12,)))
    model.add(FC(shape=(3,), activation="softmax"))
    return model


def test_model_fit_takes_a_dataset_and_trains_as_on_the_same_arrays():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 12)), rng.integers(0, 3, 40)
    a, b = _linear_model(), _linear_model()
    ha = a.fit(x[:32], y[:32], epochs=2, batch_size=8, validation_data=(x[32:], y[32:]))
    hb = b.fit(from_arrays(x, y, validation_split=0.2), epochs=2, batch_size=8)
    assert set(ha) == set(hb) and "val_loss" in hb and len(hb["loss"]) == 2
    # the same samples in the same order (one seed): the same float64 operations, so equal weights
    np.testing.assert_array_equal(a.params, b.params)
    np.testing.assert_allclose(ha["val_loss"], hb["val_loss"], rtol=1e-12)
    with pytest.raises(ConfigError, match="give neither y nor validation_data"):
        b.fit(from_arrays(x, y), y)
