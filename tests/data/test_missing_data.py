"""A built-in dataset whose files are not there (no folder, an empty folder, no ImageNet path at all) is one
line that names every way out: the path flag (correct it, or give it), `--download true` where the dataset
can be downloaded (mnist, cifar10; not imagenet, which says so) and `--use_synthetic_data true`; from the
launcher, `pydtnn: error:` and exit 2 before any work. The README's own command without its data:
tests/launch/test_readme_commands.py."""
import os
import subprocess
import sys

import pytest

from pydtnn.datasets import load_dataset
from pydtnn.errors import ConfigError, DatasetError

from paths import REPO_DIR  # noqa: E402

LAUNCHER = os.path.join(REPO_DIR, "scripts", "pydtnn_benchmark.py")
SYNTHETIC = "or train on synthetic data shaped like {name} with --use_synthetic_data true"


def _error(name, **kwargs):
    with pytest.raises((DatasetError, ConfigError)) as info:
        load_dataset(name, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_no_folder_in_the_cache_names_the_path_flag_the_download_and_synthetic_data(tmp_path, name):
    message = _error(name, cache_dir=str(tmp_path))
    assert message == (f"{tmp_path / name}: {name} dataset folder not found: give the folder of its files with "
                       f"--dataset_train_path DIR (train_path=DIR), fetch them into the cache with --download true "
                       f"(download=True), {SYNTHETIC.format(name=name)}")


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_a_given_folder_that_is_missing_or_empty_names_the_ways_out(tmp_path, name):
    ways = (f"correct --dataset_train_path (train_path=), or leave it out and fetch the files into the cache with "
            f"--download true (download=True), {SYNTHETIC.format(name=name)}")
    missing = _error(name, train_path=str(tmp_path / "nowhere"))
    assert missing == f"{tmp_path / 'nowhere'}: {name} dataset folder not found: {ways}"
    empty = _error(name, train_path=str(tmp_path))
    label = {"mnist": "MNIST", "cifar10": "CIFAR-10"}[name]
    assert empty.startswith(f"{tmp_path}: no {label} files here (expected ") and empty.endswith(f"): {ways}"), empty


def test_imagenet_names_its_path_and_synthetic_data_and_says_it_has_no_download(tmp_path):
    ways = SYNTHETIC.format(name="imagenet")
    assert _error("imagenet") == ("imagenet needs a folder of NPZ shards (keys x, y), and has no download: give "
                                  "the folder of its files with --dataset_train_path DIR (train_path=DIR), " + ways)
    missing = _error("imagenet", train_path=str(tmp_path / "nowhere"))
    assert missing == f"{tmp_path / 'nowhere'}: ImageNet shard folder not found: correct --dataset_train_path " \
                      f"(train_path=), {ways}"
    assert _error("imagenet", train_path=str(tmp_path)) == (f"{tmp_path}: no *.npz shards in this folder: correct "
                                                            f"--dataset_train_path (train_path=), {ways}")


@pytest.mark.parametrize("name", ["mnist", "cifar10", "imagenet"])
def test_the_launcher_says_it_in_one_line_and_exits_2_and_the_synthetic_way_out_works(tmp_path, name):
    env = dict(os.environ, PYDTNN_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, LAUNCHER, "--dataset", name, "--progress_bar", "false"],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert r.returncode == 2 and r.stdout == "", r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("pydtnn: error: "), r.stderr
    assert "--dataset_train_path" in r.stderr and "--use_synthetic_data true" in r.stderr
    assert ("--download true" in r.stderr) == (name != "imagenet"), r.stderr
    if name == "imagenet":
        return                                        # its synthetic stand-in's 227x227 images take minutes
    r = subprocess.run([sys.executable, LAUNCHER, "--dataset", name, "--use_synthetic_data", "true",
                        "--synthetic_samples", "64", "--num_epochs", "1", "--progress_bar", "false"],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert r.returncode == 0 and "epoch 1: loss=" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
