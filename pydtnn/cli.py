"""The launcher: upstream PyDTNN's flags, plus heterogeneity-aware data parallelism.

    python scripts/pydtnn_benchmark.py --model simplecnn --dataset synthetic --num_epochs 1
    mpiexec -n 3 python -m mpi4py scripts/pydtnn_benchmark.py --parallel data --global_batch_size 96 \
        --balance static --replica_speeds 1,2,3 ...

A user's mistake prints one line (`pydtnn: error: ...`) on rank 0 and every rank exits with status 2
(`pydtnn.parallel.runtime.shutdown`).
Exit statuses: 0 done; 2 a user's mistake or an output that cannot be written; 3 stopped by SIGTERM or
SIGUSR1 after writing a full checkpoint (continue with --resume); 130 interrupted (Ctrl-C).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import types

from pydtnn.errors import ConfigError, PyDTNNError

TRUE, FALSE = ("true", "1", "yes", "y", "on"), ("false", "0", "no", "n", "off")
EXIT_PREEMPTED = 3


def boolean(value: str) -> bool:
    """Upstream silently read any unknown string as False; ours refuses it."""
    v = str(value).strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false, 1/0, yes/no), got {value!r}")


def positive_int(value):
    v = int(value)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return v


def nonneg_int(value):
    v = int(value)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return v


def nonneg_float(value):
    v = float(value)
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {value}")
    return v


def dataset_name(value):
    from pydtnn.datasets import DATASETS
    if value.endswith(".py"):
        if not os.path.isfile(value):
            raise argparse.ArgumentTypeError(f"dataset file {value} does not exist")
        return value
    if value not in DATASETS:
        raise argparse.ArgumentTypeError(f"choose one of {', '.join(DATASETS)}, or a .py file defining "
                                         f"create_dataset(seed); got {value!r}")
    return value


def finite_float(value):
    v = float(value)
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {value}")
    return v


def float_list(value):
    try:
        out = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {value!r}") from None
    if not out or any(not (math.isfinite(v) and v > 0) for v in out):
        raise argparse.ArgumentTypeError(f"expected positive comma-separated numbers, got {value!r}")
    return out


def positive_int_list(value):
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {value!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive comma-separated integers, got {value!r}")
    return out


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    """The launcher's flags, one function per group, in --help's order."""
    p = OneLineParser(prog="pydtnn_benchmark", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                      description="Train or evaluate a PyDTNN model (upstream PyDTNN flags; booleans take "
                                  "true/false, 1/0, yes/no and refuse anything else).")
    model = p.add_argument_group("model")
    _model_and_training_flags(model)
    _weights_and_resume_flags(model)
    _dataset_flags(p.add_argument_group("dataset"))
    _optimizer_flags(p.add_argument_group("optimizer"))
    _scheduler_flags(p.add_argument_group("LR schedulers (nothing writes files unless model_checkpoint is named)"))
    parallel = p.add_argument_group("parallelism and heterogeneity")
    _data_parallel_flags(parallel)
    _device_flags(parallel)
    _tracing_and_output_flags(p.add_argument_group("tracing"))
    return p


def _model_and_training_flags(g):
    """The model, the batch, the floating type, how long to train and whether to evaluate."""
    B = boolean
    g.add_argument("--model", dest="model_name", default="simplecnn",
                   help="registered model name (see README) or a path to a .py file defining create_model(model)")
    g.add_argument("--batch_size", type=positive_int, default=64,
                   help="local batch per replica (upstream meaning); the global batch is batch_size x replicas "
                        "unless --global_batch_size is given")
    g.add_argument("--global_batch_size", type=positive_int, default=None,
                   help="the real global batch B, split among replicas by --balance (sequential: the batch); at "
                        "most the training samples")
    g.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="floating type")
    g.add_argument("--num_epochs", type=nonneg_int, default=1, help="epochs to train")
    g.add_argument("--steps_per_epoch", type=nonneg_int, default=0,
                   help="0 = a full pass; >0 trims or tiles the training set to that many global steps")
    g.add_argument("--evaluate", dest="evaluate_on_train", metavar="EVALUATE", type=B, default=False,
                   help="evaluate on the test set before and after training (refused without a test split)")
    g.add_argument("--evaluate_only", type=B, default=False,
                   help="only evaluate on the test set (refused without a test split)")


def _weights_and_resume_flags(g):
    """Weights in and out, the history, upstream's accepted no-op flags, the seed, resuming."""
    B = boolean
    g.add_argument("--weights_and_bias_filename", default=None, help="NPZ weights to load before training")
    g.add_argument("--save_weights_and_bias_filename", default=None,
                   help="write the final weights here as NPZ (stable keys layer/param, no pickle)")
    g.add_argument("--history_file", default=None, help="per-epoch history, CSV (or JSON if it ends in .json)")
    g.add_argument("--shared_storage", type=B, default=True, help="accepted for compatibility; has no effect")
    for flag in ("enable_fused_bn_relu", "enable_fused_conv_relu", "enable_fused_conv_bn",
                 "enable_fused_conv_bn_relu", "enable_best_of"):
        g.add_argument(f"--{flag}", type=B, default=False,
                       help="upstream fused-kernel variant: accepted, no effect (our kernels do not need it)")
    g.add_argument("--tensor_format", default="AUTO", type=str.upper, choices=["NHWC", "NCHW", "AUTO"],
                   help="accepted for compatibility: each backend keeps its fastest layout internally "
                        "(CPU NHWC, GPU NCHW); users always see NCHW")
    g.add_argument("--seed", type=nonneg_int, default=0, help="fixes every random choice (weights, order, dropout, augmentation)")
    g.add_argument("--resume", default=None,
                   help="resume from a full checkpoint (model_checkpoint, step or preemption checkpoints): its state "
                        "(counters, best values, learning rate, RNG, split) and the flags of its run that this command "
                        "line does not give; a flag given anew wins (one line for each that changes the restored "
                        "state); it may come from another number of replicas; not with --weights_and_bias_filename")
    g.add_argument("--checkpoint_dir", default="checkpoints",
                   help="where model_checkpoint, step checkpoints and the SIGTERM/SIGUSR1 checkpoint write "
                        "(created by the first checkpoint)")


