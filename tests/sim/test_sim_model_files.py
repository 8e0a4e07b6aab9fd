"""The simulator takes the launcher's `--model FILE.py` too: a roofline profile of a user's model file, and
one calibrated from the launcher's trace of it (whose layers inside blocks are nested events)."""
import json
import subprocess
import sys

from pydtnn.sim.__main__ import main

from paths import REPO_DIR

BLOCKS = ("from pydtnn.layers import FC, AdditionBlock, BatchNormalization, Conv2D, Flatten, Input, Relu\n\n\n"
          "def create_model(model):\n    model.add(Input(shape=(1, 28, 28)))\n"
          "    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1))\n"
          "    model.add(AdditionBlock([Conv2D(nfilters=4, filter_shape=(3, 3), padding=1), BatchNormalization(), "
          "Relu()], []))\n    model.add(Flatten())\n    model.add(FC(10, activation='softmax'))\n")


def test_a_model_file_is_profiled_from_the_roofline_and_from_a_trace(tmp_path, capsys):
    model = tmp_path / "b.py"
    model.write_text(BLOCKS)
    assert main(["calibrate", "--model", str(model), "--roofline", "--out", str(tmp_path / "r.json")]) == 0
    layers = [layer["name"] for layer in json.loads((tmp_path / "r.json").read_text())["layers"]]
    assert layers[:3] == ["input", "conv2d", "addition_block"], layers
    r = subprocess.run([sys.executable, f"{REPO_DIR}/scripts/pydtnn_benchmark.py", "--model", str(model), "--dataset",
                        "mnist", "--use_synthetic_data", "true", "--synthetic_samples", "64", "--batch_size", "16",
                        "--steps_per_epoch", "3", "--progress_bar", "false", "--tracing", "true", "--tracer_output",
                        str(tmp_path / "t.json"), "--trace_steps", "2:3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    capsys.readouterr()
    assert main(["calibrate", "--model", str(model), "--trace", str(tmp_path / "t.json"), "--out",
                 str(tmp_path / "p.json")]) == 0
    profile = json.loads((tmp_path / "p.json").read_text())
    assert [layer["name"] for layer in profile["layers"]] == layers
