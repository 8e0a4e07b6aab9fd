"""What a new user's first runs show: a progress estimate that leaves out the step that compiles the
kernels (it said "2647 s left" for a 22 s epoch), a throughput without it, and for a language model its tokens
per second and perplexity; the documented byte-level model command works as written."""
import subprocess
import sys
import types

import numpy as np
import pytest

from pydtnn.datasets import from_arrays, load_dataset
from pydtnn.losses import get_loss
from pydtnn.training import loop_callbacks
from pydtnn.training.loop_callbacks import ProgressBar
from pydtnn.training.tokens import add_language_model_logs, tokens_per_sample

from paths import REPO_DIR as REPO  # noqa: E402

LAUNCHER = f"{REPO}/scripts/pydtnn_benchmark.py"


def test_the_estimate_leaves_out_the_first_step_that_compiles(monkeypatch, capsys):
    """Step 1 takes 100 s (compilation), the others 1 s each: after step 4 of 10 the line says 6 s left, at
    32 samples/s, where counting the first step would say about 154 s at 1 sample/s."""
    monkeypatch.setenv("PYDTNN_PROGRESS_INTERVAL_S", "0")
    clock = iter([100.0, 101.0, 102.0, 103.0, 104.0, 105.0])
    monkeypatch.setattr(loop_callbacks.time, "perf_counter", lambda: next(clock))
    trainer = types.SimpleNamespace(steps_per_epoch=10, num_epochs=1, first_step=0, stop_requested=False,
                                    epoch_sums=np.zeros(1), epoch_samples=0)
    bar = ProgressBar([])
    bar.on_epoch_begin(trainer, 0)
    for step in range(4):
        trainer.epoch_samples += 32
        trainer.epoch_sums[0] += 32 * 2.0
        bar.on_batch_end(trainer, step, {})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("(the first step compiles the kernels: no estimate yet)"), lines
    assert lines[3] == "epoch 1/1: step 4/10 (40%), loss=2.0000 32 samples/s, 6 s left", lines
    bar.close()


def test_a_language_model_is_recognized_by_its_per_position_labels_and_exact_loss():
    text = load_dataset("bytes", sequence_length=16)
    cce = get_loss("categorical_cross_entropy")
    assert tokens_per_sample(text, cce) == 16
    assert tokens_per_sample(text, get_loss("categorical_cross_entropy", label_smoothing=0.1)) is None
    assert tokens_per_sample(text, get_loss("mean_squared_error")) is None
    images = load_dataset("synthetic", input_shape=(1, 8, 8), nclasses=4, synthetic_samples=32)
    assert tokens_per_sample(images, cce) is None
    regression = from_arrays(np.zeros((8, 3)), np.zeros((8, 2, 3)))
    assert tokens_per_sample(regression, get_loss("mean_squared_error")) is None
    logs = {"loss": np.log(40.0), "val_loss": np.log(50.0), "samples_per_s": 10.0}
    add_language_model_logs(logs, 16)
    assert logs["perplexity"] == pytest.approx(40.0) and logs["val_perplexity"] == pytest.approx(50.0)
    assert logs["tokens_per_s"] == 160.0


def test_the_documented_byte_model_command_works_as_written(tmp_path):
    """docs/layers_and_models.md: `--model bytelm_small --dataset bytes` (60 sequences of the shipped text,
    the default batch of 64 shrinks to 32 and says so); a batch the user gives is still refused."""
    r = subprocess.run([sys.executable, LAUNCHER, "--model", "bytelm_small", "--dataset", "bytes"],
                       capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "batch: --batch_size 32, as the default 64 is more than the 60 training samples" in r.stdout
    epoch = next(l for l in r.stdout.splitlines() if l.startswith("epoch 1: "))
    assert "perplexity=" in epoch and epoch.endswith(" tokens/s"), epoch
    throughput = next(l for l in r.stdout.splitlines() if l.startswith("throughput: "))
    assert " tokens/s (all replicas; the first step, which compiles, left out)" in throughput, throughput
    r = subprocess.run([sys.executable, LAUNCHER, "--model", "bytelm_small", "--dataset", "bytes", "--batch_size",
                        "64"], capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert r.returncode == 2 and "larger than the 60 training samples" in r.stderr, r.stderr[-2000:]