def _dataset_flags(g):
    """Which data, its targets, and the held-out and augmentation settings."""
    B = boolean
    g.add_argument("--dataset", dest="dataset_name", default="synthetic", type=dataset_name,
                   help="synthetic (learnable, offline; upstream's default was mnist), mnist, cifar10, imagenet, "
                        "bytes (a text file, --dataset_train_path, default a shipped public-domain text, as "
                        "--sequence_length byte ids with next-byte targets: a language model's), or FILE.py "
                        "defining create_dataset(seed) (docs/datasets.md)")
    g.add_argument("--targets", default="labels", choices=["labels", "inputs"],
                   help="labels: the class labels; inputs: each image is its own target (an autoencoder's, "
                        "with --loss_func mean_squared_error)")
    g.add_argument("--sequence_length", type=positive_int, default=64, help="bytes: positions per sequence")
    g.add_argument("--use_synthetic_data", type=B, default=False,
                   help="learnable synthetic data shaped like --dataset (upstream used zeros)")
    g.add_argument("--synthetic_samples", type=positive_int, default=None, help="training samples of synthetic data")
    g.add_argument("--dataset_train_path", default=None, help="folder of the training files")
    g.add_argument("--dataset_test_path", default=None, help="folder of the test files")
    g.add_argument("--download", type=B, default=False, help="download missing mnist/cifar10 files into the cache")
    g.add_argument("--test_as_validation", type=B, default=False, help="validate on the test set")
    g.add_argument("--validation_split", type=finite_float, default=0.0, help="fraction of training data held out")
    g.add_argument("--normalize", type=B, default=True, help="standardize pixels per channel")
    g.add_argument("--flip_images", type=B, default=False, help="random horizontal flips (upstream flipped vertically)")
    g.add_argument("--flip_images_prob", type=finite_float, default=0.5)
    g.add_argument("--crop_images", type=B, default=False, help="random crops")
    g.add_argument("--crop_images_size", type=positive_int, default=16)
    g.add_argument("--crop_images_prob", type=finite_float, default=0.5)


def _optimizer_flags(g):
    """The optimizer and its hyperparameters, the loss, clipping, the metrics."""
    B = boolean
    g.add_argument("--optimizer", dest="optimizer_name", default="sgd", choices=["sgd", "rmsprop", "adam", "nadam", "adamw"])
    g.add_argument("--learning_rate", type=finite_float, default=0.01)
    g.add_argument("--learning_rate_scaling", type=B, default=True,
                   help="data mode, SGD only: learning rate x replicas when the global batch is --batch_size x "
                        "replicas (upstream's case); never with --global_batch_size, which fixes the global batch; "
                        "the rate in force is printed at start when it is not --learning_rate")
    g.add_argument("--momentum", type=finite_float, default=0.9)
    g.add_argument("--decay", type=finite_float, default=0.0, help="L2 weight decay added to the gradient; for adamw the decoupled weight decay "
                        "(w -= lr x decay x w, outside the moments, PyTorch's weight_decay)")
    g.add_argument("--nesterov", type=B, default=False)
    g.add_argument("--beta1", type=finite_float, default=0.99)
    g.add_argument("--beta2", type=finite_float, default=0.999)
    g.add_argument("--epsilon", type=finite_float, default=1e-7)
    g.add_argument("--rho", type=finite_float, default=0.9)
    g.add_argument("--loss_func", default="categorical_cross_entropy",
                   choices=["categorical_cross_entropy", "binary_cross_entropy", "mean_squared_error",
                            "mean_absolute_error"],
                   help="categorical_cross_entropy also per position on (T, K) outputs; the regression losses "
                        "are means over every element")
    g.add_argument("--label_smoothing", type=finite_float, default=0.0,
                   help="categorical_cross_entropy: train on targets (1 - e) y + e/K, e in [0, 1) (0 = off)")
    g.add_argument("--clip_grad_norm", type=finite_float, default=0.0,
                   help="scale the reduced gradient to this global L2 norm when it is larger (0 = off)")
    g.add_argument("--metrics", default="categorical_accuracy", help="comma list of metrics")


