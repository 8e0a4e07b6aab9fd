"""The launcher's run configuration: every check across flags, run before any work (before the banner), here.

`configure(p, nreplicas)` turns the parsed flags into one validated `RunConfig` (devices, learning rate in
force, balance policy, gradient weighting, metrics, ...), or raises the user's mistake as one ConfigError line.
The checks it runs, and the others, are plain functions of the parsed flags (and, where it must be, of the
dataset or the replica count), testable without MPI:

- `given_flags`: which flags the command line gave, as opposed to argparse's defaults;
- `check_combinations`: contradictions between flags (`--resume` with `--weights_and_bias_filename`);
- `learning_rate_in_force`: the rate training starts at and why it differs from `--learning_rate`
  (linear scaling by the replica count only when the global batch is `--batch_size` x replicas);
- `check_schedules`: scheduler values against that rate (`--cosine_min_lr`);
- `check_against_data`: `--evaluate` / `--evaluate_only` without a test split, a global batch larger than
  the training set;
- `merge_resumed_flags`: `--resume`: the checkpoint's flags for those not given, one line per given flag
  that differs from the checkpoint's run;
- `flag_digests` / `first_difference` / `agree_on_flags`: the ranks agree that they were started with the
  same flags (MPMD launches and per-node job scripts can start them with others).
"""
from __future__ import annotations

import argparse
import hashlib
import math
from dataclasses import dataclass

import numpy as np

from pydtnn.errors import CheckpointError, ConfigError


# -------------------------------------------------------------------------------- the run configuration

@dataclass
class RunConfig:
    """What the launcher runs, decided once from the flags (`p`, kept for everything else) and the replica count."""
    p: argparse.Namespace
    nreplicas: int
    data_parallel: bool
    devices: list            # one of "cpu" / "gpu" per replica
    learning_rate: float     # in force at the start (linear scaling applied)
    learning_rate_why: str | None
    policy: object           # a BalancePolicy (pydtnn.parallel.policies)
    weighting: object        # weights(sizes) -> list of w_i (pydtnn.parallel.weighting)
    metrics: list
    caps: list | None        # --max_local_batch, one per replica
    trace_steps: object = None   # --trace_steps parsed
    resume: object = None    # --resume: the lines to print and the flags given anew (set by the launcher)

    @property
    def global_batch(self) -> int:
        return self.p.global_batch_size or self.p.batch_size * (self.nreplicas if self.data_parallel else 1)


def configure(p, nreplicas: int, many_processes: bool = False) -> RunConfig:
    """Every cross-flag check, then the configuration. `many_processes`: started by a launcher of several."""
    from pydtnn.parallel.balance import caps_for
    from pydtnn.parallel.policies import make_policy
    from pydtnn.parallel.weighting import make_weighting
    P, data = int(nreplicas), p.parallel == "data"
    check_combinations(p)
    trace_steps = _trace_steps(p)
    if p.parallel == "sequential" and many_processes:
        raise ConfigError("several MPI processes with --parallel sequential would train independent copies; "
                          "use --parallel data")
    devices = [("gpu" if p.enable_gpu else "cpu")] * P
    if p.devices:
        devices = [d.strip().lower() for d in p.devices.split(",")]
        if len(devices) != P or any(d not in ("cpu", "gpu") for d in devices):
            raise ConfigError(f"--devices needs one of cpu/gpu per replica ({P}), got {p.devices!r}")
    if p.enable_nccl and P > 1 and any(d != "gpu" for d in devices):
        raise ConfigError("--enable_nccl needs every replica on a GPU; mixed --devices reduce through MPI")
    if p.enable_conv_winograd and p.conv_algorithm == "direct":
        raise ConfigError("--enable_conv_winograd true contradicts --conv_algorithm direct")
    if p.replica_speeds and not (data and p.balance == "static"):
        raise ConfigError("--replica_speeds is used by --parallel data --balance static only")
    if data and p.balance == "static" and p.replica_speeds and len(p.replica_speeds) != P:
        raise ConfigError(f"--replica_speeds has {len(p.replica_speeds)} values for {P} replicas")
    if p.emulate_speeds and len(p.emulate_speeds) != P:
        raise ConfigError(f"--emulate_speeds has {len(p.emulate_speeds)} values for {P} replicas")
    rate, why = learning_rate_in_force(p, P)
    check_schedules(p, rate, why)
    policy = make_policy(p.balance if data else "none", speeds=p.replica_speeds,
                         interval=p.rebalance_interval)      # a user's file: refused before any work
    weighting = make_weighting(p.gradient_weighting)
    metrics = [m.strip() for m in p.metrics.split(",") if m.strip()]
    return RunConfig(p=p, nreplicas=P, data_parallel=data, devices=devices, learning_rate=rate,
                     learning_rate_why=why, policy=policy, weighting=weighting, metrics=metrics,
                     caps=caps_for(p.max_local_batch, P if data else 1), trace_steps=trace_steps)


