"""The launcher's run configuration: every check across flags, run before any work (before the banner), here.

`configure(p, nreplicas)` turns the parsed flags into one validated `RunConfig` (devices, learning rate in
force, balance policy, gradient weighting, metrics, ...), or raises the user's mistake as one ConfigError line.
The checks it runs, and the others, are plain functions of the parsed flags (and, where it must be, of the
dataset or the replica count), testable without MPI:

- `given_flags`: which flags the command line gave, as opposed to argparse's defaults;
- `check_combinations`: contradictions between flags (`--resume` with `--weights_and_bias_filename`), a run that
  would train nothing (`--num_epochs 0`), an empty path;
- `learning_rate_in_force`: the rate training starts at and why it differs from `--learning_rate`
  (linear scaling by the replica count only when the global batch is `--batch_size` x replicas);
- `check_schedules`: scheduler values against that rate (`--cosine_min_lr`);
- `check_against_data`: `--evaluate` / `--evaluate_only` without a test split, a global batch larger than
  the training set;
- `merge_resumed_flags`: `--resume`: the checkpoint's flags for those not given, one line per given flag
  that differs from the checkpoint's run; never its outputs, paths or code (a checkpoint is data).

That the ranks were started with the same flags is `pydtnn.launch.agreement`'s.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from pydtnn.errors import CheckpointError, ConfigError
from pydtnn.launch.flags import flag_dests, flag_text, json_value, option_of


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
    policy: object           # a BalancePolicy (pydtnn.parallel.balance.policies)
    weighting: object        # weights(sizes) -> list of w_i (pydtnn.parallel.weighting)
    metrics: list
    caps: list | None        # --max_local_batch, one per replica
    trace_steps: object = None   # --trace_steps parsed
    resume: object = None    # --resume: the lines to print and the flags given anew (set by the launcher)
    notes: list = None       # lines for rank 0 to print before training (set by the launcher)
    step_rows_kept: list = None   # a resumed run's --step_history_file rows up to its checkpoint
    given: frozenset = frozenset(vars(argparse.Namespace()))   # the flags the command line or --resume set

    @property
    def global_batch(self) -> int:
        return self.p.global_batch_size or self.p.batch_size * (self.nreplicas if self.data_parallel else 1)


def configure(p, nreplicas: int, many_processes: bool = False) -> RunConfig:
    """Every cross-flag check, then the configuration. `many_processes`: started by a launcher of several."""
    from pydtnn.parallel.balance.proportional import caps_for
    from pydtnn.parallel.balance.policies import make_policy
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
    if p.precision != "fp32" and "gpu" not in devices:
        raise ConfigError(f"--precision {p.precision} sets a GPU's float32 math, and no replica of this run is on a "
                          f"GPU (--enable_gpu true or --devices): the CPU computes in fp32; leave --precision out")
    if p.enable_nccl and P > 1 and any(d != "gpu" for d in devices):
        raise ConfigError("--enable_nccl needs every replica on a GPU; mixed --devices reduce through MPI")
    if p.cuda_graphs:
        from pydtnn.parallel.step_graphs import refusal
        why = refusal(P, devices.count("gpu"), p.non_blocking_mpi and data, p.sync_batchnorm and data,
                      p.profile_layers)
        if why:
            raise ConfigError(why)
    if p.enable_conv_winograd and p.conv_algorithm == "direct":
        raise ConfigError("--enable_conv_winograd true contradicts --conv_algorithm direct")
    if p.replica_speeds and not (data and p.balance == "static"):
        raise ConfigError("--replica_speeds is used by --parallel data --balance static only")
    if data and p.balance == "static" and p.replica_speeds and len(p.replica_speeds) != P:
        raise ConfigError(f"--replica_speeds has {len(p.replica_speeds)} values for {P} replicas")
    if p.emulate_speeds and len(p.emulate_speeds) != P:
        raise ConfigError(f"--emulate_speeds has {len(p.emulate_speeds)} values for {P} replicas")
    if p.emulate_speeds or p.emulate_costs or p.emulate_schedule:
        from pydtnn.parallel.emulation import check_emulation
        if p.emulate_speeds and p.emulate_costs:
            raise ConfigError("--emulate_costs gives every replica's costs: --emulate_speeds cannot be combined with it")
        check_emulation(P, p.emulate_speeds, p.emulate_costs, p.emulate_schedule)   # counts and ranges: one line
    if p.balance != "none" and not data:
        taken = "; a resumed run takes it from its checkpoint: give --balance none" if p.resume else ""
        raise ConfigError(f"--balance {p.balance} splits the global batch among replicas: it needs --parallel data "
                          f"(this run is one process{taken})")
    if p.balance_options and not data:
        raise ConfigError("--balance_options is used by --parallel data only")
    if p.grad_compression != "none":
        if not data:
            taken = "; a resumed run takes it from its checkpoint: give --grad_compression none" if p.resume else ""
            raise ConfigError(f"--grad_compression {p.grad_compression} compresses the gradients replicas exchange: it "
                              f"needs --parallel data (this run is one process{taken})")
        from pydtnn.parallel.comm.compression import GradCompression
        GradCompression(p.grad_compression)           # bf16 without ml_dtypes: refused before any work
    if p.sync_batchnorm and (p.balance_options or {}).get("allow_zero") not in (None, ""):
        raise ConfigError("--balance_options allow_zero cannot be combined with --sync_batchnorm: a replica "
                          "without samples would not join the BatchNorm reductions")
    rate, why = learning_rate_in_force(p, P)
    check_schedules(p, rate, why)
    policy = make_policy(p.balance if data else "none", speeds=p.replica_speeds, interval=p.rebalance_interval,
                         options=p.balance_options)      # a user's file: refused before any work
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
    "enable_gpu", "devices", "enable_nccl", "enable_gpudirect", "non_blocking_mpi", "precision", "cuda_graphs",
    "conv_algorithm", "enable_conv_winograd", "enable_cudnn_auto_conv_alg", "enable_conv_gemm",
    "enable_memory_cache", "tensor_format", "shared_storage", "download", "enable_fused_bn_relu",
    "enable_fused_conv_relu", "enable_fused_conv_bn", "enable_fused_conv_bn_relu", "enable_best_of", "overwrite",
    "restore_emulation", "verbose"})

# A checkpoint is data: its stored flags may describe the run, never choose a path or load code. Outputs are
# always this command line's (a resumed run never writes where the checkpoint's run wrote unless told so);
# a path read or code run must be given on this command line when the checkpoint's run had another.
OUTPUT_FLAGS = ("history_file", "save_weights_and_bias_filename", "checkpoint_dir", "tracer_output",
                "tensorboard_dir", "step_history_file", "plots_dir")
INPUT_PATH_FLAGS = ("dataset_train_path", "dataset_test_path")
CODE_FLAGS = ("model_name", "dataset_name", "balance", "gradient_weighting")

# Emulation is a property of a run, not of the model: a resumed run (on other replicas, say) emulates what its
# own command line asks, and the checkpoint's run's only with --restore_emulation true.
EMULATION_FLAGS = frozenset({"emulate_speeds", "emulate_costs", "emulate_schedule"})


def given_flags(build_parser, argv) -> frozenset:
    """The attribute names of the flags that `argv` gives (a parser without defaults parses it again)."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return frozenset(vars(parser.parse_args(argv)))


