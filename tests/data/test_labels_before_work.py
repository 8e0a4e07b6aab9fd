"""A dataset's labels against the model, before any work: per-position labels (N, T) ask for outputs
(T, classes), so a model that gives one distribution per sample is one line naming both shapes (it was a
broadcasting traceback in the first step); a label so large that no model for its classes fits in memory
(2**40: a 1 PiB allocation) is one line before the model is built. Per-position labels with a model that
gives (T, classes) train."""
import subprocess
import sys
import textwrap

import numpy as np

from pydtnn.datasets import from_arrays

from paths import REPO_DIR as REPO  # noqa: E402

LAUNCHER = f"{REPO}/scripts/pydtnn_benchmark.py"
FAST = ["--batch_size", "16", "--num_epochs", "1", "--progress_bar", "false", "--lr_schedulers", ""]

PER_POSITION_DATA = """
    import numpy as np
    def create_dataset(seed):
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, 6, (64, 5))
        return ids, (ids + 1) % 6          # the next id at every position
"""
BIG_LABEL_DATA = """
    import numpy as np
    def create_dataset(seed):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 3, 64)
        y[5] = 2 ** 40
        return rng.standard_normal((64, 8)).astype(np.float32), y
"""
ONE_PER_SAMPLE = """
    from pydtnn.layers import FC, Flatten, Input
    def create_model(model, nclasses=6):
        model.add(Input(shape=(5,)))
        model.add(FC(nclasses, activation="softmax"))
"""
PER_POSITION_MODEL = """
    from pydtnn.activations import Softmax
    from pydtnn.layers import FC, Embedding, Input
    def create_model(model, nclasses=6):
        model.add(Input(shape=(5,), dtype="int64"))
        model.add(Embedding(nclasses, 8))
        model.add(FC(nclasses))
        model.add(Softmax())
"""


def _files(tmp_path, **files):
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))


def _launch(tmp_path, *args):
    return subprocess.run([sys.executable, LAUNCHER, *FAST, *args], capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))


def _one_line_before_work(r, *needles):
    assert r.returncode == 2 and r.stdout == "", (r.stdout[-2000:], r.stderr[-2000:])
    assert len(r.stderr.splitlines()) == 1 and all(n in r.stderr for n in needles), r.stderr


def test_per_position_labels_ask_for_a_distribution_at_every_position():
    ids = np.arange(40).reshape(8, 5) % 4
    ds = from_arrays(ids, (ids + 1) % 4)
    assert ds.nclasses == 4 and ds.output_shape == (5, 4)
    assert from_arrays(np.zeros((8, 3)), np.arange(8) % 3).output_shape == (3,)


def test_per_position_labels_against_one_distribution_per_sample_is_one_line(tmp_path):
    _files(tmp_path, data=PER_POSITION_DATA, model=ONE_PER_SAMPLE)
    _one_line_before_work(_launch(tmp_path, "--dataset", "data.py", "--model", "model.py"),
                          "gives outputs of shape (6,)", "has targets of shape (5, 6)")


def test_a_label_of_two_to_the_forty_is_one_line_before_the_model_is_built(tmp_path):
    _files(tmp_path, data=BIG_LABEL_DATA)
    for model in ("simplemlp", "model.py"):
        (tmp_path / "model.py").write_text("from pydtnn.layers import FC, Input\n"
                                           "def create_model(model, nclasses=3):\n"
                                           "    model.add(Input(shape=(8,)))\n"
                                           "    model.add(FC(nclasses, activation='softmax'))\n")
        _one_line_before_work(_launch(tmp_path, "--dataset", "data.py", "--model", model),
                              "its largest label is 1099511627776", "class labels must be 0 .. K-1")


def test_per_position_labels_train_a_model_that_gives_every_position(tmp_path):
    _files(tmp_path, data=PER_POSITION_DATA, model=PER_POSITION_MODEL)
    r = _launch(tmp_path, "--dataset", "data.py", "--model", "model.py")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "epoch 1: loss=" in r.stdout, r.stdout
