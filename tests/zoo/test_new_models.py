"""The transformer and autoencoder models of the zoo (issue 21): they learn, and they train through the
launcher, data-parallel under mpiexec -n 2, on the repository's real MNIST and shipped text."""
import os
import sys

import numpy as np
import pytest

from mpi_helpers import REPO_ROOT, describe, run_mpi  # noqa: E402
from pydtnn import Model  # noqa: E402
from pydtnn.datasets import load_dataset  # noqa: E402
from pydtnn.models import build_model  # noqa: E402
from pydtnn.optimizers import get_optimizer  # noqa: E402

LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"
MNIST = str(REPO_ROOT / "tests" / "data" / "mnist-t10k")
QUICK = ["--progress_bar", "false", "--lr_schedulers", "", "--optimizer", "adam", "--beta1", "0.9",
         "--learning_rate", "0.001", "--parallel", "data"]


def overfit(name, dataset, loss, steps=25, batch=8):
    """Adam on one fixed batch: the loss of the last step against the first."""
    model = build_model(name, Model(dtype="float32", seed=0), nclasses=dataset.nclasses,
                        input_shape=dataset.input_shape)
    x, y = dataset.train.take(np.arange(batch))
    history = model.fit(np.repeat(x, 2, axis=0)[:batch], np.repeat(y, 2, axis=0)[:batch], epochs=steps,
                        batch_size=batch, loss=loss, metrics=(), shuffle=False,
                        optimizer=get_optimizer("adam", learning_rate=3e-3, beta1=0.9))
    return history["loss"][0], history["loss"][-1]


def test_vit_learns_a_batch():
    first, last = overfit("vit_tiny_mnist", load_dataset("mnist", train_path=MNIST), "categorical_cross_entropy")
    assert last < 0.2 * first, (first, last)


def test_autoencoder_learns_a_batch():
    ds = load_dataset("mnist", train_path=MNIST, targets="inputs")
    assert ds.output_shape == (1, 28, 28)
    x, y = ds.train.take([0, 1])
    np.testing.assert_array_equal(x, y)
    first, last = overfit("conv_autoencoder_mnist", ds, "mean_squared_error", steps=40)
    assert last < 0.5 * first, (first, last)


def test_byte_lm_learns_a_batch():
    ds = load_dataset("bytes", sequence_length=32)
    x, y = ds.train.take([0, 3])
    assert x.dtype == np.int64 and x.shape == (2, 32)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])           # targets: the next byte at every position
    text = open(os.path.join(REPO_ROOT, "datasets", "data", "gettysburg_declaration.txt"), "rb").read()
    assert bytes(x[0].astype(np.uint8)) == text[:32] and bytes(y[1].astype(np.uint8)) == text[3 * 32 + 1:4 * 32 + 1]
    first, last = overfit("bytelm_small", ds, "categorical_cross_entropy", steps=30)
    assert first == pytest.approx(np.log(256), rel=0.05)          # a uniform guess over the bytes at first
    assert last < 0.5 * first, (first, last)


def launch(args, timeout=240):
    r = run_mpi(2, LAUNCHER, QUICK + args, timeout=timeout)
    assert r.returncode == 0, describe(r)
    assert "global batch 16 split as [8, 8]" in r.stdout, describe(r)
    epochs = [l for l in r.stdout.splitlines() if l.startswith("epoch ")]
    assert epochs and "loss=" in epochs[-1], describe(r)
    return epochs


@pytest.mark.mpi
def test_vit_trains_data_parallel_through_the_launcher(tmp_path):
    weights = tmp_path / "vit.npz"
    epochs = launch(["--model", "vit_tiny_mnist", "--dataset", "mnist", "--dataset_train_path", MNIST,
                     "--validation_split", "0.2", "--batch_size", "8", "--steps_per_epoch", "3",
                     "--save_weights_and_bias_filename", str(weights)])
    assert "val_categorical_accuracy=" in epochs[-1]
    model = build_model("vit_tiny_mnist", Model())
    model.load(str(weights))          # the weights file holds the attention and LayerNorm parameters
    assert "multi_head_attention/in_proj_weight" in model.state_arrays()


@pytest.mark.mpi
def test_autoencoder_trains_data_parallel_through_the_launcher():
    epochs = launch(["--model", "conv_autoencoder_mnist", "--dataset", "mnist", "--dataset_train_path", MNIST,
                     "--targets", "inputs", "--loss_func", "mean_squared_error", "--metrics",
                     "mean_absolute_error", "--batch_size", "8", "--steps_per_epoch", "3"])
    assert "mean_absolute_error=" in epochs[-1]


@pytest.mark.mpi
def test_byte_lm_trains_data_parallel_through_the_launcher():
    launch(["--model", "bytelm_small", "--dataset", "bytes", "--sequence_length", "64", "--batch_size", "8",
            "--steps_per_epoch", "3", "--validation_split", "0.1"])


