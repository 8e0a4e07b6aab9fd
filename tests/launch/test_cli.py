"""The launcher: flags, a corpus of bad inputs (one line, exit status 2), weights, history, resume."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from pydtnn.errors import OutputError

from paths import REPO_DIR as REPO  # noqa: E402
LAUNCHER = os.path.join(REPO, "scripts", "pydtnn_benchmark.py")
FAST = ["--model", "simplecnn", "--synthetic_samples", "256", "--batch_size", "32", "--progress_bar", "false",
        "--lr_schedulers", ""]


def launch(*args, cwd=None, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.run([sys.executable, LAUNCHER, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env=env)


def test_help_explains_flags():
    r = launch("--help")
    assert r.returncode == 0
    for flag in ["--global_batch_size", "--balance", "--gradient_weighting", "--emulate_speeds", "--resume",
                 "--flip_images", "--lr_schedulers", "--weights_and_bias_filename", "--label_smoothing",
                 "--clip_grad_norm", "--cosine_decay_epochs", "--cosine_min_lr", "--cosine_warm_up_epochs",
                 "adamw"]:
        assert flag in r.stdout, flag


def test_default_run_trains_and_writes_nothing(tmp_path):
    r = launch(*FAST, "--num_epochs", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("model: simplecnn, ") and "training time" in r.stdout, r.stdout
    assert os.listdir(tmp_path) == []


def _corrupt(path):
    path.write_bytes(b"not a zip at all")
    return path


def _other_model_weights(tmp_path):
    out = tmp_path / "mlp.npz"
    r = launch("--model", "simplemlp", "--synthetic_samples", "64", "--num_epochs", "0", "--progress_bar", "false",
               "--save_weights_and_bias_filename", out)
    assert r.returncode == 0, r.stderr
    return out


BAD = {
    "unknown model": (["--model", "resnet9000"], "resnet9000"),
    "unknown dataset": (["--dataset", "svhn"], "svhn"),
    "bad boolean": (["--evaluate", "maybe"], "maybe"),
    "negative batch": (["--batch_size", "-4"], "batch_size"),
    "zero batch": (["--batch_size", "0"], "batch_size"),
    "missing mnist": (["--dataset", "mnist", "--dataset_train_path", "/nonexistent/mnist"], "/nonexistent/mnist"),
    "missing weights": (["--weights_and_bias_filename", "/nonexistent/w.npz"], "/nonexistent/w.npz"),
    "unknown optimizer": (["--optimizer", "adagrad"], "adagrad"),
    "unknown metric": (["--metrics", "f1_score"], "f1_score"),
    "unknown scheduler": (["--lr_schedulers", "cyclic"], "cyclic"),
    "bad dtype": (["--dtype", "float16"], "float16"),
    "bad validation split": (["--validation_split", "1.5"], "validation_split"),
    "speeds count": (["--parallel", "data", "--balance", "static", "--replica_speeds", "1,2"], "replica_speeds"),
    "bad speeds": (["--replica_speeds", "1,-2"], "replica_speeds"),
    "speeds without static balance": (["--replica_speeds", "1,2"], "--balance static"),
    "unknown flag": (["--batchsize", "3"], "batchsize"),
    "zero cap": (["--max_local_batch", "0"], "max_local_batch"),
    "missing model file": (["--model", "/nonexistent/my_model.py"], "my_model.py"),
    "nan loss": (["--learning_rate", "1e30", "--num_epochs", "2"], "loss"),
    "no resume file": (["--resume", "/nonexistent/ckpt.npz"], "ckpt.npz"),
    "label smoothing 1": (["--label_smoothing", "1"], "label_smoothing must be in [0, 1)"),
    "label smoothing with bce": (["--label_smoothing", "0.1", "--loss_func", "binary_cross_entropy"],
                                 "categorical_cross_entropy only"),
    "negative clip": (["--clip_grad_norm", "-1"], "clip_grad_norm must be a finite number >= 0"),
    "adamw decay too large": (["--optimizer", "adamw", "--learning_rate", "0.5", "--decay", "4"],
                              "learning_rate x decay must be in [0, 1)"),
    "cosine with warm_up": (["--lr_schedulers", "warm_up,cosine"], "cosine has its own warm-up"),
    "winograd contradicts direct": (["--enable_conv_winograd", "true", "--conv_algorithm", "direct"],
                                    "contradicts --conv_algorithm direct"),
    "cosine min_lr above lr": (["--lr_schedulers", "cosine", "--cosine_min_lr", "1"], "min_lr must be in [0, 0.01]"),
    "cuda graphs on the cpu": (["--cuda_graphs", "true"], "--cuda_graphs true needs a replica on a GPU"),
    "cuda graphs with layer profiles": (["--cuda_graphs", "true", "--enable_gpu", "true", "--profile_layers", "true"],
                                        "cannot time layers one by one (--profile_layers)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_one_line_exit_2(case):
    args, needle = BAD[case]
    r = launch(*FAST, *args)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("pydtnn: error:") and needle in lines[0], lines[0]
    assert "Traceback" not in r.stderr


def test_corrupt_and_truncated_files(tmp_path):
    bad = _corrupt(tmp_path / "w.npz")
    r = launch(*FAST, "--weights_and_bias_filename", bad)
    assert r.returncode == 2 and "corrupt" in r.stderr and str(bad) in r.stderr
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    src = os.path.join(REPO, "tests", "data", "mnist-t10k", "t10k-images-idx3-ubyte.gz")
    (mnist / "t10k-images-idx3-ubyte.gz").write_bytes(open(src, "rb").read()[:5000])
    (mnist / "t10k-labels-idx1-ubyte.gz").write_bytes(
        open(src.replace("images-idx3", "labels-idx1"), "rb").read())
    r = launch(*FAST, "--dataset", "mnist", "--dataset_train_path", mnist)
    assert r.returncode == 2 and "t10k-images" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _checkpoint(tmp_path, *extra):
    """A real epoch-end checkpoint of FAST's model (1 epoch) and the flags it was written with."""
    folder = tmp_path / "ck"
    flags = [*FAST, "--lr_schedulers", "model_checkpoint", "--model_checkpoint_save_freq", "1", "--num_epochs", "1",
             "--checkpoint_dir", folder, *extra]
    r = launch(*flags)
    assert r.returncode == 0, r.stderr
    return folder / "epoch_0001.npz"