def _scheduler_flags(g):
    """The learning-rate schedulers and the checkpoints written by model_checkpoint."""
    g.add_argument("--lr_schedulers", dest="lr_schedulers_names", default="early_stopping,reduce_lr_on_plateau",
                   help="comma list of warm_up, cosine, early_stopping, reduce_lr_on_plateau, reduce_lr_every_nepochs, "
                        "stop_at_loss, model_checkpoint (upstream's default also wrote checkpoints into the CWD); "
                        "metric-driven ones need validation data and are skipped without it")
    g.add_argument("--warm_up_epochs", type=nonneg_int, default=5)
    g.add_argument("--cosine_decay_epochs", type=nonneg_int, default=0,
                   help="cosine: epochs of the half-cosine decay after its warm-up (0 = up to --num_epochs); "
                        "the rate is set every step")
    g.add_argument("--cosine_min_lr", type=finite_float, default=0.0, help="cosine: the final learning rate")
    g.add_argument("--cosine_warm_up_epochs", type=nonneg_int, default=0,
                   help="cosine: linear warm-up epochs before the decay (warm_up cannot be combined with cosine)")
    g.add_argument("--early_stopping_metric", default="val_categorical_cross_entropy")
    g.add_argument("--early_stopping_patience", type=nonneg_int, default=10)
    g.add_argument("--reduce_lr_on_plateau_metric", default="val_categorical_cross_entropy")
    g.add_argument("--reduce_lr_on_plateau_factor", type=finite_float, default=0.1)
    g.add_argument("--reduce_lr_on_plateau_patience", type=nonneg_int, default=5)
    g.add_argument("--reduce_lr_on_plateau_min_lr", type=finite_float, default=0.0)
    g.add_argument("--reduce_lr_every_nepochs_factor", type=finite_float, default=0.1)
    g.add_argument("--reduce_lr_every_nepochs_nepochs", type=positive_int, default=5)
    g.add_argument("--reduce_lr_every_nepochs_min_lr", type=finite_float, default=0.0)
    g.add_argument("--stop_at_loss_metric", default="val_categorical_accuracy",
                   help="(upstream's default val_accuracy named no metric)")
    g.add_argument("--stop_at_loss_threshold", type=finite_float, default=0.0)
    g.add_argument("--model_checkpoint_metric", default="val_categorical_cross_entropy")
    g.add_argument("--model_checkpoint_save_freq", type=positive_int, default=2, help="epochs")
    g.add_argument("--model_checkpoint_save_steps", type=nonneg_int, default=0,
                   help="also write a full checkpoint every N global steps, inside epochs (0 = off; only the "
                        "newest one is kept, as epoch_EEEE_step_SSSSSS.npz in --checkpoint_dir)")
    g.add_argument("--model_checkpoint_save_minutes", type=nonneg_float, default=0.0,
                   help="also write such a checkpoint every M minutes of training, by rank 0's clock (0 = off)")


def _data_parallel_flags(g):
    """Data parallelism: the split of the global batch, its weighting, sync-BN, speed emulation."""
    B = boolean
    g.add_argument("--parallel", default="sequential", choices=["sequential", "data"])
    g.add_argument("--non_blocking_mpi", type=B, default=False,
                   help="reduce gradients in reverse-order buckets with Iallreduce, overlapped with backward")
    g.add_argument("--balance", default="none",
                   help="split of the global batch: none (equal); static: proportional to --replica_speeds (or to "
                        "probed speeds); dynamic: re-measured and re-split during training; or a user's "
                        "BalancePolicy, FILE.py:CLASS or module:CLASS (pydtnn.parallel.balance)")
    g.add_argument("--replica_speeds", type=float_list, default=None, help="v1,v2,... relative replica speeds")
    g.add_argument("--max_local_batch", type=positive_int_list, default=None,
                   help="memory caps: the most samples a replica may hold, one value for all or one per replica; "
                        "the split stays proportional to speed below the caps and spills the excess to the others")
    g.add_argument("--rebalance_interval", type=positive_int, default=20, help="dynamic: steps between re-splits")
    g.add_argument("--gradient_weighting", default="proportional",
                   help="proportional: w_i = b_i/B (the exact global-batch gradient); uniform: w_i = 1/P; or a "
                        "user's FILE.py:FUNCTION (or module:FUNCTION) weights(sizes) -> list of w_i")
    g.add_argument("--sync_batchnorm", type=B, default=False,
                   help="BatchNormalization in training uses the global batch's statistics, summed over the "
                        "replicas with their own b_i (exact for unequal splits; two small allreduces per layer)")
    g.add_argument("--emulate_speeds", type=float_list, default=None,
                   help="f1,f2,...: replica i behaves as a device f_i/max(f) as fast as the full-speed replicas (each step's "
                        "compute padded to b_i*t0/f_i, t0 their measured time per sample); for experiments on one machine")