def test_an_autoencoder_without_input_targets_is_one_line():
    from pydtnn.cli import main
    from pydtnn.errors import ConfigError
    with pytest.raises(SystemExit) as info:
        main(["--model", "conv_autoencoder_mnist", "--dataset", "mnist", "--dataset_train_path", MNIST,
              "--progress_bar", "false", "--loss_func", "mean_squared_error"])
    assert info.value.code == 2
    with pytest.raises(ConfigError, match=r"outputs of shape \(1, 28, 28\) .* 10 classes; an autoencoder "
                                          r"needs --targets inputs"):
        from pydtnn.cli import parse_args, run
        run(parse_args(["--model", "conv_autoencoder_mnist", "--dataset", "mnist", "--dataset_train_path",
                        MNIST, "--progress_bar", "false"]))


# --- the GPU backend's glue for the new layers, over the host stand-in of CuPy/cuDNN (not a GPU); the
# name says "standin" so that the device check (-k "gpu and not standin") leaves it to CI

EVERY_NEW_LAYER = """
from pydtnn.activations import GELU, SiLU
from pydtnn.layers import (FC, Conv2D, ConvTranspose2D, Flatten, GroupNorm, ImageToSequence, Input, LayerNorm,
                           MultiHeadAttention, PositionEmbedding, Upsample2D)

def create_model(model):
    model.add(Input(shape=(1, 10, 10)))
    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), stride=2, padding=1))                 # 5x5
    model.add(ConvTranspose2D(4, (3, 3), stride=2, padding=1, output_padding=1))          # 10x10
    model.add(GroupNorm(2))
    model.add(SiLU())
    model.add(Upsample2D(2, mode="bilinear"))                                               # 20x20
    model.add(Conv2D(nfilters=8, filter_shape=(5, 5), stride=5))                           # 16 tokens of 8
    model.add(ImageToSequence())
    model.add(PositionEmbedding())
    model.add(LayerNorm())
    model.add(MultiHeadAttention(8, 2, causal=True))
    model.add(FC(8, activation="gelu"))
    model.add(Flatten())
    model.add(FC(shape=(5,), activation="softmax"))
"""


def launch_standin(tmp_path, args, gpu):
    import json
    import subprocess
    import gpu_standin
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    history = tmp_path / f"{'gpu' if gpu else 'cpu'}.json"
    if gpu:
        env = gpu_standin.subprocess_env(env)
        args = args + ["--enable_gpu", "true"]
    r = subprocess.run([sys.executable, str(LAUNCHER), *args, "--history_file", str(history), "--dtype", "float64",
                        "--progress_bar", "false", "--lr_schedulers", "", "--num_epochs", "2"],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(history.read_text())


@pytest.mark.parametrize("what", ["image_and_attention_layers", "byte_lm"])
def test_glue_new_layers_on_the_standin_train_as_on_the_cpu(tmp_path, what):
    """The GPU backend over the host stand-in (tests/gpu_standin: our glue, not NVIDIA's libraries): the
    same layer code through CuPy's API, cuDNN for the convolutions (ConvTranspose2D's included), trains
    with the CPU run's losses, in float64."""
    if what == "byte_lm":
        args = ["--model", "bytelm_small", "--dataset", "bytes", "--sequence_length", "16", "--batch_size", "8",
                "--steps_per_epoch", "3", "--validation_split", "0.1"]
    else:
        model = tmp_path / "every_new_layer.py"
        model.write_text(EVERY_NEW_LAYER)
        args = ["--model", str(model), "--dataset", "synthetic", "--synthetic_samples", "48", "--batch_size", "16",
                "--validation_split", "0.25", "--seed", "5"]
    cpu, gpu = launch_standin(tmp_path, args, False), launch_standin(tmp_path, args, True)
    assert len(cpu) == len(gpu) == 2
    for rc, rg in zip(cpu, gpu):
        for key in ("loss", "val_loss"):
            assert abs(rc[key] - rg[key]) <= 1e-9 * max(1.0, abs(rc[key])), (key, rc[key], rg[key])


def test_a_bug_in_a_user_layer_is_one_line_and_its_frame_through_the_launcher(tmp_path):
    """A coding bug in a user layer's build is one error line, then the user's own frames (the file, the line
    that raised), status 2: no traceback of the launcher's machinery."""
    import subprocess
    path = tmp_path / "buggy.py"
    path.write_text("from pydtnn.layers import FC, Input, Layer\n\n\n"
                    "class Buggy(Layer):\n"
                    "    def build(self, in_shape):\n"
                    "        return in_shape.nonexistent\n\n\n"
                    "def create_model(model):\n"
                    "    model.add(Input(shape=(1, 28, 28)))\n"
                    "    model.add(Buggy())\n")
    r = subprocess.run([sys.executable, str(LAUNCHER), "--model", str(path), "--progress_bar", "false"],
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 2, r.stderr[-2000:]
    first, *frames = r.stderr.splitlines()
    assert first.startswith(f"pydtnn: error: model file {path}: create_model failed: AttributeError"), r.stderr
    assert f'  File "{path}", line 6, in build' in frames and len(frames) <= 4, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == "", r.stderr