# ---------------------------------------------------------------------------------- combinations of flags

# Paths read (not written: `pydtnn.launch.outputs` checks those) that a given empty value would silently turn off
READ_PATHS = ("resume", "weights_and_bias_filename", "dataset_train_path", "dataset_test_path")


def check_combinations(p) -> None:
    for dest in READ_PATHS:
        value = getattr(p, dest, None)
        if value is not None and not str(value).strip():
            raise ConfigError(f"--{dest}: empty path (give a path, or leave the flag out)")
    if p.num_epochs == 0 and not (p.evaluate_only or p.save_weights_and_bias_filename):
        raise ConfigError("--num_epochs 0 trains nothing: give 1 or more (with --evaluate_only true it evaluates, "
                          "with --save_weights_and_bias_filename it writes the initial weights)")
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
                f"--learning_rate {flag_text(p.learning_rate)} x {nreplicas} replicas: linear scaling, as the global "
                f"batch is --batch_size {p.batch_size} x {nreplicas}; --learning_rate_scaling false keeps "
                f"{flag_text(p.learning_rate)}")
    return p.learning_rate, None


def check_schedules(p, rate: float, why: str | None) -> None:
    names = [n.strip() for n in (p.lr_schedulers_names or "").split(",") if n.strip()]
    if "cosine" in names and p.cosine_min_lr > rate:
        where = f"the learning rate in force: {why}" if why else "the learning rate"
        raise ConfigError(f"cosine: min_lr must be in [0, {rate:g}] ({where}), got {flag_text(p.cosine_min_lr)} "
                          f"(--cosine_min_lr)")