def _trace_steps(p):
    from pydtnn.observe.timeline import parse_steps
    try:
        return parse_steps(p.trace_steps)
    except ValueError as e:
        raise ConfigError(f"--trace_steps: {e}") from None

# Flags that describe how this machine runs, never what is trained: a resumed run takes them from its own
# command line, not from the checkpoint.
EXECUTION_FLAGS = frozenset({
    "resume", "weights_and_bias_filename", "parallel", "threads_per_replica", "progress_bar", "profile",
    "enable_gpu", "devices", "enable_nccl", "enable_gpudirect", "non_blocking_mpi", "precision",
    "conv_algorithm", "enable_conv_winograd", "enable_cudnn_auto_conv_alg", "enable_conv_gemm",
    "enable_memory_cache", "tensor_format", "shared_storage", "download", "enable_fused_bn_relu",
    "enable_fused_conv_relu", "enable_fused_conv_bn", "enable_fused_conv_bn_relu", "enable_best_of"})

# Flags that may differ between ranks: a rank's own threads; files each rank reads from its own node
# (only whether they are given must agree); what only rank 0 writes or shows.
PER_RANK_FLAGS = frozenset({"threads_per_replica", "history_file", "save_weights_and_bias_filename",
                            "tracer_output", "checkpoint_dir", "progress_bar", "profile", "tensorboard_dir",
                            "step_history_file", "plots_dir"})
PRESENCE_FLAGS = frozenset({"dataset_train_path", "dataset_test_path", "weights_and_bias_filename", "resume"})


def option_of(parser: argparse.ArgumentParser, dest: str) -> str:
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return action.option_strings[0]
    return f"--{dest}"