def _device_flags(g):
    """Each replica's device, threads and convolution algorithms."""
    B = boolean
    g.add_argument("--threads_per_replica", type=positive_int, default=None,
                   help="BLAS and kernel threads of each replica (default: OMP_NUM_THREADS if set, else the "
                        "node's cores divided by the ranks on the node)")
    g.add_argument("--enable_gpu", type=B, default=False, help="run on the GPU backend (CuPy + cuDNN)")
    g.add_argument("--devices", default=None,
                   help="one device kind per replica, e.g. gpu,cpu,cpu: a mixed job whose replicas reduce through "
                        "MPI on host buffers (overrides --enable_gpu)")
    g.add_argument("--enable_nccl", type=B, default=False, help="reduce GPU gradients with NCCL")
    g.add_argument("--enable_gpudirect", type=B, default=False, help="accepted for compatibility")
    g.add_argument("--enable_cudnn_auto_conv_alg", type=B, default=True, help="GPU: pick conv algorithms by measurement")
    g.add_argument("--conv_algorithm", default="auto", choices=["auto", "direct", "winograd"],
                   help="CPU convolutions: auto (Winograd F(4x4,3x3) on 3x3 stride-1 layers with >= 32 input and "
                        "output channels, where it measured faster), direct, or winograd (every 3x3 stride-1 layer)")
    g.add_argument("--enable_conv_winograd", type=B, default=False, help="CPU: same as --conv_algorithm winograd")
    g.add_argument("--enable_conv_gemm", type=B, default=False,
                   help="accepted for compatibility, no effect: direct CPU convolutions already are BLAS GEMMs")
    g.add_argument("--enable_memory_cache", type=B, default=False,
                   help="accepted for compatibility, no effect: NumPy's allocator already reuses freed buffers")
    g.add_argument("--precision", default="fp32", choices=["fp32", "tf32"],
                   help="GPU float32 math: fp32 (strict, no tensor-core TF32) or tf32 (faster, ~1e-3 relative error)")


def _tracing_and_output_flags(g):
    """Traces, per-step scalars, plots, profiles and the progress bar."""
    B = boolean
    g.add_argument("--tracing", type=B, default=False,
                   help="write a per-layer Chrome/Perfetto trace of every rank (--tracer_output, --trace_steps)")
    g.add_argument("--tracer_output", default="trace.json", help="Chrome-trace JSON file of the timeline (--tracing true)")
    g.add_argument("--trace_steps", default="2:5",
                   help="FIRST:LAST: the global steps (1-based, inclusive) the trace details; evaluation and "
                        "checkpoint writes are traced throughout")
    g.add_argument("--profile_layers", type=B, default=False,
                   help="print a table of mean forward/backward ms, share of the step and GFLOP/s per layer at the end")
    g.add_argument("--tensorboard_dir", default=None,
                   help="write per-step and per-epoch scalars as TensorBoard event files into this folder")
    g.add_argument("--step_history_file", default=None,
                   help="CSV file of per-step scalars (loss, learning rate, throughput, each replica's b_i, compute, wait)")
    g.add_argument("--plots_dir", default=None,
                   help="write the per-replica plot (b_i, compute and wait over the steps) into this folder at the end")
    g.add_argument("--profile", type=B, default=False, help="cProfile of rank 0's training, printed at the end")
    g.add_argument("--progress_bar", type=B, default=True,
                   help="progress on rank 0's stderr: a tqdm bar on a terminal, else a plain line every 10 s")


def parse_args(argv=None):
    return build_parser().parse_args(argv)


def parse_command_line(argv=None):
    """(flags, the names of those the command line gave). Under a launcher of several processes every rank
    then agrees that all were started with the same flags (`config_checks.agree_on_flags`): a rank whose
    flags do not parse, or that was given others (an MPMD launch, a per-node job script), stops every rank
    with one line."""
    from pydtnn.launch import config as config_checks
    error = p = None
    given = frozenset()
    try:
        p = parse_args(argv)
        given = config_checks.given_flags(build_parser, argv)
    except ConfigError as e:
        error = e
    world = _world_for_agreement()
    if world is not None:
        config_checks.agree_on_flags(world, build_parser(), p, error)
    elif error is not None:
        raise error
    return p, given


def _world_for_agreement():
    """MPI's COMM_WORLD under a launcher of several processes (MPI starts here then), else None."""
    from pydtnn.parallel.runtime import environment as launcher
    if not launcher.launched_with_many_processes():
        return None
    from pydtnn.parallel.comm import MPIComm
    world = MPIComm().comm
    return world if world.Get_size() > 1 else None


def _print_params(p, comm_size):
    rows = [(k, v) for k, v in sorted(vars(p).items())]
    width = max(len(k) for k, _ in rows)
    print(f"PyDTNN parameters ({comm_size} replica(s)):")
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")