def _rewrite(src, dst, key, value):
    with np.load(src) as d:
        arrays = {k: d[k] for k in d.files}
    arrays[key] = value
    np.savez(dst, **arrays)
    return dst


def _bad_files(tmp_path):
    ck = _checkpoint(tmp_path)
    np.save(tmp_path / "one.npy", np.ones(3))
    w = {"strings": np.array(["a", "b"]), "complex": np.ones(2, complex), "nan": np.array([np.nan, 1.0])}
    return {
        "weights: an npy file": ("--weights_and_bias_filename", tmp_path / "one.npy", "is a .npy file (one array)"),
        **{f"weights: {name}": ("--weights_and_bias_filename", _rewrite(ck, tmp_path / f"w_{name}.npz",
                                                                       "conv2d/weights", v), f"array 'conv2d/weights' holds")
           for name, v in w.items()},
        "resume: an npy file": ("--resume", tmp_path / "one.npy", "is a .npy file (one array)"),
        **{f"resume: {name}": ("--resume", _rewrite(ck, tmp_path / f"ck_{name}.npz", "conv2d/weights", v),
                               "array 'conv2d/weights' holds") for name, v in w.items()},
    }


def test_bad_weight_and_checkpoint_files_are_one_line_naming_the_file_and_the_array(tmp_path):
    cases = _bad_files(tmp_path)
    for case, (flag, path, needle) in cases.items():
        r = launch(*FAST, flag, path)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (case, r.stderr)
        assert lines[0].startswith("pydtnn: error:") and str(path) in lines[0] and needle in lines[0], (case, lines)
        assert "Warning" not in r.stderr, (case, r.stderr)          # a complex array is refused, not cast
        assert r.stdout == "", (case, r.stdout)                         # refused before the banner