# ------------------------------------------------------------------------------------ flags against data

def check_against_data(p, dataset, global_batch: int) -> None:
    if (p.evaluate_on_train or p.evaluate_only) and (dataset.test is None or len(dataset.test) == 0):
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

def merge_resumed_flags(parser, p, given, saved: dict, path: str):
    """`--resume`: what the command line says wins; a flag it does not give comes from the checkpoint's run.
    Returns (inherited, anew, lines): the attributes set on ``p`` from the checkpoint; the given flags that
    change what the checkpoint restores (RESTORED_STATE) because they differ from the checkpoint's run; and
    one line for each of those. Other given flags (--num_epochs, outputs) are configuration: shown with the
    parameters. The checkpoint is data: its outputs are never this run's (OUTPUT_FLAGS, one line when they
    differ), and a path it read or code it ran that this command line does not give is refused."""
    never = EXECUTION_FLAGS.union(OUTPUT_FLAGS)
    dests = [d for d in flag_dests(parser) if d not in never]
    lines, inherited, anew = [], [], set()
    not_reused = _outputs_not_reused(parser, p, saved)
    if not_reused:
        lines.append(f"resume: outputs come from this command line, not from the checkpoint's run "
                     f"(which wrote {not_reused})")
    if not getattr(p, "restore_emulation", False):
        dests = [d for d in dests if d not in EMULATION_FLAGS]
        left = [f"{option_of(parser, d)} {flag_text(saved[d])}" for d in sorted(EMULATION_FLAGS)
                if saved.get(d) not in (None, "") and d not in given]
        if left:
            lines.append(f"resume: the checkpoint's run emulated {', '.join(left)}; this run does not "
                         f"(--restore_emulation true would)")
    for dest in dests:
        if dest not in saved:
            continue                       # a flag newer than the checkpoint: this run's value
        if dest not in given:
            _refuse_stored_path_or_code(parser, p, dest, saved[dest], path)
        old, new = json_value(saved[dest]), json_value(getattr(p, dest))
        if dest in given:
            if old != new and dest in RESTORED_STATE:
                anew.add(dest)
                lines.append(f"resume: {option_of(parser, dest)} {flag_text(new)} instead of the checkpoint's "
                             f"{flag_text(old) if old is not None else 'none'}: {RESTORED_STATE[dest]}")
        elif old != new:
            inherited.append(dest)
    # the checkpoint's values go through the parser, as if typed: a crafted file cannot pass bad values
    argv = []
    for dest in inherited:
        value = saved[dest]
        if value is None:
            continue
        # typed as the command line would pass it: an empty value is an empty argument (flag_text's '""' is
        # how it is shown, and parsed back it was the two-character text '""': --lr_schedulers "" failed)
        typed = "" if value == "" else flag_text(value) if not isinstance(value, float) else repr(value)
        argv += [option_of(parser, dest), typed]
    try:
        parsed = parser.parse_args(argv)
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {path}: the flags of its run do not parse ({e})") from None
    changes = {}
    for dest in inherited:
        changes[dest] = getattr(parsed, dest) if saved[dest] is not None else None
        setattr(p, dest, changes[dest])
    _check_restored_emulation(p, inherited, path)
    return changes, anew, lines


