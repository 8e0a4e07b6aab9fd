"""Nothing lost: outputs checked before work, write failures as one line, preemption checkpoints that resume
bit-exactly (sequential and MPI), step checkpoints, resume that obeys the command line, elastic P -> Q resume,
validated checkpoint metadata and hyper-parameters."""
import csv
import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mpi_helpers import SCRIPTS, output_of_our_processes, run_mpi
from pydtnn import cli, outputs
from pydtnn.training.checkpointing import FORMAT, validate_meta
from pydtnn.errors import CheckpointError, OutputError

from paths import REPO_DIR as REPO  # noqa: E402
LAUNCHER = os.path.join(REPO, "scripts", "pydtnn_benchmark.py")
WRAPPER = str(SCRIPTS / "signal_at_step.py")
# 192 training samples, 6 steps of 32 per epoch
BASE = ["--model", "simplecnn", "--synthetic_samples", "256", "--validation_split", "0.25", "--progress_bar",
        "false", "--seed", "3", "--lr_schedulers", "model_checkpoint,reduce_lr_on_plateau",
        "--model_checkpoint_save_freq", "1", "--reduce_lr_on_plateau_patience", "0"]
SEQ = [*BASE, "--batch_size", "32"]
MPI = [*BASE, "--parallel", "data", "--global_batch_size", "32"]
TIMING = ("time_s", "samples_per_s", "_compute_s", "_wait_s")


def env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=REPO,
                **{k: str(v) for k, v in extra.items()})