BEFORE_WORK = {   # mistakes in the flags: one line with nothing before it, not even the banner
    "evaluate without a test split": (["--evaluate", "true"], "no test split"),
    "evaluate_only without a test split": (["--evaluate_only", "true"], "no test split"),
    "batch larger than the data": (["--batch_size", "100000"],
                                   "--batch_size 100000: a global batch of 100000 samples is larger than the 256 "
                                   "training samples"),
    "cosine min_lr above the rate": (["--lr_schedulers", "cosine", "--cosine_min_lr", "1.0"],
                                     "cosine: min_lr must be in [0, 0.01] (the learning rate), got 1"),
    "resume and a weights file": (["--resume", "ck.npz", "--weights_and_bias_filename", "w.npz"],
                                  "give one of the two"),
    "trace steps in the wrong order": (["--tracing", "true", "--trace_steps", "5:2"],
                                       "--trace_steps: expected 1 <= FIRST <= LAST, got '5:2'"),
}


@pytest.mark.parametrize("case", sorted(BEFORE_WORK))
def test_mistakes_in_the_flags_are_refused_before_any_work(case, tmp_path):
    args, needle = BEFORE_WORK[case]
    if "test split" in needle:          # MNIST from a folder of the test files alone: no test split
        args = ["--dataset", "mnist", "--dataset_train_path", os.path.join(REPO, "tests", "data", "mnist-t10k"),
                "--model", "simplemlp", *args]
    r = launch(*FAST, *args, cwd=tmp_path)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], (r.returncode, r.stderr)
    assert r.stdout == "" and os.listdir(tmp_path) == [], r.stdout


def test_evaluate_without_a_test_split_is_the_same_line_for_both_flags():
    mnist = ["--dataset", "mnist", "--dataset_train_path", os.path.join(REPO, "tests", "data", "mnist-t10k"),
             "--model", "simplemlp"]
    lines = {launch(*FAST, *mnist, flag, "true").stderr.strip() for flag in ("--evaluate", "--evaluate_only")}
    assert len(lines) == 1, lines


