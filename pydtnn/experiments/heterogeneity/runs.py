"""The experiment's runs: what each kind of run gives the real launcher, the order they run in, and running
them under mpiexec from the repository (each writes a per-epoch JSON history and a log)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pydtnn.experiments.heterogeneity.history import load_history

REPO = Path(__file__).resolve().parents[3]
LAUNCHER = REPO / "scripts" / "pydtnn_benchmark.py"
BN_MODEL = REPO / "scripts" / "experiments" / "heterogeneity_bn_model.py"
DEFAULT_DATA = REPO / "tests" / "data" / "mnist-t10k"
PARTS = ("a", "b", "c")
BN_MODES, WEIGHTINGS = ("local", "sync"), ("uniform", "proportional")


# ------------------------------------------------------------------------------------------------ MPI

def mpiexec_prefix(nprocs: int) -> list[str]:
    """`mpiexec [...] -n P python -m mpi4py` (the launcher's path is appended by the caller)."""
    from pydtnn.errors import ConfigError
    from pydtnn.parallel.runtime.mpirun import mpi_command
    try:
        return mpi_command(nprocs, "")[:-1]
    except ConfigError as e:
        sys.exit(f"heterogeneity_experiment: {e}")


# ------------------------------------------------------------------------------------------- the runs

def fmt_list(values) -> str:
    """Numbers as a comma list, as the launcher's list flags take them."""
    return ",".join(f"{v:g}" for v in values)


@dataclass
class Spec:
    """One kind of run: what the launcher is given beyond the flags every run shares."""
    what: str
    model: str
    speeds: list
    epochs: int
    learning_rate: float
    flags: list
    emulate: bool = True


def run_kinds(args) -> dict[str, Spec]:
    speeds, bn_speeds = fmt_list(args.speeds), fmt_list(args.bn_speeds)
    static = ["--balance", "static", "--replica_speeds", speeds]
    common = dict(model=args.model, speeds=args.speeds, epochs=args.epochs, learning_rate=args.learning_rate)
    kinds = {
        "equal": Spec("equal split, proportional weights", flags=["--balance", "none"], **common),
        "static": Spec("static split proportional to the speeds, proportional weights", flags=static, **common),
        "dynamic": Spec(f"dynamic split (re-measured every {args.rebalance_interval} steps), proportional weights",
                        flags=["--balance", "dynamic", "--rebalance_interval", str(args.rebalance_interval)],
                        **common),
        "uniform": Spec("static split, uniform weights", flags=static + ["--gradient_weighting", "uniform"], **common),
    }
    for bn in BN_MODES:
        for w in WEIGHTINGS:
            kinds[bn_kind(bn, w)] = Spec(
                f"{bn} BatchNorm, {w} weights, static split {bn_speeds}", model=str(BN_MODEL),
                speeds=args.bn_speeds, epochs=args.bn_epochs, learning_rate=args.bn_learning_rate,
                emulate=args.bn_emulate,
                flags=["--balance", "static", "--replica_speeds", bn_speeds, "--gradient_weighting", w,
                       "--sync_batchnorm", "true" if bn == "sync" else "false"])
    return kinds


def bn_kind(bn, weighting) -> str:
    return f"bn_{bn}_{weighting}"


def plan_runs(parts, repeats) -> dict[str, str]:
    """Run name -> kind, in the order they run. The timed runs of (a) are interleaved by round, so that drift
    in the machine's load hits all three alike; (b)'s uniform run sits after the first round."""
    runs = {}
    rounds = [{f"{k}{r if r > 1 else ''}": k for k in ("equal", "static", "dynamic")} for r in range(1, repeats + 1)]
    if "a" in parts:
        runs.update(rounds[0])
    if "b" in parts:
        runs.setdefault("static", "static")
        runs["uniform"] = "uniform"
    if "a" in parts:
        for r in rounds[1:]:
            runs.update(r)
    if "c" in parts:        # sync next to local of the same weighting: their time difference is the point
        for w in reversed(WEIGHTINGS):
            for bn in BN_MODES:
                runs[bn_kind(bn, w)] = bn_kind(bn, w)
    return runs


def launcher_command(args, data_flags, history, spec: Spec) -> list[str]:
    cmd = mpiexec_prefix(len(spec.speeds)) + [str(LAUNCHER)]
    cmd += ["--model", spec.model, *data_flags, "--parallel", "data",
            "--global_batch_size", str(args.global_batch_size), "--num_epochs", str(spec.epochs),
            "--threads_per_replica", str(args.threads), "--learning_rate", f"{spec.learning_rate:g}",
            "--seed", str(args.seed), "--lr_schedulers", "", "--progress_bar", "false",
            "--history_file", str(history)]
    if spec.emulate:
        cmd += ["--emulate_speeds", fmt_list(spec.speeds)]
    if args.steps_per_epoch:
        cmd += ["--steps_per_epoch", str(args.steps_per_epoch)]
    return cmd + spec.flags


def as_typed(cmd) -> str:
    """A command as a user would type it in the repository (where the runs start): paths inside it relative
    to it, every path normalized (no `..`)."""
    out = []
    for arg in map(str, cmd):
        if os.path.isabs(arg):
            arg = os.path.normpath(arg)
            if Path(arg).is_relative_to(REPO):
                arg = os.path.relpath(arg, REPO)
        out.append(arg)
    return shlex.join(out)


def run_one(cmd, log_path, env, timeout) -> float:
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + as_typed(cmd) + "\n\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            sys.exit(f"heterogeneity_experiment: a run timed out after {timeout} s; see {log_path}")
    if proc.returncode != 0:
        tail = "".join(open(log_path).readlines()[-15:])
        sys.exit(f"heterogeneity_experiment: a run failed with status {proc.returncode} (log {log_path}):\n{tail}")
    return time.monotonic() - t0


def run_environment(threads) -> dict:
    """This process's environment, with `threads` BLAS threads per replica and unbuffered Python output."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_all(args, runs, kinds, data_flags, out, env):
    """Every planned run; returns the commands, histories, wall seconds and load averages at each start.
    Progress as the launcher shows it: a tqdm bar on a terminal, a plain line now and then in a log."""
    from pydtnn.observe.progress import progress
    commands, histories, wall, loads = {}, {}, {}, []
    with progress(total=len(runs), desc="runs", unit="run") as bar:
        for name, kind in runs.items():
            bar.set_postfix_str(f"{name}: {kinds[kind].what}")
            history = out / f"history_{name}.json"
            if history.exists():
                history.unlink()
            commands[name] = launcher_command(args, data_flags, history, kinds[kind])
            loads.append(os.getloadavg() if hasattr(os, "getloadavg") else None)
            wall[name] = run_one(commands[name], out / "logs" / f"{name}.log", env, args.timeout)
            histories[name] = load_history(history)
            bar.update(1)
    loads.append(os.getloadavg() if hasattr(os, "getloadavg") else None)
    return commands, histories, wall, loads
