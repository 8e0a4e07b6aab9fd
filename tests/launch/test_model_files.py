"""A model file (`--model dir/mymodel.py`) may import the modules beside it, without leaking dir onto sys.path."""
import sys
import textwrap

import pytest

from mpi_helpers import REPO_ROOT, describe, run_mpi
from pydtnn import Model
from pydtnn.models import build_model

NEIGHBOUR = '''
import os
import sys

from pydtnn.layers import Layer

HERE = os.path.dirname(os.path.abspath(__file__))


class Halve(Layer):
    """Defined beside the model file; checks, when it runs, that its folder left sys.path again."""
    def forward(self, x, training=False):
        assert HERE not in sys.path, "the model file's folder leaked onto sys.path"
        return x * 0.5

    def backward(self, dy):
        return dy * 0.5
'''

MODEL = '''
import {neighbour}
from pydtnn.layers import FC, Conv2D, Flatten, Input

print("model file imported " + {neighbour}.__name__, flush=True)   # one write: ranks share the pipe


def create_model(model):
    import {neighbour}_lazy       # imported while create_model runs
    model.add(Input(shape=(1, 6, 6)))
    model.add(Conv2D(nfilters=2, filter_shape=(3, 3), padding=1))
    model.add({neighbour}.Halve())
    model.add(Flatten())
    model.add(FC(shape=({neighbour}_lazy.NCLASSES,), activation="softmax"))
    return model
'''


def write_model_dir(folder, neighbour):
    folder.mkdir(exist_ok=True)
    (folder / f"{neighbour}.py").write_text(textwrap.dedent(NEIGHBOUR))
    (folder / f"{neighbour}_lazy.py").write_text("NCLASSES = 3\n")
    (folder / "mymodel.py").write_text(textwrap.dedent(MODEL.format(neighbour=neighbour)))
    return folder / "mymodel.py"


def test_model_file_imports_its_neighbour_in_process(tmp_path):
    path = write_model_dir(tmp_path / "models dir", "kit_neighbour_inproc")
    before = list(sys.path)
    model = build_model(str(path), Model(dtype="float64"))
    assert sys.path == before
    assert [type(l).__name__ for l in model.layers][2] == "Halve" and model.output_shape == (3,)
    import numpy as np
    assert model.predict(np.ones((2, 1, 6, 6))).shape == (2, 3)     # Halve's own sys.path check passes


@pytest.mark.mpi
def test_model_file_imports_its_neighbour_under_mpiexec(tmp_path):
    path = write_model_dir(tmp_path / "mine", "mylayers")
    launcher = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"
    r = run_mpi(2, launcher, ["--model", str(path), "--parallel", "data", "--synthetic_samples", "64",
                              "--batch_size", "8", "--progress_bar", "false", "--lr_schedulers", ""], timeout=120)
    assert r.returncode == 0, describe(r)
    assert r.stdout.count("model file imported mylayers") == 2, describe(r)     # once on each rank