def run(p, given=None):
    """Everything after parsing, as named steps. Raises PyDTNNError for the user's mistakes. ``given``: the
    names of the flags the command line gave (None: every attribute of ``p`` counts as given).

    Every check of the flags runs before any work and before the banner. Work that each rank does on its
    own (its device, its copy of the dataset and the model, the weights or checkpoint it reads) runs in
    blocks that end in one collective (`raise_together`), so that a mistake only one rank sees stops every
    rank at once with one line."""
    comm = communicator(p)                                        # serial, or MPI's world under mpiexec
    config = configuration(p, given, comm)                        # resumed flags merged; every cross-flag check
    devices = set_up_devices(config, comm)                        # threads per replica, speed emulation
    local = build_data_and_model(config, comm)                    # each rank's backend, model and data
    split = policy_and_split(config, local, comm)                 # the global batch and the policy's first split
    if p.enable_nccl and comm.size > 1:
        from pydtnn.parallel.comm import make_comm
        comm = make_comm("nccl")
    trainer = make_trainer(config, devices, local, split, comm)   # optimizer, schedulers, restored state, probe
    if comm.rank == 0:
        _print_banner(config, devices, local, split, trainer)
    return train(config, trainer, comm)


def communicator(p):
    """The communicator of the run (MPI starts here under a launcher)."""
    from pydtnn.launch import config
    from pydtnn.parallel.comm import make_comm
    config.check_combinations(p)
    return make_comm("auto") if p.parallel == "data" else make_comm("serial")


def configuration(p, given, comm):
    """The one validated configuration (`pydtnn.launch.config.configure`), after --resume's flags are merged in."""
    from pydtnn.launch import config
    from pydtnn.parallel.runtime import environment as launcher
    from pydtnn.parallel.comm import raise_together
    given = frozenset(vars(p)) if given is None else frozenset(given)
    resume_lines, anew = [], set()
    if p.resume:          # the checkpoint's run gives the flags this command line does not
        from pydtnn.training.checkpointing import read_meta
        _, anew, resume_lines = raise_together(
            comm, lambda: config.merge_resumed_flags(build_parser(), p, given, read_meta(p.resume)["flags"], p.resume),
            "another rank could not read its --resume checkpoint")
        if comm.size > 1:
            config.agree_on_flags(comm.comm, build_parser(), p, what="resumed from checkpoints of runs with")
    run_config = config.configure(p, comm.size, launcher.launched_with_many_processes())
    _check_outputs(p, comm)
    run_config.resume = types.SimpleNamespace(lines=resume_lines, anew=anew)
    return run_config


def set_up_devices(config, comm):
    """Threads per replica (all ranks' for the banner) and --emulate_speeds' factor for this rank."""
    import numpy as np
    from pydtnn.parallel.runtime.threads import apply_threads
    np.seterr(all="ignore")        # overflow on the way to a NaN loss is reported once, by the trainer
    p = config.p
    threads, why = apply_threads(p.threads_per_replica, comm)
    out = types.SimpleNamespace(kinds=config.devices, threads=threads, threads_why=why,
                                threads_all=[int(t) for t in comm.allgather(float(threads))],
                                emulate=1.0, emulate_spin=False, emulate_reference=())
    if p.emulate_speeds:
        fastest = max(p.emulate_speeds)
        out.emulate = p.emulate_speeds[comm.rank] / fastest
        out.emulate_reference = [i for i, f in enumerate(p.emulate_speeds) if f == fastest]
        # busy-wait where the node's cores hold every rank's threads (a sleep slows what follows it)
        from pydtnn.parallel.runtime.threads import node_core_sets
        node = node_core_sets(comm)
        out.emulate_spin = len(node) * threads <= len(set().union(*node))
    return out


def build_data_and_model(config, comm):
    """Each rank's backend, model and copy of the dataset (`rank_data_and_model`), in one block that ends in
    a collective."""
    from pydtnn.parallel.comm import raise_together
    if config.p.download:
        _download_on_rank0(config.p, comm)
    return raise_together(comm, lambda: rank_data_and_model(config.p, config.devices[comm.rank], comm.rank),
                          "another rank could not set up its device, model or data")


def rank_data_and_model(p, kind, rank):
    """This rank's model on its backend and its copy of the dataset, without communicating. Data and model
    are one step because their shapes flow either way: synthetic data is shaped like the model (a model
    file's shape is known only once it is built), a real dataset gives the model its shape and classes."""
    from pydtnn.datasets import load_dataset
    from pydtnn.models import build_model
    model, options = _new_model(p, kind, rank)
    if (p.model_name.endswith(".py") or os.sep in p.model_name) and not os.path.isfile(p.model_name):
        raise ConfigError(f"--model {p.model_name}: no such file")
    if p.use_synthetic_data and p.dataset_name == "bytes":
        raise ConfigError("--use_synthetic_data makes images; the bytes dataset is text (drop the flag)")
    if p.dataset_name == "synthetic" or p.use_synthetic_data:
        shape, ncls = _synthetic_model_shape(p)
        build_model(p.model_name, model, nclasses=ncls, input_shape=shape)
        dataset = _synthetic_data(p, model)
    else:
        dataset = load_dataset(p.dataset_name, train_path=p.dataset_train_path, test_path=p.dataset_test_path,
                               seed=p.seed, targets=p.targets, sequence_length=p.sequence_length,
                               **_augmentation(p))
        build_model(p.model_name, model, nclasses=dataset.nclasses,
                    input_shape=None if os.path.isfile(p.model_name) else dataset.input_shape)
    _check_model_matches_data(p, model, dataset)
    return types.SimpleNamespace(model=model, dataset=dataset, options=options)