def launch(*args, script=LAUNCHER, cwd=None, timeout=300, **extra):
    return subprocess.run([sys.executable, script, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO, env=env(**extra))


def one_line(r, needle, status=2):
    lines = output_of_our_processes(r, r.stderr)       # under Open MPI, less prterun's own notice
    assert r.returncode == status, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr
    assert lines and needle in lines[-1], r.stderr
    return lines[-1]


def same_weights(a, b):
    with np.load(a) as x, np.load(b) as y:
        assert sorted(x.files) == sorted(y.files)
        for k in x.files:
            assert np.array_equal(x[k], y[k]), k


def rows(path):
    with open(path) as f:
        return [{k: v for k, v in r.items() if not k.endswith(TIMING)} for r in csv.DictReader(f)]


def meta_of(path):
    with np.load(path) as d:
        return json.loads(d["__meta__"].tobytes())


def no_tmp(folder):
    return [n for n in os.listdir(folder) if n.startswith(".tmp")] == []


# ---------------------------------------------------------------------------------------- check before work

def _bad_outputs(tmp):
    (tmp / "file").write_text("x")
    (tmp / "dir").mkdir()
    return {
        "history in missing folder": (["--history_file", tmp / "nope" / "h.csv"], "does not exist"),
        "history below a file": (["--history_file", tmp / "file" / "h.csv"], "is not a folder"),
        "history is a directory": (["--history_file", tmp / "dir"], "is a directory"),
        "history empty name": (["--history_file", ""], "empty file name"),
        "trace in missing folder": (["--tracing", "true", "--tracer_output", tmp / "nope" / "t.json"], "does not exist"),
        "weights is a directory": (["--save_weights_and_bias_filename", tmp / "dir"], "is a directory"),
        "weights empty name": (["--save_weights_and_bias_filename", ""], "empty file name"),
        "checkpoint dir is a file": (["--checkpoint_dir", tmp / "file"], "is not a folder"),
        "checkpoint dir below a file": (["--checkpoint_dir", tmp / "file" / "ck"], "is not a folder"),
    }


BAD_OUTPUTS = ["history in missing folder", "history below a file", "history is a directory", "history empty name",
               "trace in missing folder", "weights is a directory", "weights empty name", "checkpoint dir is a file",
               "checkpoint dir below a file"]


@pytest.mark.parametrize("case", BAD_OUTPUTS)
def test_output_paths_checked_before_the_first_step(tmp_path, case):
    args, needle = _bad_outputs(tmp_path)[case]
    r = launch(*SEQ, "--num_epochs", "50", *args, cwd=tmp_path)
    line = one_line(r, needle)
    assert line.startswith("pydtnn: error:") and "epoch 1" not in r.stdout + r.stderr   # refused before training
    assert no_tmp(tmp_path) and sorted(os.listdir(tmp_path)) == ["dir", "file"]


def test_read_only_folder_is_refused_up_front(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)
    with pytest.raises(OutputError, match="h.csv: cannot write into .*Read-only file system"):
        outputs.check_output_file(str(tmp_path / "h.csv"), "--history_file")
    with pytest.raises(OutputError, match="--checkpoint_dir .*Read-only file system"):
        outputs.check_output_dir(str(tmp_path / "ck"), "--checkpoint_dir", create=False)
    assert not (tmp_path / "ck").exists()


# ------------------------------------------------------------------------- write failures during training

def _fail_writes_of(monkeypatch, suffix, err=errno.ENOSPC):
    """fsync fails with `err` for the writer's temporary files ending in `suffix` (as on a full disk)."""
    real = os.fsync

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.basename(target).startswith(outputs.TMP_PREFIX) and target.endswith(suffix):
            raise OSError(err, os.strerror(err))
        return real(fd)
    monkeypatch.setattr(outputs.os, "fsync", fsync)


def _main(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    return e.value.code, [l for l in err.splitlines() if l.strip()]


def test_a_batch_whose_activations_cannot_fit_is_refused_before_allocating(monkeypatch, capsys):
    from pydtnn.launch import limits
    monkeypatch.setattr(limits, "physical_memory", lambda: 2 ** 20)          # a machine of 1 MiB
    code, lines = _main([*HP, "--num_epochs", "1"], capsys)
    assert code == 2 and len(lines) == 1
    assert "a local batch of 32 samples of simplecnn needs about" in lines[0] and "lower --batch_size" in lines[0]


def test_full_disk_on_history_is_one_line_and_keeps_the_trained_state(tmp_path, monkeypatch, capsys):
    _fail_writes_of(monkeypatch, ".csv")
    ckpt = tmp_path / "ck" / "epoch_0001_step_000000.npz"
    code, lines = _main([*SEQ, "--num_epochs", "2", "--history_file", tmp_path / "h.csv", "--checkpoint_dir",
                         tmp_path / "ck", "--save_weights_and_bias_filename", tmp_path / "w.npz"], capsys)
    assert code == 2 and len(lines) == 1
    assert lines[0] == (f"pydtnn: error: cannot write {tmp_path / 'h.csv'}: No space left on device; training "
                        f"stopped after epoch 1 of 2: its checkpoint was written to {ckpt} (continue with --resume "
                        f"{ckpt}); the trained weights were saved to {tmp_path / 'w.npz'}")
    assert no_tmp(tmp_path) and not (tmp_path / "h.csv").exists()
    assert meta_of(ckpt)["epoch"] == 1 and len(meta_of(ckpt)["history"]) == 1
    with np.load(tmp_path / "w.npz") as w, np.load(ckpt) as c:          # the same trained weights
        assert all(np.array_equal(w[k], c[k]) for k in w.files)


def test_full_disk_on_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch, capsys):
    ck = tmp_path / "ck"
    r = launch(*SEQ, "--num_epochs", "1", "--checkpoint_dir", ck)
    assert r.returncode == 0, r.stderr
    before = (ck / "best.npz").read_bytes()
    _fail_writes_of(monkeypatch, ".npz")
    # --overwrite true: this run may replace the first run's checkpoints (refused without it)
    code, lines = _main([*SEQ, "--num_epochs", "2", "--checkpoint_dir", ck, "--overwrite", "true"], capsys)
    assert code == 2 and "No space left on device" in lines[-1] and "epoch_0001.npz" in lines[-1]
    assert (ck / "best.npz").read_bytes() == before and no_tmp(ck)


def test_final_weights_that_cannot_be_written_go_to_the_checkpoint_folder(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    out.mkdir()
    real = outputs.atomic_write

    def atomic_write(path, write, binary=True):
        if str(path).startswith(str(out)):
            raise OutputError(f"cannot write {path}: No space left on device")
        return real(path, write, binary)
    monkeypatch.setattr("pydtnn.weights.atomic_write", atomic_write)
    code, lines = _main([*SEQ, "--lr_schedulers", "", "--num_epochs", "1", "--save_weights_and_bias_filename",
                         out / "w.npz", "--checkpoint_dir", tmp_path / "ck"], capsys)
    fallback = tmp_path / "ck" / "final_weights.npz"
    assert code == 2 and [l for l in lines if l.startswith("pydtnn")] == lines[-1:]
    assert f"cannot write {out / 'w.npz'}: No space left on device" in lines[-1] and str(fallback) in lines[-1]
    with np.load(fallback) as d:
        assert "conv2d/weights" in d.files


def test_files_get_the_umask_permissions_and_stale_tmp_files_are_cleaned(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{outputs.TMP_PREFIX}{outputs._HOST}.{dead.pid}.abc.npz"
    live = tmp_path / f"{outputs.TMP_PREFIX}{outputs._HOST}.{os.getppid()}.abc.npz"
    other_host = tmp_path / f"{outputs.TMP_PREFIX}elsewhere.{dead.pid}.abc.npz"
    for f in (stale, live, other_host):
        f.write_bytes(b"partial")
    old = os.umask(0o022)
    try:
        outputs.atomic_write(str(tmp_path / "a.npz"), lambda f: f.write(b"1"))
        os.umask(0o077)
        outputs.atomic_write(str(tmp_path / "b.npz"), lambda f: f.write(b"1"))
    finally:
        os.umask(old)
    assert (tmp_path / "a.npz").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.npz").stat().st_mode & 0o777 == 0o600
    assert not stale.exists() and live.exists() and other_host.exists()


# ------------------------------------------------------------------------------------------- preemption

def test_sigterm_mid_epoch_sequential_resumes_bit_exact(tmp_path):
    full, resumed = tmp_path / "full.npz", tmp_path / "resumed.npz"
    r = launch(*SEQ, "--num_epochs", "3", "--checkpoint_dir", tmp_path / "a", "--save_weights_and_bias_filename",
               full, "--history_file", tmp_path / "full.csv")
    assert r.returncode == 0, r.stderr
    # the 10th step is epoch 2, step 4 of 6
    r = launch(*SEQ, "--num_epochs", "3", "--checkpoint_dir", tmp_path / "b", "--history_file",
               tmp_path / "resumed.csv", script=WRAPPER, SIGNAL_AT_STEP=10)
    ckpt = tmp_path / "b" / "epoch_0001_step_000004.npz"
    line = one_line(r, str(ckpt), status=cli.EXIT_PREEMPTED)
    assert line.startswith("pydtnn: SIGTERM received") and "--resume" in line
    assert meta_of(ckpt)["step"] == 4 and len(meta_of(ckpt)["history"]) == 1
    r = launch(*SEQ, "--num_epochs", "3", "--checkpoint_dir", tmp_path / "c", "--resume", ckpt,
               "--history_file", tmp_path / "resumed.csv", "--save_weights_and_bias_filename", resumed)
    assert r.returncode == 0, r.stderr
    same_weights(full, resumed)
    assert rows(tmp_path / "full.csv") == rows(tmp_path / "resumed.csv")
    assert [r["epoch"] for r in rows(tmp_path / "resumed.csv")] == ["1", "2", "3"]


def test_sigusr1_also_writes_a_checkpoint(tmp_path):
    r = launch(*SEQ, "--num_epochs", "3", "--checkpoint_dir", tmp_path, script=WRAPPER, SIGNAL_AT_STEP=3,
               SIGNAL_NAME="SIGUSR1")
    one_line(r, "SIGUSR1 received", status=cli.EXIT_PREEMPTED)
    assert meta_of(tmp_path / "epoch_0000_step_000003.npz")["step"] == 3


def test_sigterm_on_one_rank_of_two_stops_both_and_resumes_bit_exact(tmp_path):
    full, resumed = tmp_path / "full.npz", tmp_path / "resumed.npz"
    run_mpi(2, LAUNCHER, [*MPI, "--num_epochs", "3", "--checkpoint_dir", tmp_path / "a",
                          "--save_weights_and_bias_filename", full], timeout=180, check=True)
    # only rank 1 gets the signal, in its 9th step (epoch 2, step 3): both ranks must stop after it
    r = run_mpi(2, WRAPPER, [*MPI, "--num_epochs", "3", "--checkpoint_dir", tmp_path / "b"], timeout=180,
                env={"SIGNAL_AT_STEP": 9, "SIGNAL_RANK": 1})
    ckpt = tmp_path / "b" / "epoch_0001_step_000003.npz"
    one_line(r, str(ckpt), status=cli.EXIT_PREEMPTED)
    run_mpi(2, LAUNCHER, [*MPI, "--num_epochs", "3", "--checkpoint_dir", tmp_path / "c", "--resume", ckpt,
                          "--save_weights_and_bias_filename", resumed], timeout=180, check=True)
    same_weights(full, resumed)


# SIGTERM and SIGINT sent to mpiexec itself (MPICH and Open MPI): tests/training/test_output_rescue.py


def test_step_checkpoints_keep_the_newest_and_resume_bit_exact(tmp_path):
    full, resumed = tmp_path / "full.npz", tmp_path / "resumed.npz"
    flags = [*SEQ, "--lr_schedulers", "", "--model_checkpoint_save_steps", "4"]
    r = launch(*flags, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "a", "--save_weights_and_bias_filename", full)
    assert r.returncode == 0, r.stderr
    # steps 4 and 8 of 12: only the newest is kept (the 12th is the end of training)
    assert sorted(os.listdir(tmp_path / "a")) == ["epoch_0001_step_000002.npz"]
    r = launch(*flags, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "b", "--resume",
               tmp_path / "a" / "epoch_0001_step_000002.npz", "--save_weights_and_bias_filename", resumed)
    assert r.returncode == 0, r.stderr
    same_weights(full, resumed)


# ------------------------------------------------------------------------------------------ resume semantics

def test_resume_obeys_the_command_line_and_keeps_every_epoch(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    r = launch(*SEQ, "--num_epochs", "1", "--checkpoint_dir", a)
    assert r.returncode == 0, r.stderr
    ckpt = a / "epoch_0001.npz"
    meta = meta_of(ckpt)
    assert [h["epoch"] for h in meta["history"]] == [1]           # the checkpoint holds epoch 1's row
    names = dict(meta["schedulers"])
    assert "checkpoint_dir" not in names["model_checkpoint"] and "patience" not in names["reduce_lr_on_plateau"]
    r = launch(*SEQ, "--num_epochs", "3", "--checkpoint_dir", b, "--resume", ckpt, "--history_file", tmp_path / "h.csv")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(a)) == ["best.npz", "epoch_0001.npz"]
    assert {"epoch_0002.npz", "epoch_0003.npz", "best.npz"} <= set(os.listdir(b))
    assert [r["epoch"] for r in rows(tmp_path / "h.csv")] == ["1", "2", "3"]


def test_crafted_scheduler_state_cannot_redirect_writes(tmp_path):
    from pydtnn.schedulers import ModelCheckpoint, ReduceLROnPlateau
    s = ModelCheckpoint("val_loss", save_freq=1, checkpoint_dir=str(tmp_path / "mine"))
    s.load_state_dict({"checkpoint_dir": "/etc", "save_freq": 99, "best": 0.5, "wait": 0, "metric": "val_loss"})
    assert s.checkpoint_dir == str(tmp_path / "mine") and s.save_freq == 1 and s.best == 0.5
    r = ReduceLROnPlateau("val_loss", factor=0.5, patience=3)
    r.load_state_dict({"factor": 0.0, "patience": 0, "best": 0.1, "wait": 2, "metric": "val_accuracy"})
    assert r.factor == 0.5 and r.patience == 3 and r.best == np.inf      # another metric's best is dropped


# ---------------------------------------------------------------------------------------------- elastic

ELASTIC = ["--model", "simplecnn", "--synthetic_samples", "256", "--progress_bar", "false", "--seed", "4",
           "--parallel", "data", "--global_batch_size", "48", "--dtype", "float64", "--lr_schedulers", "",
           "--balance", "static"]


def test_static_two_ranks_resumed_on_three_matches_the_two_rank_run(tmp_path):
    full, resumed = tmp_path / "full.npz", tmp_path / "resumed.npz"
    run_mpi(2, LAUNCHER, [*ELASTIC, "--replica_speeds", "1,3", "--num_epochs", "2", "--checkpoint_dir", tmp_path / "a",
                          "--model_checkpoint_save_steps", "4", "--save_weights_and_bias_filename", full],
            timeout=180, check=True)
    ckpt = tmp_path / "a" / "epoch_0001_step_000002.npz"        # 6 steps per epoch: a mid-epoch checkpoint
    assert meta_of(ckpt)["nreplicas"] == 2 and meta_of(ckpt)["step"] == 2
    r = run_mpi(3, LAUNCHER, [*ELASTIC, "--replica_speeds", "1,2,3", "--num_epochs", "2", "--checkpoint_dir",
                              tmp_path / "b", "--resume", ckpt, "--save_weights_and_bias_filename", resumed],
                timeout=180, check=True)
    assert "split as [8, 16, 24]" in r.stdout
    with np.load(full) as x, np.load(resumed) as y:
        for k in x.files:
            scale = max(np.abs(x[k]).max(), 1e-300)
            assert np.abs(x[k] - y[k]).max() <= 1e-9 * scale, k
        assert any(not np.array_equal(x[k], y[k]) for k in x.files)   # really another split: rounding differs


def test_dynamic_two_rank_checkpoint_resumes_on_three(tmp_path):
    flags = [*ELASTIC[:-2], "--balance", "dynamic", "--rebalance_interval", "2"]
    run_mpi(2, LAUNCHER, [*flags, "--num_epochs", "1", "--checkpoint_dir", tmp_path, "--lr_schedulers",
                          "model_checkpoint", "--model_checkpoint_save_freq", "1", "--model_checkpoint_metric", "loss"],
            timeout=180, check=True)
    ckpt = tmp_path / "epoch_0001.npz"
    assert meta_of(ckpt)["balancer"]["model"]["replicas"]          # the dynamic policy's cost model
    r = run_mpi(3, LAUNCHER, [*flags, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "q", "--resume", ckpt,
                              "--history_file", tmp_path / "h.csv"], timeout=180)
    assert r.returncode == 0, r.stderr
    assert "do not apply to 3" in r.stdout and "Traceback" not in r.stderr
    assert [row["epoch"] for row in rows(tmp_path / "h.csv")] == ["1", "2"]
    assert "rank2_b" in rows(tmp_path / "h.csv")[1]


# ------------------------------------------------------------------------------------ checkpoint metadata

def _good_meta():
    return {"format": FORMAT, "epoch": 1, "step": 0, "nreplicas": 1, "seed": 0, "nparams": 10,
            "optimizer_name": "sgd", "history": [], "flags": {}, "optimizer": {"learning_rate": 0.1, "iterations": 3},
            "sizes": [32], "rng_states": [None], "schedulers": [], "balancer": None}


BAD_META = {
    "a list": (lambda m: [m], "(top level)"),
    "missing epoch": (lambda m: m.pop("epoch"), "'epoch'"),
    "non-integer epoch": (lambda m: m.update(epoch="2"), "'epoch'"),
    "negative step": (lambda m: m.update(step=-1), "'step'"),
    "boolean replicas": (lambda m: m.update(nreplicas=True), "'nreplicas'"),
    "sizes of another count": (lambda m: m.update(sizes=[16, 16]), "'sizes'"),
    "rng not objects": (lambda m: m.update(rng_states=[7]), "'rng_states'"),
    "history not rows": (lambda m: m.update(history=[1, 2]), "'history'"),
    "schedulers not pairs": (lambda m: m.update(schedulers={"a": 1}), "'schedulers'"),
    "balancer garbage": (lambda m: m.update(balancer={"sizes": "x"}), "'balancer.sizes'"),
    "balancer window rows": (lambda m: m.update(balancer={"sizes": [32], "ema": [], "window": [[1.0, 2.0]],
                                                          "n_observed": 1, "n_rebalances": 0}), "'balancer.window'"),
    "zero learning rate": (lambda m: m["optimizer"].update(learning_rate=0), "'optimizer.learning_rate'"),
    "mid-epoch without sums": (lambda m: m.update(step=2), "'partial_epoch'"),
}


@pytest.mark.parametrize("case", sorted(BAD_META))
def test_metadata_is_validated_field_by_field(case):
    change, field = BAD_META[case]
    meta = _good_meta()
    out = change(meta)
    meta = out if isinstance(out, list) else meta
    with pytest.raises(CheckpointError, match=f"field {field}" if field.startswith("'") else "top level"):
        validate_meta(meta, "c.npz")
    validate_meta(_good_meta(), "c.npz")


def test_bad_metadata_through_the_launcher_is_one_line(tmp_path):
    r = launch(*SEQ, "--num_epochs", "1", "--checkpoint_dir", tmp_path)
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "epoch_0001.npz") as d:
        arrays = {k: d[k] for k in d.files}
    meta = json.loads(arrays["__meta__"].tobytes())
    meta["rng_states"] = [{"bit_generator": "PCG64", "state": "garbage"}]
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(tmp_path / "bad.npz", **arrays)
    line = one_line(launch(*SEQ, "--resume", tmp_path / "bad.npz"), "rng_states[0]")
    assert "bad.npz" in line


# ---------------------------------------------------------------------------------------- bad hyper-parameters

BAD_FLAGS = {
    "beta1 above 1": (["--optimizer", "adam", "--beta1", "2"], "beta1 must be in [0, 1)"),
    "beta2 negative": (["--optimizer", "nadam", "--beta2", "-1"], "beta2 must be in [0, 1)"),
    "epsilon negative": (["--optimizer", "adam", "--epsilon", "-1"], "epsilon must be > 0"),
    "rho one": (["--optimizer", "rmsprop", "--rho", "1"], "rho must be in [0, 1)"),
    "plateau factor negative": (["--lr_schedulers", "reduce_lr_on_plateau", "--reduce_lr_on_plateau_factor", "-1"],
                                "factor must be in (0, 1)"),
    "every-n factor one": (["--lr_schedulers", "reduce_lr_every_nepochs", "--reduce_lr_every_nepochs_factor", "1"],
                           "factor must be in (0, 1)"),
    "unknown checkpoint metric": (["--lr_schedulers", "model_checkpoint", "--model_checkpoint_metric", "val_foo"],
                                  "'val_foo' is not logged"),
    "unknown early-stopping metric": (["--lr_schedulers", "early_stopping", "--early_stopping_metric", "los"],
                                      "'los' is not logged"),
    "stop_at_loss always reached": (["--lr_schedulers", "stop_at_loss"], "(0, 1]"),
    "negative seed": (["--seed", "-1"], "--seed"),
    "no such model file": (["--model", "/no/such/file.py"], "no such file"),
    "batch larger than the data": (["--batch_size", "10000000000", "--steps_per_epoch", "1"],
                                   "--batch_size 10000000000: a global batch of 10000000000 samples is larger "
                                   "than the 192 training samples (after --validation_split)"),
    "global batch larger than the data": (["--global_batch_size", "193"],
                                          "--global_batch_size 193: a global batch of 193 samples is larger"),
    "samples that cannot fit": (["--synthetic_samples", "100000000000"], "lower --synthetic_samples"),
    "empty checkpoint dir": (["--checkpoint_dir", ""], "empty folder name"),
    "negative save minutes": (["--model_checkpoint_save_minutes", "-1"], "save_minutes"),
}


HP = ["--model", "simplecnn", "--synthetic_samples", "256", "--batch_size", "32", "--progress_bar", "false",
      "--lr_schedulers", "", "--validation_split", "0.25"]


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_bad_hyper_parameters_one_line(case, tmp_path):
    args, needle = BAD_FLAGS[case]
    line = one_line(launch(*HP, *args, cwd=tmp_path), needle)
    assert line.startswith("pydtnn: error:") and os.listdir(tmp_path) == []


def test_timed_checkpoints_follow_rank0s_clock(tmp_path):
    """--model_checkpoint_save_minutes, with a clock that advances 25 s per step: one checkpoint every 3 steps."""
    from pydtnn.datasets import load_dataset
    from pydtnn.model import Model
    from pydtnn.models import build_model
    from pydtnn.optimizers import SGD
    from pydtnn.training.loop import Trainer
    model = Model(backend="cpu", seed=0)
    build_model("simplemlp", model)
    data = load_dataset("synthetic", input_shape=model.input_shape, nclasses=10, synthetic_samples=256, seed=0)
    now = [0.0]
    trainer = Trainer(model, data, SGD(learning_rate=0.01), global_batch=32, progress=False, log=lambda m: None,
                      checkpoint_dir=str(tmp_path), save_minutes=1.0, clock=lambda: now[0])
    step = trainer.train_step

    def timed_step(*a):
        now[0] += 25.0
        return step(*a)
    trainer.train_step = timed_step
    written = []
    save = trainer.save_checkpoint
    trainer.save_checkpoint = lambda path, epoch, **k: (written.append((os.path.basename(path))), save(path, epoch, **k))
    trainer.fit(2)                    # 8 steps per epoch: due after steps 3, 6, 9, 12, 15 (75 s >= 60 s each time)
    assert written == ["epoch_0000_step_000003.npz", "epoch_0000_step_000006.npz", "epoch_0001_step_000001.npz",
                       "epoch_0001_step_000004.npz", "epoch_0001_step_000007.npz"]
    assert sorted(os.listdir(tmp_path)) == ["epoch_0001_step_000007.npz"]
    assert meta_of(tmp_path / "epoch_0001_step_000007.npz")["partial_epoch"]["samples"] == 7 * 32


def test_model_checkpoint_saves_after_updating_best():
    from pydtnn.schedulers import ModelCheckpoint

    class Recorder:
        def __init__(self, s):
            self.s, self.saved = s, []

        def save_checkpoint(self, path, epoch):
            self.saved.append((os.path.basename(path), self.s.best))
    s = ModelCheckpoint("val_loss", save_freq=1)
    t = Recorder(s)
    for epoch, v in enumerate([1.0, 0.5, 0.7]):
        s.on_epoch_end(t, epoch, {"val_loss": v})
    assert t.saved == [("epoch_0001.npz", 1.0), ("best.npz", 1.0), ("epoch_0002.npz", 0.5), ("best.npz", 0.5),
                       ("epoch_0003.npz", 0.5)]


def test_saved_rng_states_are_checked_by_their_own_kind():
    """A mixed gpu,cpu job saves a GPU counter state beside NumPy states: both kinds pass, garbage does not."""
    import numpy as np
    from pydtnn.training.trainer_state import _check_rng_state
    _check_rng_state(np.random.default_rng(3).bit_generator.state)
    _check_rng_state({"bit_generator": "pydtnn.CounterRNG/splitmix64", "seed": 5, "offset": 12})
    for bad in [{"bit_generator": "PCG64", "state": "x"}, {"bit_generator": "nope"}, [1, 2],
                {"bit_generator": "pydtnn.CounterRNG/splitmix64", "seed": 5, "offset": -1}]:
        with pytest.raises((ValueError, TypeError, KeyError)):
            _check_rng_state(bad)