def test_resume_explicit_flags_win_and_the_others_come_from_the_checkpoint(tmp_path):
    ck = _checkpoint(tmp_path, "--seed", "3", "--learning_rate", "0.02", "--momentum", "0.5")
    base = FAST[:-2]                 # without --lr_schedulers: the checkpoint's (model_checkpoint)
    # nothing but --resume and --num_epochs: seed, rate and momentum are the checkpoint's run's
    r = launch(*base, "--resume", ck, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "a",
               "--history_file", tmp_path / "a.csv", "--verbose", "true")          # the parameters' table
    assert r.returncode == 0, r.stderr
    params = dict(l.split(None, 1) for l in r.stdout.splitlines() if l.startswith("  ") and len(l.split()) == 2)
    assert params["seed"] == "3" and params["learning_rate"] == "0.02" and params["momentum"] == "0.5", params
    # the one resume line: the checkpoint's outputs are not this run's (a checkpoint never chooses a path)
    assert [l for l in r.stdout.splitlines() if l.startswith("resume:")] == [
        f"resume: outputs come from this command line, not from the checkpoint's run (which wrote "
        f"--checkpoint_dir {os.path.dirname(ck)})"], r.stdout
    assert "learning rate in force" not in r.stdout
    # an explicit rate wins over the checkpoint's, with one line, and trains at it
    r = launch(*base, "--resume", ck, "--num_epochs", "2", "--learning_rate", "0.05", "--checkpoint_dir",
               tmp_path / "b", "--history_file", tmp_path / "b.csv")
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("resume:") and "outputs come from" not in l]
    assert lines == ["resume: --learning_rate 0.05 instead of the checkpoint's 0.02: training continues at the new "
                     "rate, not at the checkpoint's"], r.stdout
    rows = (tmp_path / "b.csv").read_text().splitlines()
    header = rows[0].split(",")
    assert float(rows[2].split(",")[header.index("learning_rate")]) == 0.05        # epoch 2 trained at it
    # another optimizer: the weights are restored, its state starts afresh
    r = launch(*base, "--resume", ck, "--num_epochs", "2", "--optimizer", "adam", "--checkpoint_dir", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert "resume: --optimizer adam instead of the checkpoint's sgd: the weights are restored" in r.stdout


def test_checkpoint_of_another_model_is_rejected(tmp_path):
    other = _other_model_weights(tmp_path)
    r = launch(*FAST, "--weights_and_bias_filename", other)
    assert r.returncode == 2 and "does not match this model" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_weights_roundtrip_and_history(tmp_path):
    w, h = tmp_path / "w.npz", tmp_path / "h.csv"
    r = launch(*FAST, "--num_epochs", "2", "--validation_split", "0.2", "--save_weights_and_bias_filename", w,
               "--history_file", h)
    assert r.returncode == 0, r.stderr
    rows = h.read_text().splitlines()
    assert rows[0].startswith("epoch,loss") and len(rows) == 3 and "val_categorical_accuracy" in rows[0]
    with np.load(w, allow_pickle=False) as data:
        assert "conv2d/weights" in data.files
    r = launch(*FAST, "--weights_and_bias_filename", w, "--evaluate_only", "true", "--validation_split", "0.2")
    assert r.returncode == 0, r.stderr
    assert "evaluation:" in r.stdout


def test_resume_equals_uninterrupted_bit_for_bit(tmp_path):
    common = [*FAST, "--seed", "5", "--validation_split", "0.25", "--lr_schedulers",
              "model_checkpoint,reduce_lr_on_plateau", "--model_checkpoint_save_freq", "1",
              "--reduce_lr_on_plateau_patience", "0", "--model", "simplecnn"]
    full, resumed = tmp_path / "full.npz", tmp_path / "resumed.npz"
    r = launch(*common, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "a", "--save_weights_and_bias_filename", full)
    assert r.returncode == 0, r.stderr
    r = launch(*common, "--num_epochs", "1", "--checkpoint_dir", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    ckpt = tmp_path / "b" / "epoch_0001.npz"
    assert ckpt.exists()
    r = launch(*common, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "c", "--resume", ckpt,
               "--save_weights_and_bias_filename", resumed)
    assert r.returncode == 0, r.stderr
    a, b = np.load(full), np.load(resumed)
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k
    meta = json.loads(np.load(ckpt)["__meta__"].tobytes())
    assert meta["epoch"] == 1 and meta["flags"]["seed"] == 5


def test_resume_with_adamw_cosine_clipping_and_smoothing_is_bit_exact(tmp_path):
    """The new options' state (adamw moments, the cosine base rate) survives a resume bit for bit."""
    common = [*FAST, "--seed", "4", "--dtype", "float64", "--optimizer", "adamw", "--decay", "0.01",
              "--learning_rate", "0.003", "--lr_schedulers", "cosine,model_checkpoint", "--cosine_decay_epochs", "2",
              "--cosine_warm_up_epochs", "1", "--cosine_min_lr", "0.0001", "--clip_grad_norm", "0.5",
              "--label_smoothing", "0.1", "--model_checkpoint_save_freq", "1", "--model_checkpoint_metric", "loss"]
    full, resumed = tmp_path / "full.npz", tmp_path / "resumed.npz"
    r = launch(*common, "--num_epochs", "3", "--checkpoint_dir", tmp_path / "a", "--save_weights_and_bias_filename",
               full, "--history_file", tmp_path / "h.json")
    assert r.returncode == 0, r.stderr
    rates = [row["learning_rate"] for row in json.loads((tmp_path / "h.json").read_text())]
    # 8 steps an epoch; a row holds the rate of the epoch's last step: the warm-up's end (step 7) at the base
    # rate, then steps 15 and 23 of a 16-step cosine
    cos = [1e-4 + (3e-3 - 1e-4) * (1 + math.cos(math.pi * t / 16)) / 2 for t in (7, 15)]
    assert rates[0] == 0.003 and rates[1:] == pytest.approx(cos, abs=1e-16)
    r = launch(*common, "--num_epochs", "3", "--checkpoint_dir", tmp_path / "c", "--resume",
               tmp_path / "a" / "epoch_0001.npz", "--save_weights_and_bias_filename", resumed)
    assert r.returncode == 0, r.stderr
    a, b = np.load(full), np.load(resumed)
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k


def test_interrupted_checkpoint_write_keeps_previous(tmp_path, monkeypatch):
    from pydtnn import weights
    path = tmp_path / "c.npz"
    weights.atomic_savez(str(path), {"a": np.arange(3)})

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OutputError, match="c.npz: disk full"):
        weights.atomic_savez(str(path), {"a": np.arange(5)})
    assert np.array_equal(np.load(path)["a"], np.arange(3))
    assert [p.name for p in tmp_path.iterdir()] == ["c.npz"]