def _new_model(p, kind, rank):
    """An empty Model on this rank's backend (``kind``: cpu or gpu), and the backend's options."""
    from pydtnn.backends import get_backend
    from pydtnn.model import Model
    options = ({"precision": p.precision, "auto_conv_alg": p.enable_cudnn_auto_conv_alg} if kind == "gpu" else
               {"conv_algorithm": "winograd" if p.enable_conv_winograd else p.conv_algorithm})
    model = Model(backend=get_backend(kind, p.dtype, p.seed, **options), seed=p.seed)
    model.backend.seed(p.seed * 1000003 + rank)          # dropout: an independent stream per replica
    return model, options


def _synthetic_model_shape(p):
    """(input shape, classes) to build the model with on synthetic data: those of the dataset that
    --use_synthetic_data imitates; else a registered model's default input; a model file's own (None)."""
    from pydtnn.datasets import KNOWN_SHAPES
    from pydtnn.models import default_input_shape
    if p.dataset_name != "synthetic":
        return KNOWN_SHAPES[p.dataset_name]
    if os.path.isfile(p.model_name):
        return None, None
    return default_input_shape(p.model_name), None


def _synthetic_data(p, model):
    """Learnable synthetic data shaped like the built model, refused before allocating if it cannot fit."""
    from pydtnn.datasets import load_dataset
    if p.synthetic_samples:
        from pydtnn.launch.limits import check_fits, dataset_bytes
        check_fits(dataset_bytes(p.synthetic_samples, model.input_shape),
                   f"--synthetic_samples {p.synthetic_samples}", "lower --synthetic_samples")
    return load_dataset("synthetic", input_shape=model.input_shape, nclasses=model.output_shape[0],
                        synthetic_samples=p.synthetic_samples, seed=p.seed, targets=p.targets, **_augmentation(p))


def _augmentation(p):
    return dict(validation_split=p.validation_split, test_as_validation=p.test_as_validation,
                normalize=p.normalize, flip_images=p.flip_images, flip_images_prob=p.flip_images_prob,
                crop_images=p.crop_images, crop_images_size=p.crop_images_size, crop_images_prob=p.crop_images_prob)


def _check_model_matches_data(p, model, dataset):
    """The model takes the data's inputs and gives its targets' shape (one line naming both otherwise)."""
    if tuple(model.input_shape) != tuple(dataset.input_shape):
        raise ConfigError(f"model {p.model_name} takes inputs {model.input_shape} but dataset {p.dataset_name} "
                          f"has {dataset.input_shape}")
    if tuple(model.output_shape) != dataset.output_shape:
        what = (f"{dataset.nclasses} classes" if dataset.target_shape is None else
                f"targets of shape {dataset.output_shape}")
        hint = "; an autoencoder needs --targets inputs" if dataset.target_shape is None and \
            tuple(model.output_shape) == tuple(dataset.input_shape) else ""
        raise ConfigError(f"model {p.model_name} gives outputs of shape {tuple(model.output_shape)} but dataset "
                          f"{p.dataset_name} has {what}{hint}")


def policy_and_split(config, local, comm):
    """The global batch and the policy's initial split of it (`initial_split`), in a block that ends in a
    collective. It follows data and model: B must suit the training samples, and each local batch's
    activations must fit this rank's memory."""
    from pydtnn.parallel.comm import raise_together
    return raise_together(comm, lambda: initial_split(config.p, config.policy, local.model, local.dataset,
                                                      comm.size),
                          "another rank could not split the global batch")


def initial_split(p, policy, model, dataset, nprocs):
    """The global batch B, the memory caps and the policy's checked initial sizes (pydtnn.parallel.policies),
    which the policy keeps; refused when B does not suit the data or a local batch does not fit memory."""
    from pydtnn.launch import config as config_checks
    from pydtnn.parallel import balance
    n = nprocs if p.parallel == "data" else 1
    B = p.global_batch_size or p.batch_size * n
    caps = balance.caps_for(p.max_local_batch, n)
    config_checks.check_against_data(p, dataset, B)
    sizes = balance.check_split(policy.initial_sizes(B, n, caps), B, n, caps, f"balance policy {policy.name}")
    policy.sizes = list(sizes)
    _check_batch_fits(model, sizes, len(dataset.train), p)
    return types.SimpleNamespace(global_batch=B, sizes=sizes, caps=caps)


