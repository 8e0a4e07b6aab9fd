"""Real data: simplecnn on the MNIST test set (8,000 train / 2,000 held out) through the launcher."""
import json
import os
import subprocess
import sys
import time


from paths import REPO_DIR as REPO  # noqa: E402
MNIST = os.path.join(REPO, "tests", "data", "mnist-t10k")   # carried by the repository


def test_simplecnn_reaches_95_percent_on_real_mnist(tmp_path):
    history = tmp_path / "history.json"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "pydtnn_benchmark.py"),
                        "--model", "simplecnn", "--dataset", "mnist", "--dataset_train_path", MNIST,
                        "--validation_split", "0.2", "--num_epochs", "3", "--learning_rate", "0.05",
                        "--batch_size", "64", "--lr_schedulers", "", "--progress_bar", "false",
                        "--history_file", str(history)], capture_output=True, text=True, timeout=900)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    rows = json.loads(history.read_text())
    assert len(rows) == 3
    assert rows[-1]["rank0_b"] == 64
    final = rows[-1]["val_categorical_accuracy"]
    print(f"held-out accuracy {final:.4f} after 3 epochs, {elapsed:.1f} s")
    assert final >= 0.95, rows
    assert rows[-1]["loss"] < rows[0]["loss"]
