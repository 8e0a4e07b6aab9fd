"""A checkpoint is data, never code: the flags stored in it may describe its run, but on --resume they never
load code (a dataset or model file, a plug-in of --gradient_weighting or --balance) and never choose a path
(an output to write, a folder of data to read). A checkpoint without its optimizer's state is refused in one
line instead of resuming with zero momentum."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from paths import REPO_DIR as REPO  # noqa: E402
LAUNCHER = os.path.join(REPO, "scripts", "pydtnn_benchmark.py")
RUN = ["--model", "simplecnn", "--synthetic_samples", "256", "--batch_size", "32", "--progress_bar", "false",
       "--seed", "2"]
CODE = '''
import os
import numpy as np
open({marker!r}, "w").write("this code ran")


def create_dataset(seed):
    rng = np.random.default_rng(seed)
    return rng.random((64, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 64)


def create_model(model):
    raise SystemExit("never built")


def weights(sizes):
    return [1.0 / len(sizes)] * len(sizes)


from pydtnn.parallel.balance import BalancePolicy


class Policy(BalancePolicy):
    pass
'''


def launch(cwd, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, LAUNCHER, *map(str, args)], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


def one_line(r):
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pydtnn: error: "), r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A real epoch-end checkpoint of one epoch (model_checkpoint)."""
    folder = tmp_path_factory.mktemp("run")
    r = launch(folder, *RUN, "--num_epochs", "1", "--lr_schedulers", "model_checkpoint",
               "--model_checkpoint_save_freq", "1", "--checkpoint_dir", "ck")
    assert r.returncode == 0, r.stderr
    return folder / "ck" / "epoch_0001.npz"


def crafted(src, dst, drop=(), **flags):
    """A copy of checkpoint `src` whose stored flags are changed (and arrays `drop` left out)."""
    with np.load(src) as d:
        arrays = {k: d[k] for k in d.files if k not in drop}
    meta = json.loads(arrays["__meta__"].tobytes())
    meta["flags"].update(flags)
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(dst, **arrays)
    return dst


@pytest.mark.parametrize("flag, option, value", [
    ("dataset_name", "--dataset", "{code}"),
    ("model_name", "--model", "{code}"),
    ("gradient_weighting", "--gradient_weighting", "{code}:weights"),
    ("balance", "--balance", "{code}:Policy"),
])
def test_stored_flags_that_name_code_never_run_it(tmp_path, checkpoint, flag, option, value):
    marker, code = tmp_path / "ran.txt", tmp_path / "evil.py"
    code.write_text(CODE.format(marker=str(marker)))
    value = value.format(code=code)
    ck = crafted(checkpoint, tmp_path / "crafted.npz", **{flag: value})
    line = one_line(launch(tmp_path, "--resume", ck, "--num_epochs", "2"))
    assert line == (f"pydtnn: error: checkpoint {ck}: its run used {option} {value}, which is code, and a checkpoint "
                    f"never loads code: give {option} {value} on the command line to run it"), line
    assert not marker.exists()


def test_code_given_on_the_command_line_runs(tmp_path, checkpoint):
    """What the refusal says to do: the same file named on the command line is the user's choice (it runs)."""
    marker, code = tmp_path / "ran.txt", tmp_path / "data.py"
    code.write_text(CODE.format(marker=str(marker)))
    ck = crafted(checkpoint, tmp_path / "crafted.npz", dataset_name=str(code))
    r = launch(tmp_path, "--resume", ck, "--num_epochs", "2", "--dataset", code, "--synthetic_samples", "64")
    assert r.returncode == 0, r.stderr
    assert marker.read_text() == "this code ran" and "epoch 2:" in r.stdout


def test_a_stored_data_folder_is_never_read(tmp_path, checkpoint):
    ck = crafted(checkpoint, tmp_path / "crafted.npz", dataset_train_path="/etc")
    line = one_line(launch(tmp_path, "--resume", ck, "--num_epochs", "2"))
    assert line == (f"pydtnn: error: checkpoint {ck}: its run read --dataset_train_path /etc, and a checkpoint never "
                    f"chooses a path: give --dataset_train_path on the command line"), line


def test_stored_outputs_are_never_written(tmp_path, checkpoint):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "h.csv").write_text("precious")
    work = tmp_path / "work" / "run"
    work.mkdir(parents=True)
    ck = crafted(checkpoint, tmp_path / "crafted.npz", history_file=str(victim / "h.csv"),
                 save_weights_and_bias_filename=str(victim / "w.npz"), checkpoint_dir="../../elsewhere",
                 step_history_file=str(victim / "s.csv"), tensorboard_dir=str(victim / "tb"),
                 plots_dir=str(victim / "plots"), tracer_output=str(victim / "t.json"), tracing=True)
    r = launch(work, "--resume", ck, "--num_epochs", "2", "--lr_schedulers", "model_checkpoint",
               "--model_checkpoint_save_freq", "1")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(victim)) == ["h.csv"] and (victim / "h.csv").read_text() == "precious"
    assert not (tmp_path / "elsewhere").exists()
    assert os.listdir(work / "checkpoints") == ["epoch_0002.npz"]        # this command line's folder
    assert "resume: outputs come from this command line, not from the checkpoint's run (which wrote " \
           f"--history_file {victim / 'h.csv'}, --save_weights_and_bias_filename {victim / 'w.npz'}" in r.stdout


def test_a_checkpoint_without_its_optimizer_state_is_refused(tmp_path, checkpoint):
    ck = crafted(checkpoint, tmp_path / "crafted.npz", drop=("optimizer/velocity",))
    line = one_line(launch(tmp_path, "--resume", ck, "--num_epochs", "2"))
    assert line == (f"pydtnn: error: checkpoint {ck} lacks the sgd optimizer's state optimizer/velocity after 8 "
                    f"steps: resuming from it would restart it from zero and not continue the run; resume from a "
                    f"complete checkpoint, or load its weights alone with --weights_and_bias_filename"), line
    # what the line offers: its weights alone, with a fresh optimizer
    r = launch(tmp_path, *RUN, "--weights_and_bias_filename", ck, "--num_epochs", "1")
    assert r.returncode == 0, r.stderr
