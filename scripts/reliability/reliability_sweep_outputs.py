"""The sweep of issue 38's hangs, outputs and checkpoints (docs/reliability.md's first table): each case run as a
user would, its promise checked, one table row per case (the class, the case, the promise, what happened).

    python scripts/reliability/reliability_sweep_outputs.py            # every case, sequential and under this MPI
    python scripts/reliability/reliability_sweep_outputs.py --only resume --jobs 2

The MPI cases run under the MPI of this environment (MPICH in .venv, Open MPI in .venv-openmpi); run the
script in both. Every case runs in a fresh temporary folder with a time limit: a case that outlives it is a
hang, reported as such. Full disks come from tests/mpi_scripts/full_disk.py (ENOSPC or EROFS at the fsync of
the named outputs; a TensorBoard file that fills), signals from tests/mpi_scripts/signal_at_step.py or from
signalling mpiexec itself.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from pydtnn.parallel.runtime import mpirun  # noqa: E402

LAUNCHER = str(REPO / "scripts" / "pydtnn_benchmark.py")
FULL_DISK = str(REPO / "tests" / "mpi_scripts" / "full_disk.py")
AT_STEP = str(REPO / "tests" / "mpi_scripts" / "signal_at_step.py")
HANG_AFTER_S = 240
# 256 samples in 8 steps of 32 per epoch; under MPI the same global batch
BASE = ["--model", "simplecnn", "--synthetic_samples", "256", "--progress_bar", "false", "--seed", "3",
        "--lr_schedulers", "", "--num_epochs", "3"]
SEQ = [*BASE, "--batch_size", "32"]
MPI = [*BASE, "--parallel", "data", "--global_batch_size", "32"]
MC = ["--lr_schedulers", "model_checkpoint", "--model_checkpoint_save_freq", "1"]


@dataclass
class Case:
    cls: str
    name: str
    promise: str
    run: object                      # run(folder) -> (status, stdout, stderr); may raise Timeout
    check: object                    # check(folder, status, out, err) -> (ok, what happened)
    mpi: bool = False
    notes: list = field(default_factory=list)


class Hang(Exception):
    pass


# ------------------------------------------------------------------------------------------ running

def _env(folder, **extra):
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(REPO),
                TMPDIR=str(Path(folder) / "systmp"), PYDTNN_ERROR_SYNC_S="600",
                **{k: str(v) for k, v in extra.items()})


def _communicate(cmd, folder, env, stdin_signal=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=folder, env=env,
                            start_new_session=True)
    try:
        if stdin_signal is not None:
            signum, when = stdin_signal
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if line.startswith(when):
                    proc.send_signal(signum)
                    break
            out, err = proc.communicate(timeout=HANG_AFTER_S)
            return proc.returncode, "".join(lines) + out, err
        out, err = proc.communicate(timeout=HANG_AFTER_S)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        raise Hang() from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def seq(*args, script=LAUNCHER, **env):
    return lambda folder: _communicate([sys.executable, script, *map(str, args)], folder, _env(folder, **env))


def mpi(n, *args, script=LAUNCHER, **env):
    return lambda folder: _communicate(mpirun.mpi_command(n, script, list(map(str, args))), folder,
                                       _env(folder, **env))


def mpmd(programs, **env):
    return lambda folder: _communicate(mpirun.mpmd_command([(n, LAUNCHER, list(map(str, a))) for n, a in programs]),
                                       folder, _env(folder, **env))


def signal_launcher(n, signum, *args):
    """mpiexec itself gets `signum` once training is under way (epoch 1 reported)."""
    return lambda folder: _communicate(mpirun.mpi_command(n, LAUNCHER, list(map(str, args))), folder,
                                       _env(folder), stdin_signal=(signum, "epoch 1:"))


def in_out(run):
    """`run` with the folder out/ made first (its outputs' folder must exist)."""
    def wrapped(folder):
        (Path(folder) / "out").mkdir()
        return run(folder)
    return wrapped


def then(first, second):
    """Run `first`, then `second` in the same folder (a run, then its resume); the second's result."""
    def run(folder):
        first(folder)
        return second(folder)
    return run


# ----------------------------------------------------------------------------------------- checking

def _ours(err):
    """Our processes' lines (Open MPI's fixed non-zero exit notice removed)."""
    from_prterun = ("prterun detected", "thus causing the job", "Process name:", "Exit code:", "-----")
    return [l for l in err.splitlines() if l.strip() and not l.strip().startswith(from_prterun)]


def _short(text, n=120):
    return text if len(text) <= n else text[:n - 3] + "..."


def one_line(status=2, needles=(), files=(), absent=(), resumable=None, same_as=None):
    """Exit `status`, exactly one line of ours on stderr holding every needle; `files` exist, `absent` do not;
    `resumable`: a checkpoint that must hold (epoch, step)."""
    def check(folder, st, out, err):
        lines = _ours(err)
        problems = []
        if st != status:
            problems.append(f"exit {st}, not {status}")
        if "Traceback" in err:
            problems.append("a traceback")
        if len(lines) != 1:
            problems.append(f"{len(lines)} lines")
        last = (lines[-1] if lines else "").replace(str(folder) + "/", "").replace(str(folder), ".")
        problems += [f"no '{n}'" for n in needles if n not in last]
        problems += [f"{f} missing" for f in files if not (Path(folder) / f).exists()]
        problems += [f"{f} written" for f in absent if (Path(folder) / f).exists()]
        if resumable:
            path, point = resumable
            got = _point(Path(folder) / path)
            if got != point:
                problems.append(f"{path} holds {got}, not {point}")
        what = f"exit {st}: `{_short(last)}`"
        return not problems, what + ("" if not problems else " -- " + "; ".join(problems))
    return check


def completes(files=(), absent=(), stdout_has=()):
    def check(folder, st, out, err):
        problems = [f"exit {st}"] if st != 0 else []
        problems += [f"{f} missing" for f in files if not (Path(folder) / f).exists()]
        problems += [f"{f} written" for f in absent if (Path(folder) / f).exists()]
        problems += [f"no '{s}' on stdout" for s in stdout_has if s not in out]
        if "Traceback" in err:
            problems.append("a traceback")
        return not problems, f"exit {st}" + (", " + ", ".join(str(f) for f in files) + " written" if files else "") + \
            ("" if not problems else " -- " + "; ".join(problems))
    return check


def _point(path):
    try:
        with np.load(path) as d:
            meta = json.loads(d["__meta__"].tobytes())
        return meta["epoch"], meta["step"]
    except (OSError, KeyError, ValueError):
        return None


def run_case(case):
    folder = tempfile.mkdtemp(prefix="pydtnn-sweep-")
    (Path(folder) / "systmp").mkdir()
    t0 = time.monotonic()
    try:
        status, out, err = case.run(folder)
    except Hang:
        return case, False, f"HANG: no end within {HANG_AFTER_S} s", time.monotonic() - t0
    ok, what = case.check(folder, status, out, err)
    return case, ok, what, time.monotonic() - t0


# ------------------------------------------------------------------------------------------- the cases

def _checkpoint_first(flags):
    """A run of one epoch writing ck/epoch_0001.npz (model_checkpoint), for cases that resume or craft it."""
    return seq(*SEQ, "--num_epochs", "1", *MC, "--checkpoint_dir", "ck", *flags)


def _craft(**flags_or_drop):
    """Rewrite ck/epoch_0001.npz's stored flags (and drop arrays named in `drop`) into ck/crafted.npz."""
    drop = flags_or_drop.pop("drop", ())

    def run(folder):
        src, dst = Path(folder) / "ck" / "epoch_0001.npz", Path(folder) / "crafted.npz"
        with np.load(src) as d:
            arrays = {k: d[k] for k in d.files if k not in drop}
        meta = json.loads(arrays["__meta__"].tobytes())
        meta["flags"].update({k: v.replace("{folder}", folder) if isinstance(v, str) else v
                              for k, v in flags_or_drop.items()})
        arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        np.savez(dst, **arrays)
        return 0, "", ""
    return run


CODE = '''
open({marker!r}, "w").write("ran")
import numpy as np
def create_dataset(seed):
    return np.zeros((64, 1, 28, 28), np.float32), np.arange(64) % 10
def create_model(model):
    pass
def weights(sizes):
    return [1 / len(sizes)] * len(sizes)
from pydtnn.parallel.balance import BalancePolicy
class P(BalancePolicy):
    pass
'''


def _with_code(run):
    def wrapped(folder):
        (Path(folder) / "evil.py").write_text(CODE.format(marker=str(Path(folder) / "ran.txt")))
        return run(folder)
    return wrapped


def _dataset_file(kind):
    n, side, classes, dtype = {"samples": ("64 + 8 * (R == 1)", "8", "4", "np.float32"),
                               "shape": ("64", "8 + (R == 1)", "4", "np.float32"),
                               "classes": ("64", "8", "4 + (R == 1)", "np.float32"),
                               "dtype": ("64", "8", "4", "np.float64 if R == 1 else np.float32"),
                               "test split": ("64", "8", "4", "np.float32"),
                               "same": ("64", "8", "4", "np.float32")}[kind]
    test = "x[:8], y[:8]" if kind == "test split" else None
    ret = f"x, y, {test}" if test else "x, y"
    body = (f"import numpy as np\nfrom mpi4py import MPI\nR = MPI.COMM_WORLD.Get_rank()\n"
            f"def create_dataset(seed):\n    rng = np.random.default_rng(seed)\n    n = {n}\n"
            f"    x = rng.random((n, 1, {side}, {side})).astype({dtype})\n    y = rng.integers(0, {classes}, n)\n")
    if test:
        body += f"    if R == 1:\n        return x, y\n    return {ret}\n"
    else:
        body += f"    return {ret}\n"
    return body


def cases():
    out = []
    add = out.append
    H, N, D = "hang", "nothing lost", "checkpoint is data"
    # --- hangs: a full disk under TensorBoard, sequential and under MPI --------------------------------
    for after, where in ((0, "from the start"), (1, "after 1 flush"), (2, "after 2 flushes")):
        needles = ["cannot write TensorBoard events into tb: No space left on device"]
        point = {0: None, 1: (1, 2), 2: (2, 2)}[after]
        ck = None if point is None else f"ck/epoch_{point[0]:04d}_step_{point[1]:06d}.npz"
        chk = one_line(needles=needles + ([] if ck is None else [ck]),
                       resumable=None if ck is None else (ck, point), files=() if ck is None else ("w.npz",))
        add(Case(H, f"--tensorboard_dir on a full disk, {where}", "no hang; one line; the state saved",
                 seq(*SEQ, "--tensorboard_dir", "tb", "--checkpoint_dir", "ck", "--save_weights_and_bias_filename",
                     "w.npz", script=FULL_DISK, FULL_DISK="tensorboard", FULL_DISK_AFTER=after), chk))
        for n in (2, 3):
            add(Case(H, f"--tensorboard_dir on a full disk, {where}, {n} ranks", "no hang; one line; the state saved",
                     mpi(n, *MPI, "--tensorboard_dir", "tb", "--checkpoint_dir", "ck",
                         "--save_weights_and_bias_filename", "w.npz", script=FULL_DISK, FULL_DISK="tensorboard",
                         FULL_DISK_AFTER=after), chk, mpi=True))
    # --- hangs: per-rank outputs (MPMD) -----------------------------------------------------------------
    outs = {"--history_file": "h.csv", "--save_weights_and_bias_filename": "w.npz", "--step_history_file": "s.csv",
            "--tensorboard_dir": "tb", "--plots_dir": "plots", "--checkpoint_dir": "ck2"}
    for flag, name in outs.items():
        made = {"--plots_dir": "plots/replicas.png", "--checkpoint_dir": None}.get(flag, name)
        add(Case(H, f"{flag} on rank 0 only (MPMD)", "every collective entered by every rank; rank 0 writes it",
                 mpmd([(1, [*MPI, flag, name]), (2, MPI)]), completes(files=[made] if made else []), mpi=True))
        add(Case(H, f"{flag} on ranks 1-2 only (MPMD)", "no hang; rank 0's outputs (none) are the run's",
                 mpmd([(1, MPI), (2, [*MPI, flag, name])]), completes(absent=[name], stdout_has=["note: rank 1's"]),
                 mpi=True))
    add(Case(H, "--tracer_output differing on every rank (MPMD)", "rank 0's trace only",
             mpmd([(1, [*MPI, "--tracing", "true", "--tracer_output", "t0.json"]),
                   (2, [*MPI, "--tracing", "true", "--tracer_output", "t1.json"])]),
             completes(files=["t0.json"], absent=["t1.json"]), mpi=True))
    add(Case(H, "every output named on ranks 1-2 only, a SIGTERM in epoch 2 (MPMD)",
             "no hang; the checkpoint in rank 0's --checkpoint_dir",
             lambda folder: _communicate(mpirun.mpmd_command([
                 (1, AT_STEP, [*MPI]), (2, AT_STEP, [*MPI, "--history_file", "h.csv", "--checkpoint_dir", "x"])]),
                 folder, _env(folder, SIGNAL_AT_STEP=10, SIGNAL_RANK=1)),
             one_line(status=3, needles=["checkpoints/epoch_0001_step_000002.npz"], absent=["x", "h.csv"]), mpi=True))
    # --- hangs: a dataset that differs between ranks ----------------------------------------------------
    for kind, needle in (("samples", "training samples 64 on rank"), ("shape", "input shape (1, 8, 8) on"),
                         ("classes", "classes 4 on"), ("dtype", "input type float32 on"),
                         ("test split", "test samples 8 on")):
        for n in (2, 3):
            def run(folder, kind=kind, n=n):
                (Path(folder) / "d.py").write_text(_dataset_file(kind))
                return mpi(n, *MPI, "--dataset", "d.py", "--model", "simplemlp")(folder)
            add(Case(H, f"a dataset file whose {kind} differ on rank 1, {n} ranks",
                     "one line naming each rank's value, before training", run,
                     one_line(needles=["the ranks loaded different data from --dataset d.py", needle]), mpi=True))

    def same(folder):
        (Path(folder) / "d.py").write_text(_dataset_file("same"))
        return mpi(3, *MPI, "--dataset", "d.py", "--model", "simplemlp")(folder)
    add(Case(H, "the same dataset file on 3 ranks", "trains", same, completes(stdout_has=["epoch 3:"]), mpi=True))
    # --- hangs: the simulator ---------------------------------------------------------------------------
    sim = [sys.executable, "-m", "pydtnn.sim", "run", "--model", "resnet20_cifar10"]
    for replicas, sweep in ((10**8, None), (10**9, None), (4, "100000000"), (10**8, "auto")):
        args = [*sim, "--global_batch_size", str(4 * replicas), "--replicas", str(replicas)]
        args += ["--sweep", sweep] if sweep else []
        add(Case(H, f"pydtnn-simulate --replicas {replicas}" + (f" --sweep {sweep}" if sweep else ""),
                 "refused in one line before allocating",
                 lambda folder, a=args: _communicate(a, folder, _env(folder)),
                 one_line(needles=["replicas needs about", "more than this machine's"])))
    add(Case(H, "pydtnn-simulate --replicas 1000000 --steps 100 --balance dynamic", "progress and the time left",
             lambda folder: _communicate([*sim, "--global_batch_size", "4000000", "--samples", "4000000",
                                          "--replicas", "1000000", "--steps", "100", "--balance", "dynamic", "--json"],
                                         folder,
                                         _env(folder, PYDTNN_PROGRESS_INTERVAL_S=5)),
             lambda folder, st, out, err: (st == 0 and "s left" in err,
                                           f"exit {st}, {len(err.splitlines())} progress lines, last "
                                           f"`{_short(err.strip().splitlines()[-1] if err.strip() else '')}`")))
    # --- nothing lost: every output, full or read-only, from the start or later --------------------------
    outputs = {  # flag args, what fails, (after, expected point) per timing
        "--history_file": (["--history_file", "h.csv"], ".csv", {0: (1, 0), 1: (2, 0)}),
        "--step_history_file": (["--step_history_file", "s.csv"], ".csv", {0: (1, 0), 1: (2, 0)}),
        "--tracer_output": (["--tracing", "true", "--tracer_output", "t.json"], ".json", {0: (3, 0)}),
        "--plots_dir": (["--plots_dir", "plots"], ".png", {0: (3, 0)}),
        "--tensorboard_dir": (["--tensorboard_dir", "tb"], "tensorboard", {1: (1, 2), 2: (2, 2)}),
    }
    for flag, (args, kind, timings) in outputs.items():
        for after, point in timings.items():
            for errno_name, word in (("ENOSPC", "full"), ("EROFS", "read-only")):
                ck = f"ck/epoch_{point[0]:04d}_step_{point[1]:06d}.npz"
                chk = one_line(needles=[ck, "the trained weights were saved to w.npz"], resumable=(ck, point),
                               files=["w.npz"])
                when = "from the start" if after == 0 else f"after {after} good writes"
                add(Case(N, f"{flag} {word}, {when}", "one line naming the failure and the rescue; state and weights kept",
                         seq(*SEQ, *args, "--checkpoint_dir", "ck", "--save_weights_and_bias_filename", "w.npz",
                             script=FULL_DISK, FULL_DISK=kind, FULL_DISK_AFTER=after, FULL_DISK_ERRNO=errno_name),
                         chk))
            if kind != "tensorboard":
                add(Case(N, f"{flag} full, after {after} writes, 2 ranks", "the same under MPI",
                         mpi(2, *MPI, *args, "--checkpoint_dir", "ck", "--save_weights_and_bias_filename", "w.npz",
                             script=FULL_DISK, FULL_DISK=kind, FULL_DISK_AFTER=after),
                         one_line(needles=[f"ck/epoch_{point[0]:04d}_step_{point[1]:06d}.npz"],
                                  resumable=(f"ck/epoch_{point[0]:04d}_step_{point[1]:06d}.npz", point)), mpi=True))
    add(Case(N, "--history_file full with the checkpoint folder full too", "the rescue goes to $TMPDIR",
             in_out(seq(*SEQ, "--history_file", "out/h.csv", "--checkpoint_dir", "out/ck", script=FULL_DISK,
                        FULL_DISK=".csv,.npz", FULL_DISK_ONLY_IN="out")),
             one_line(needles=["systmp/pydtnn-rescue-", "epoch_0001_step_000000.npz"])))
    add(Case(N, "--save_weights_and_bias_filename full", "the weights go to --checkpoint_dir/final_weights.npz",
             in_out(seq(*SEQ, "--save_weights_and_bias_filename", "out/w.npz", "--checkpoint_dir", "ck",
                        script=FULL_DISK, FULL_DISK=".npz", FULL_DISK_ONLY_IN="out")),
             one_line(needles=["ck/final_weights.npz"], files=["ck/final_weights.npz"])))
    add(Case(N, "a step checkpoint on a full disk", "one line; the rescue elsewhere",
             seq(*SEQ, "--model_checkpoint_save_steps", "5", "--checkpoint_dir", "ck", script=FULL_DISK,
                 FULL_DISK=".npz", FULL_DISK_ONLY_IN="ck"),
             one_line(needles=["cannot write", "systmp/pydtnn-rescue-"])))
    for step, name in ((3, "SIGINT in epoch 1"), (10, "SIGINT in epoch 2"), (8, "SIGINT at an epoch's last step")):
        add(Case(N, name, "the checkpoint written, exit 130",
                 seq(*SEQ, "--checkpoint_dir", "ck", script=AT_STEP, SIGNAL_AT_STEP=step, SIGNAL_NAME="SIGINT"),
                 one_line(status=130, needles=["SIGINT received: checkpoint written to ck/"])))
    add(Case(N, "SIGINT on rank 1 of 2", "every rank stops after the same step, exit 130",
             mpi(2, *MPI, "--checkpoint_dir", "ck", script=AT_STEP, SIGNAL_AT_STEP=10, SIGNAL_RANK=1,
                 SIGNAL_NAME="SIGINT"),
             one_line(status=130, needles=["ck/epoch_0001_step_000002.npz"],
                      resumable=("ck/epoch_0001_step_000002.npz", (1, 2))), mpi=True))
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        name = signal.Signals(signum).name

        def chk(folder, st, out, err, name=name):
            written = sorted(p.name for p in (Path(folder) / "ck").glob("*.npz")) if (Path(folder) / "ck").exists() else []
            said = [l for l in _ours(err) if l.startswith("pydtnn:")]
            ok = bool(said) and "Traceback" not in err and (not written or any(written[0] in l for l in said))
            said = [l.replace(str(folder) + "/", "") for l in said]
            return ok, f"exit {st}; {len(written)} checkpoint(s); said: " + " / ".join(f"`{_short(l, 110)}`" for l in said)
        add(Case(N, f"{name} to mpiexec itself, 2 ranks", "says where the checkpoint is",
                 signal_launcher(2, signum, *MPI, "--num_epochs", "100000", "--checkpoint_dir", "ck"), chk, mpi=True))
    # --- nothing lost: outputs of a resumed run --------------------------------------------------------
    full3 = seq(*SEQ, *MC, "--checkpoint_dir", "ck", "--history_file", "h.csv", "--save_weights_and_bias_filename",
                "w.npz", "--step_history_file", "s.csv")
    for flag, value, needle in (("--save_weights_and_bias_filename", "w.npz", "w.npz exists"),
                                ("--history_file", "h.csv", "is not the history of checkpoint"),
                                ("--step_history_file", "s.csv", "holds steps after checkpoint"),
                                ("--checkpoint_dir", "ck", "holds checkpoints of a later point")):
        rest = [] if flag == "--checkpoint_dir" else ["--checkpoint_dir", "ck2"]
        add(Case(N, f"resume from epoch 1 of 3 with the original {flag}", "refused before work, the file kept",
                 then(full3, seq(*SEQ, *MC, "--resume", "ck/epoch_0001.npz", flag, value, *rest)),
                 one_line(needles=[needle, "--overwrite true"])))
        add(Case(N, f"resume from epoch 1 of 3 with the original {flag} and --overwrite true", "replaced, as asked",
                 then(full3, seq(*SEQ, *MC, "--resume", "ck/epoch_0001.npz", flag, value, *rest, "--overwrite", "true")),
                 completes()))
    for flag, value in (("--history_file", "h.csv"), ("--save_weights_and_bias_filename", "w.npz"),
                        ("--step_history_file", "s.csv"), ("--tracer_output", "trace.json"),
                        ("--checkpoint_dir", "ck")):
        extra = ["--tracing", "true"] if flag == "--tracer_output" else []
        first = seq(*SEQ, *MC, "--num_epochs", "1", flag, value, *extra)
        add(Case(N, f"a new run over another run's {flag}", "refused before work",
                 then(first, seq(*SEQ, *MC, flag, value, *extra)), one_line(needles=["--overwrite true"])))
    preempt = seq(*SEQ, "--checkpoint_dir", "ck", "--history_file", "h.csv", "--step_history_file", "s.csv",
                  script=AT_STEP, SIGNAL_AT_STEP=10)
    add(Case(N, "the same command resumed after SIGTERM", "continues its own outputs without --overwrite",
             then(preempt, seq(*SEQ, "--checkpoint_dir", "ck", "--history_file", "h.csv", "--step_history_file",
                               "s.csv", "--resume", "ck/epoch_0001_step_000002.npz")),
             completes(files=["h.csv", "s.csv"])))
    # --- nothing lost: a checkpoint without its optimizer state -----------------------------------------
    for optimizer, slots in (("sgd", ["velocity"]), ("adam", ["m", "v"]), ("rmsprop", ["cache"]),
                             ("nadam", ["m"]), ("adamw", ["v"])):
        for slot in slots:
            add(Case(N, f"--resume of a {optimizer} checkpoint without optimizer/{slot}", "refused in one line",
                     then(then(_checkpoint_first(["--optimizer", optimizer]), _craft(drop=(f"optimizer/{slot}",))),
                          seq("--resume", "crafted.npz", "--num_epochs", "2")),
                     one_line(needles=[f"optimizer/{slot}", "would restart"])))
    # --- a checkpoint is data ---------------------------------------------------------------------------
    for flag, option, value in (("dataset_name", "--dataset", "{folder}/evil.py"),
                                ("model_name", "--model", "{folder}/evil.py"),
                                ("gradient_weighting", "--gradient_weighting", "{folder}/evil.py:weights"),
                                ("gradient_weighting", "--gradient_weighting", "os.path:join"),
                                ("balance", "--balance", "{folder}/evil.py:P"),
                                ("balance", "--balance", "pydtnn.parallel.balance.policies:StaticPolicy")):
        for n in (1, 2):
            resume = (seq("--resume", "crafted.npz", "--num_epochs", "2") if n == 1 else
                      mpi(2, "--resume", "crafted.npz", "--num_epochs", "2", "--parallel", "data"))
            add(Case(D, f"stored {option} {value.replace('{folder}/', '')}" + (", 2 ranks" if n == 2 else ""),
                     "never runs the code; one line",
                     _with_code(then(then(_checkpoint_first([]), _craft(**{flag: value})), resume)),
                     one_line(needles=["a checkpoint never loads code"], absent=["ran.txt"]), mpi=n == 2))
    for flag in ("dataset_train_path", "dataset_test_path"):
        add(Case(D, f"stored --{flag} /etc", "never reads it; one line",
                 then(then(_checkpoint_first([]), _craft(**{flag: "/etc"})),
                      seq("--resume", "crafted.npz", "--num_epochs", "2")),
                 one_line(needles=["a checkpoint never chooses a path"])))
    for flag, value, target in (("history_file", "{folder}/victim/h.csv", "victim/h.csv"),
                                ("save_weights_and_bias_filename", "{folder}/victim/w.npz", "victim/w.npz"),
                                ("step_history_file", "{folder}/victim/s.csv", "victim/s.csv"),
                                ("checkpoint_dir", "../../victim-ck", "../../victim-ck"),
                                ("checkpoint_dir", "{folder}/victim", "victim/epoch_0002.npz"),
                                ("tensorboard_dir", "{folder}/victim/tb", "victim/tb"),
                                ("plots_dir", "{folder}/victim/plots", "victim/plots"),
                                ("tracer_output", "{folder}/victim/t.json", "victim/t.json")):
        def run(folder, flag=flag, value=value):
            (Path(folder) / "victim").mkdir(exist_ok=True)
            extra = {"tracing": True} if flag == "tracer_output" else {}
            return then(then(_checkpoint_first([]), _craft(**{flag: value}, **extra)),
                        seq("--resume", "crafted.npz", "--num_epochs", "2", *MC))(folder)
        add(Case(D, f"stored --{flag} {value.replace('{folder}/', '')}", "never written; this run's own outputs",
                 run, completes(absent=[target], files=["checkpoints/epoch_0002.npz"])))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run the cases whose class or name holds this text")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--no_mpi", action="store_true", help="only the sequential cases")
    ap.add_argument("--only_mpi", action="store_true", help="only the MPI cases (for the second MPI)")
    a = ap.parse_args(argv)
    todo = [c for c in cases() if (a.only in c.name or a.only in c.cls) and not (a.no_mpi and c.mpi)
            and not (a.only_mpi and not c.mpi)]
    mpi_name = "Open MPI" if mpirun.is_open_mpi(mpirun.find_mpiexec()) else "MPICH"
    print("| class | case | promise | MPI | what happened |\n|---|---|---|---|---|", flush=True)
    passed = 0
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for case, ok, what, seconds in pool.map(run_case, todo):
            passed += ok
            print(f"| {case.cls} | {case.name} | {case.promise} | {mpi_name if case.mpi else '-'} | "
                  f"{'held' if ok else 'BROKEN'}: {what} |", flush=True)
    print(f"\n{passed} of {len(todo)} held ({mpi_name} for the MPI cases)", flush=True)
    return 0 if passed == len(todo) else 1


if __name__ == "__main__":
    sys.exit(main())
