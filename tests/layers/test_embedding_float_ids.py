"""Embedding takes integer-valued float ids (an Input of the model's float type casts int ids to it), as
Keras's Embedding does: the same rows and gradients as int64 ids; a value that is no integer, or a table too
large for the float type to hold its ids exactly, is one line."""
import numpy as np
import pytest

from pydtnn import Model
from pydtnn.errors import DatasetError, ShapeError
from pydtnn.layers import Embedding, Input


def _model(dtype_in, rows=7, model_dtype="float64"):
    m = Model(dtype=model_dtype, seed=0)
    m.add(Input(shape=(4,), dtype=dtype_in))
    m.add(Embedding(rows, 3))
    return m


def test_float_ids_look_up_and_train_as_int64_ids():
    ids = np.array([[0, 3, 6, 3], [1, 1, 2, 5]])
    as_ints, as_floats = _model("int64"), _model(None)
    as_floats.load_state_arrays(as_ints.state_arrays())
    y_int = as_ints.forward(ids, training=True)
    y_float = as_floats.forward(ids.astype(np.float64), training=True)
    assert np.array_equal(y_int, y_float)
    dy = np.random.default_rng(0).standard_normal(y_int.shape)
    as_ints.backward(dy, need_dx=False)
    as_floats.backward(dy, need_dx=False)
    assert np.array_equal(as_ints.grads, as_floats.grads)


@pytest.mark.parametrize("value", [2.5, np.nan, np.inf, -0.25])
def test_a_float_id_that_is_no_integer_is_one_line(value):
    ids = np.array([[0.0, 1.0, value, 3.0]])
    with pytest.raises(DatasetError, match="token ids must be integers") as e:
        _model(None).forward(ids)
    assert "\n" not in str(e.value)


def test_float32_ids_of_a_table_past_two_to_the_24_need_int64():
    with pytest.raises(ShapeError, match="float32 ids are exact only up to 16777216"):
        _model(None, rows=2 ** 24 + 1, model_dtype="float32").forward(np.zeros((1, 4), np.float32))


def test_a_byte_model_without_an_int64_input_trains_through_the_launcher(tmp_path):
    import subprocess
    import sys
    from paths import REPO_DIR
    (tmp_path / "lm.py").write_text("from pydtnn.activations import Softmax\nfrom pydtnn.layers import FC, Embedding, Input\n"
                                    "def create_model(model):\n    model.add(Input(shape=(64,)))\n"
                                    "    model.add(Embedding(256, 8))\n    model.add(FC(256))\n    model.add(Softmax())\n")
    r = subprocess.run([sys.executable, f"{REPO_DIR}/scripts/pydtnn_benchmark.py", "--model", "lm.py", "--dataset",
                        "bytes", "--batch_size", "16", "--steps_per_epoch", "2", "--progress_bar", "false"],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0 and "perplexity=" in r.stdout, r.stderr[-2000:]