def _check_restored_emulation(p, inherited, path):
    """--restore_emulation: the checkpoint's --emulate_* values, within the ranges a command line's must keep
    (`pydtnn.parallel.emulation.check_emulation`), or one line naming the checkpoint and the field."""
    from pydtnn.parallel.emulation import check_speeds, parse_costs, parse_schedule
    checks = {"emulate_speeds": check_speeds, "emulate_costs": parse_costs, "emulate_schedule": parse_schedule}
    for dest in sorted(EMULATION_FLAGS.intersection(inherited)):
        if getattr(p, dest) in (None, ""):
            continue
        try:
            checks[dest](getattr(p, dest))
        except ConfigError as e:
            raise CheckpointError(f"checkpoint {path}: metadata field 'flags.{dest}' (restored by "
                                  f"--restore_emulation true): {e}") from None


def names_code(dest, value) -> bool:
    """Whether the value of flag `dest` names a user's code (a .py file or a FILE.py:NAME / module:NAME spec)."""
    import os
    if not isinstance(value, str):
        return False
    if dest == "model_name":
        return value.endswith(".py") or os.sep in value or os.path.isfile(value)
    if dest == "dataset_name":
        return value.endswith(".py")
    return ":" in value                    # --balance, --gradient_weighting: a plug-in spec


def _refuse_stored_path_or_code(parser, p, dest, stored, path):
    """A flag this command line does not give, whose stored value reads a path or runs code other than this
    run's: refused in one line (the user gives it on the command line if that is what they want)."""
    if json_value(stored) == json_value(getattr(p, dest)):
        return
    option = option_of(parser, dest)
    if dest in INPUT_PATH_FLAGS and stored is not None:
        raise CheckpointError(f"checkpoint {path}: its run read {option} {flag_text(stored)}, and a checkpoint "
                              f"never chooses a path: give {option} on the command line")
    if dest in CODE_FLAGS and names_code(dest, stored):
        raise CheckpointError(f"checkpoint {path}: its run used {option} {flag_text(stored)}, which is code, and "
                              f"a checkpoint never loads code: give {option} {flag_text(stored)} on the command "
                              f"line to run it")


def _outputs_not_reused(parser, p, saved) -> str:
    """The checkpoint's run's outputs that this run does not write to (theirs differ from this command line's)."""
    shown = [f"{option_of(parser, d)} {flag_text(saved[d])}" for d in OUTPUT_FLAGS
             if saved.get(d) is not None and json_value(saved[d]) != json_value(getattr(p, d))]
    return ", ".join(shown)


_SPLIT = "the split of the global batch is computed anew, not restored"
_BEST = "its best value so far is not restored"
# The flags that change what a checkpoint restores, and how (the line printed when one is given anew).
RESTORED_STATE = {
    "batch_size": _SPLIT, "global_batch_size": _SPLIT, "balance": _SPLIT, "replica_speeds": _SPLIT,
    "seed": "a new data order and dropout stream from here",
    "optimizer_name": "the weights are restored, the optimizer starts afresh",
    "learning_rate": "training continues at the new rate, not at the checkpoint's",
    "lr_schedulers_names": "a scheduler the checkpoint does not hold starts afresh",
    "early_stopping_metric": _BEST, "reduce_lr_on_plateau_metric": _BEST, "model_checkpoint_metric": _BEST,
}