def make_trainer(config, devices, local, split, comm):
    """The Trainer: optimizer, loss, schedulers and the rest from the flags; then the weights or checkpoint
    it restores and the speed probe of a policy that asks for one."""
    from pydtnn.losses import get_loss
    from pydtnn.optimizers import get_optimizer
    from pydtnn.parallel.comm import raise_together
    from pydtnn.schedulers import check_metrics, make_schedulers
    from pydtnn.training.loop import Trainer
    from pydtnn.training.options import Checkpointing, Emulation, Loop, Outputs, Parallelism
    p, model, dataset = config.p, local.model, local.dataset
    optimizer = get_optimizer(p.optimizer_name, learning_rate=config.learning_rate, momentum=p.momentum,
                              nesterov=p.nesterov, decay=p.decay, rho=p.rho, beta1=p.beta1, beta2=p.beta2,
                              epsilon=p.epsilon)
    has_val = dataset.val is not None
    schedulers = make_schedulers(p.lr_schedulers_names, p)
    check_metrics(schedulers, {"loss", *config.metrics}, has_val)
    if not has_val:          # metric-driven schedulers need validation data
        schedulers = [s for s in schedulers if not (getattr(s, "metric", "").startswith("val_")
                                                    and s.name != "model_checkpoint")]
    from pydtnn.observe.step_metrics import StepMetrics
    step_metrics = StepMetrics(comm.rank, p.tensorboard_dir, p.step_history_file, p.plots_dir)
    trainer = Trainer(
        model, dataset, optimizer, loss=get_loss(p.loss_func, label_smoothing=p.label_smoothing), metrics=config.metrics,
        parallel=Parallelism(comm=comm, global_batch=split.global_batch, sizes=split.sizes, policy=config.policy,
                             gradient_weighting=config.weighting, non_blocking=p.non_blocking_mpi,
                             sync_batchnorm=p.sync_batchnorm and config.data_parallel, max_local_batch=split.caps,
                             clip_grad_norm=p.clip_grad_norm),
        loop=Loop(steps_per_epoch=p.steps_per_epoch, seed=p.seed, schedulers=schedulers, callbacks=[step_metrics]),
        checkpointing=Checkpointing(checkpoint_dir=p.checkpoint_dir, save_steps=p.model_checkpoint_save_steps,
                                    save_minutes=p.model_checkpoint_save_minutes, handle_signals=True),
        outputs=Outputs(history_file=p.history_file, progress=p.progress_bar,
                        tracer_output=p.tracer_output if p.tracing else None, flags=vars(p),
                        trace_steps=config.trace_steps, profile_layers=p.profile_layers),
        emulation=Emulation(devices.emulate, devices.emulate_spin, devices.emulate_reference))
    anew = config.resume.anew

    def restore():
        if p.weights_and_bias_filename:
            from pydtnn.training.checkpointing import load_weights
            load_weights(p.weights_and_bias_filename, model)
        if p.resume:
            # a measured split (probe or dynamic) continues from the checkpoint; one given by flags is the flags'
            trainer.resume(p.resume, keep_split=trainer.policy.measured,
                           learning_rate=config.learning_rate if "learning_rate" in anew else None,
                           restore_optimizer="optimizer_name" not in anew)
    raise_together(comm, restore, "another rank could not read its weights or checkpoint")
    trainer.probe_split()
    return trainer


def _print_banner(config, devices, local, split, trainer):
    p, model = config.p, local.model
    _print_params(p, config.nreplicas)
    for line in config.resume.lines:
        print(line)
    in_force, rate = trainer.optimizer.learning_rate, config.learning_rate
    if p.resume and in_force != rate:
        print(f"learning rate in force: {in_force:g} (restored from the checkpoint {p.resume})")
    elif config.learning_rate_why:
        print(f"learning rate in force: {rate:g} ({config.learning_rate_why})")
    print(model.summary())
    print(f"threads per replica: {', '.join(map(str, devices.threads_all))} ({devices.threads_why})")
    if "gpu" in devices.kinds:
        print(f"GPU float32 precision: {p.precision}" + (" (TF32 tensor cores)" if p.precision == "tf32"
                                                          else " (strict, no TF32)"))
    if config.data_parallel:
        print(f"global batch {split.global_batch} split as {trainer.sizes} (balance {p.balance}, weighting "
              f"{p.gradient_weighting})")
    if devices.kinds[0] == "cpu":
        print(f"CPU convolutions: {local.options['conv_algorithm']}")
    for flag in ("enable_conv_gemm", "enable_memory_cache"):
        if getattr(p, flag):
            print(f"note: --{flag} is accepted for upstream's job scripts and has no effect")
    if local.dataset.val is None and p.lr_schedulers_names:
        print("note: no validation data; metric-driven LR schedulers are off "
              "(use --validation_split or --test_as_validation)")
    sys.stdout.flush()


def train(config, trainer, comm):
    """Evaluate and/or train as the flags say, then the final weights and the report; the exit status."""
    from pydtnn.errors import OutputError
    from pydtnn.training.loop import Preempted
    p, model, rank, test = config.p, trainer.model, comm.rank, trainer.dataset.test
    if p.evaluate_only:
        _print_eval(trainer, test, "evaluation", rank)
        return 0
    if p.evaluate_on_train:
        _print_eval(trainer, test, "test before training", rank)
    try:
        if p.profile and rank == 0:
            import cProfile
            import pstats
            profiler = cProfile.Profile()
            profiler.runcall(trainer.fit, p.num_epochs)
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
        else:
            trainer.fit(p.num_epochs)
    except Preempted as e:                 # every rank stopped after the same step (agreed in the step's allreduce)
        from pydtnn.parallel.runtime import shutdown
        shutdown.end_job(EXIT_PREEMPTED, f"pydtnn: {e}")
    except OutputError as e:
        # an output failed after a whole step (a history row, a checkpoint, the trace): the weights are whole
        raise OutputError(f"{e}{_rescue_weights(p, model, comm)}") from None
    if p.evaluate_on_train:
        _print_eval(trainer, test, "test after training", rank)
    _save_final_weights(p, model, comm)
    if rank == 0:
        for line in trainer.report():
            print(line)
        if p.profile_layers:
            from pydtnn.observe.layer_profile import measure_peak_flops
            print(trainer.layer_profile.table(measure_peak_flops(model.backend),
                                              title=f"layer profile of rank 0 (b_i = {trainer.sizes[0]})"))
    comm.barrier()
    return 0