def flag_dests(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag's attribute name, in the parser's (the --help) order."""
    return [a.dest for a in parser._actions if a.option_strings and a.dest != "help"]


def given_flags(build_parser, argv) -> frozenset:
    """The attribute names of the flags that `argv` gives (a parser without defaults parses it again)."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return frozenset(vars(parser.parse_args(argv)))


def _shown(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_shown(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if value != "" else '""'


# ---------------------------------------------------------------------------------- combinations of flags

def check_combinations(p) -> None:
    if p.enable_nccl and p.parallel != "data":
        raise ConfigError("--enable_nccl needs --parallel data")
    if p.resume and p.weights_and_bias_filename:
        raise ConfigError("--resume restores a full checkpoint, its weights included, and "
                          "--weights_and_bias_filename would replace them: give one of the two")
    if p.dataset_name.endswith(".py"):
        if p.use_synthetic_data or p.download:
            flag = "--use_synthetic_data" if p.use_synthetic_data else "--download"
            raise ConfigError(f"--dataset {p.dataset_name} is a dataset file: {flag} does not apply to it")
        if p.targets != "labels" or p.flip_images or p.crop_images:
            raise ConfigError(f"--dataset {p.dataset_name} is a dataset file: its arrays are used as they are "
                              f"(--targets, --flip_images and --crop_images are the file's to make)")


# ------------------------------------------------------------------------------------------ learning rate

def learning_rate_in_force(p, nreplicas: int) -> tuple[float, str | None]:
    """(the rate training starts at, why it is not --learning_rate, or None when it is).

    Linear scaling (upstream's --learning_rate_scaling, data mode, SGD): the rate grows with the global
    batch, so it applies when the global batch is --batch_size x replicas; --global_batch_size fixes the
    global batch whatever the replica count, and the rate stays the flag's (so P replicas train as one
    process on that batch)."""
    if (p.parallel == "data" and p.learning_rate_scaling and p.optimizer_name == "sgd" and nreplicas > 1
            and p.global_batch_size is None):
        return (p.learning_rate * nreplicas,
                f"--learning_rate {_shown(p.learning_rate)} x {nreplicas} replicas: linear scaling, as the global "
                f"batch is --batch_size {p.batch_size} x {nreplicas}; --learning_rate_scaling false keeps "
                f"{_shown(p.learning_rate)}")
    return p.learning_rate, None


def check_schedules(p, rate: float, why: str | None) -> None:
    names = [n.strip() for n in (p.lr_schedulers_names or "").split(",") if n.strip()]
    if "cosine" in names and p.cosine_min_lr > rate:
        where = f"the learning rate in force: {why}" if why else "the learning rate"
        raise ConfigError(f"cosine: min_lr must be in [0, {rate:g}] ({where}), got {_shown(p.cosine_min_lr)} "
                          f"(--cosine_min_lr)")


# ------------------------------------------------------------------------------------ flags against data

def check_against_data(p, dataset, global_batch: int) -> None:
    if (p.evaluate_on_train or p.evaluate_only) and dataset.test is None:
        raise ConfigError("the dataset has no test split to evaluate on (--evaluate, --evaluate_only): give "
                          "--dataset_test_path a folder of its test files")
    ntrain = len(dataset.train)
    if global_batch > ntrain:
        if p.global_batch_size:
            flag = f"--global_batch_size {p.global_batch_size}"
        elif p.parallel == "data" and global_batch != p.batch_size:
            flag = f"--batch_size {p.batch_size} x {global_batch // p.batch_size} replicas"
        else:
            flag = f"--batch_size {p.batch_size}"
        held = " (after --validation_split)" if dataset.val is not None and p.validation_split else ""
        raise ConfigError(f"{flag}: a global batch of {global_batch} samples is larger than the {ntrain} "
                          f"training samples{held}: lower it")


# ----------------------------------------------------------------------------------------------- resume

def _normal(value):
    """A flag value as it reads back from a checkpoint's JSON (tuples are lists)."""
    if isinstance(value, tuple):
        return [_normal(v) for v in value]
    return value


def merge_resumed_flags(parser, p, given, saved: dict, path: str):
    """`--resume`: what the command line says wins; a flag it does not give comes from the checkpoint's run.
    Returns (inherited, anew, lines): the attributes set on ``p`` from the checkpoint; the given flags that
    change what the checkpoint restores (RESTORED_STATE) because they differ from the checkpoint's run; and
    one line for each of those. Other given flags (--num_epochs, outputs) are configuration: shown with the
    parameters."""
    dests = [d for d in flag_dests(parser) if d not in EXECUTION_FLAGS]
    lines, inherited, anew = [], [], set()
    for dest in dests:
        if dest not in saved:
            continue                       # a flag newer than the checkpoint: this run's value
        old, new = _normal(saved[dest]), _normal(getattr(p, dest))
        if dest in given:
            if old != new and dest in RESTORED_STATE:
                anew.add(dest)
                lines.append(f"resume: {option_of(parser, dest)} {_shown(new)} instead of the checkpoint's "
                             f"{_shown(old) if old is not None else 'none'}: {RESTORED_STATE[dest]}")
        elif old != new:
            inherited.append(dest)
    # the checkpoint's values go through the parser, as if typed: a crafted file cannot pass bad values
    argv = []
    for dest in inherited:
        value = saved[dest]
        if value is None:
            continue
        argv += [option_of(parser, dest), _shown(value) if not isinstance(value, float) else repr(value)]
    try:
        parsed = parser.parse_args(argv)
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {path}: the flags of its run do not parse ({e})") from None
    changes = {}
    for dest in inherited:
        changes[dest] = getattr(parsed, dest) if saved[dest] is not None else None
        setattr(p, dest, changes[dest])
    return changes, anew, lines


_SPLIT = "the split of the global batch is computed anew, not restored"
_BEST = "its best value so far is not restored"
# The flags that change what a checkpoint restores, and how (the line printed when one is given anew).
RESTORED_STATE = {
    "batch_size": _SPLIT, "global_batch_size": _SPLIT, "balance": _SPLIT, "replica_speeds": _SPLIT,
    "max_local_batch": _SPLIT,
    "seed": "a new data order and dropout stream from here",
    "optimizer_name": "the weights are restored, the optimizer starts afresh",
    "learning_rate": "training continues at the new rate, not at the checkpoint's",
    "lr_schedulers_names": "a scheduler the checkpoint does not hold starts afresh",
    "early_stopping_metric": _BEST, "reduce_lr_on_plateau_metric": _BEST, "model_checkpoint_metric": _BEST,
}


# ---------------------------------------------------------------------------------- ranks agree on flags

DIGEST_BITS = 62


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> (64 - DIGEST_BITS)


def flag_digests(parser, p) -> np.ndarray:
    """One 62-bit digest per flag that must be equal on every rank (int64, in the parser's order); for a
    flag naming a rank's own file, only whether it is given; 0 for those that may differ."""
    out = []
    for dest in flag_dests(parser):
        if dest in PER_RANK_FLAGS:
            out.append(0)
        elif dest in PRESENCE_FLAGS:
            out.append(_digest(f"{dest}={getattr(p, dest) is not None}"))
        else:
            out.append(_digest(f"{dest}={_normal(getattr(p, dest))!r}"))
    return np.asarray(out, dtype=np.int64)


def first_difference(highest: np.ndarray, lowest: np.ndarray) -> int | None:
    """Index of the first flag whose digest is not the same on every rank (from the elementwise maximum and
    minimum over the ranks), or None."""
    differ = np.flatnonzero(highest != lowest)
    return int(differ[0]) if differ.size else None


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def describe_difference(option: str, values: list) -> str:
    """One line for a flag that differs: the value on each group of ranks, in rank order."""
    groups: dict = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    shown = " and ".join(f"{value} on {_ranks(ranks)}" for value, ranks in groups.items())
    return (f"the ranks were started with different flags: {option} is {shown} (every rank needs the same "
            f"flags; only --threads_per_replica, the dataset, weights and checkpoint paths, and rank 0's "
            f"outputs may differ)")


def agree_on_flags(world, parser, p, error=None, what="started") -> None:
    """Every rank of `world` (an mpi4py communicator) calls this at the same point, with its parsed flags
    or the ConfigError that parsing them raised. One collective (an elementwise max of the digests and of
    their negatives) decides on every rank at once; then, only when something is wrong, the failing ranks'
    messages or the differing values are gathered, and every rank raises the same ConfigError (rank 0
    prints it)."""
    n = len(flag_dests(parser))
    digests = np.zeros(n, dtype=np.int64) if p is None else flag_digests(parser, p)
    buf = np.concatenate([digests, -digests, [1 if error is not None else 0]]).astype(np.int64)
    from mpi4py import MPI
    world.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
    if buf[-1]:                           # a rank could not parse its flags: its own message
        messages = world.gather(None if error is None else str(error), root=0)
        line = None
        if world.Get_rank() == 0:
            rank, line = next((r, m) for r, m in enumerate(messages) if m is not None)
            if rank != 0 and error is None:
                line = f"rank {rank}: {line}"
        raise ConfigError(world.bcast(line, root=0))
    index = first_difference(buf[:n], -buf[n:2 * n])
    if index is None:
        return
    dest = flag_dests(parser)[index]
    shown = f"given: {getattr(p, dest) is not None}" if dest in PRESENCE_FLAGS else _shown(getattr(p, dest))
    values = world.gather(shown, root=0)
    line = describe_difference(option_of(parser, dest), values) if world.Get_rank() == 0 else None
    line = world.bcast(line, root=0)
    if what != "started":
        line = line.replace("were started with", what)
    raise ConfigError(line)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