def _check_outputs(p, comm):
    """Every output path is writable before any work (rank 0, which writes them, checks; all ranks agree)."""
    from pydtnn.parallel.comm import raise_together
    from pydtnn.outputs import check_output_dir, check_output_file

    def check():
        check_output_file(p.history_file, "--history_file")
        check_output_file(p.save_weights_and_bias_filename, "--save_weights_and_bias_filename")
        if p.tracing:
            check_output_file(p.tracer_output, "--tracer_output")
        check_output_file(p.step_history_file, "--step_history_file")
        for flag in ("tensorboard_dir", "plots_dir"):
            if getattr(p, flag):
                check_output_dir(getattr(p, flag), f"--{flag}", create=True)
        if p.tensorboard_dir:
            try:
                import tensorboardX  # noqa: F401
            except ImportError:
                raise ConfigError("--tensorboard_dir needs tensorboardX (pip install tensorboardX)") from None
        # only checked: it is created by the first checkpoint (a run that writes none leaves no folder)
        check_output_dir(p.checkpoint_dir, "--checkpoint_dir", create=False)
    raise_together(comm, check, "rank 0 cannot write an output path", rank0_only=True)


def _check_batch_fits(model, sizes, ntrain, p):
    """A local batch whose activations cannot fit in this machine's memory is refused before allocating."""
    from pydtnn.launch.limits import activation_bytes, check_fits
    local = max(sizes) if p.steps_per_epoch > 0 else min(max(sizes), ntrain)   # a full pass never exceeds N
    flag = "--global_batch_size" if p.global_batch_size else "--batch_size"
    check_fits(activation_bytes(model, local), f"a local batch of {local} samples of {p.model_name}",
               f"lower {flag}")


def _save_final_weights(p, model, comm):
    """Rank 0 writes the final weights; if that fails, it tries the checkpoint folder, and says where."""
    from pydtnn.training.checkpointing import save_weights
    from pydtnn.errors import OutputError
    from pydtnn.parallel.comm import raise_together
    if not p.save_weights_and_bias_filename:
        return

    def save():
        try:
            save_weights(p.save_weights_and_bias_filename, model)
        except OutputError as e:
            fallback = os.path.join(p.checkpoint_dir, "final_weights.npz")
            try:
                os.makedirs(p.checkpoint_dir, exist_ok=True)
                save_weights(fallback, model)
            except (OutputError, OSError) as e2:
                raise OutputError(f"{e}; saving them to {fallback} failed too ({e2}): the trained weights "
                                  f"are lost") from None
            raise OutputError(f"{e}; the trained weights were saved to {fallback} instead") from None
    raise_together(comm, save, "rank 0 could not write the final weights", rank0_only=True)


def _rescue_weights(p, model, comm):
    """After an output failed during training, the weights still go to --save_weights_and_bias_filename (or
    its fall-back, --checkpoint_dir/final_weights.npz); returns what to add to the error's line."""
    from pydtnn.errors import OutputError
    if not p.save_weights_and_bias_filename:
        return ""
    try:
        _save_final_weights(p, model, comm)
    except OutputError as e:
        return f"; {e}"
    return f"; the trained weights were saved to {p.save_weights_and_bias_filename}"


def _download_on_rank0(p, comm):
    """Only rank 0 downloads (two writers of one .part file would corrupt it); the others wait for it."""
    from pydtnn.datasets import load_dataset
    from pydtnn.parallel.comm import raise_together
    raise_together(comm, lambda: load_dataset(p.dataset_name, train_path=p.dataset_train_path,
                                              test_path=p.dataset_test_path, download=True),
                   "the dataset download failed on rank 0", rank0_only=True)


def _print_eval(trainer, split, what, rank):
    results = trainer.evaluate(split)
    if rank == 0:
        print(f"{what}: " + ", ".join(f"{k}={v:.4f}" for k, v in results.items()))


def main(argv=None) -> int:
    from pydtnn.parallel.runtime import shutdown
    # a log file or a launcher's pipe gets whole lines, in order, as they happen
    getattr(sys.stdout, "reconfigure", lambda **kw: None)(line_buffering=True)
    try:
        p, given = parse_command_line(argv)
        return run(p, given)
    except PyDTNNError as e:
        shutdown.exit_on_user_error(e)
    except KeyboardInterrupt:
        print("pydtnn: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception:
        shutdown.abort_on_bug()
        raise
