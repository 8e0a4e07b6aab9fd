"""The launcher's flags: their argument types, one function per flag group, and the parser.

`build_parser` gives the launcher's parser (`pydtnn.cli`); the simulator (`pydtnn.sim.__main__`) builds its own
from the same argument types and `OneLineParser`. The parser's introspection (`flag_dests`, `option_of`) and
the text of a value as typed (`flag_text`) serve the run configuration (`pydtnn.launch.config`) and the ranks'
agreement on flags (`pydtnn.launch.agreement`).
"""
from __future__ import annotations

import argparse
import math
import os

from pydtnn.errors import ConfigError
from pydtnn.optimizers import OPTIMIZERS
from pydtnn.parallel.balance.policies import balance_help
from pydtnn.parallel.comm.compression import GRAD_COMPRESSIONS

TRUE, FALSE = ("true", "1", "yes", "y", "on"), ("false", "0", "no", "n", "off")


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
    return _positive_list(value, float, "numbers", lambda v: math.isfinite(v) and v > 0)


def positive_int_list(value):
    return _positive_list(value, int, "integers", lambda v: v >= 1)


def _positive_list(value, convert, what, positive):
    """A comma list of at least one value, each converted and positive, or one line saying what is wrong."""
    try:
        out = [convert(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {value!r}") from None
    if not out or not all(positive(v) for v in out):
        raise argparse.ArgumentTypeError(f"expected positive comma-separated {what}, got {value!r}")
    return out


def policy_options(value):
    """key=value,... -> a dict; values read as int, float or true/false where they are, else as text."""
    out = {}
    for part in [v for v in str(value).split(",") if v.strip()]:
        key, sep, text = part.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key.isidentifier():
            raise argparse.ArgumentTypeError(f"expected key=value,... got {part!r}")
        for convert in (int, float):
            try:
                out[key] = convert(text)
                break
            except ValueError:
                continue
        else:
            out[key] = {"true": True, "false": False}.get(text.lower(), text)
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
                   help="registered model name (see README) or a path to a .py file defining create_model(model) (the file's "
                        "code runs: name only files you would run)")
    g.add_argument("--batch_size", type=positive_int, default=64,
                   help="local batch per replica (upstream meaning); the global batch is batch_size x replicas "
                        "unless --global_batch_size is given; when neither is given and the default is more than "
                        "the training samples, the largest power of two that fits (said at start)")
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
                        "line does not give, never its outputs, paths or code; a flag given anew wins (one line for each "
                        "that changes the restored state); it may come from another number of replicas; not with "
                        "--weights_and_bias_filename")
    g.add_argument("--checkpoint_dir", default="checkpoints",
                   help="where model_checkpoint, step checkpoints, the SIGTERM/SIGUSR1/SIGINT checkpoint and the rescue "
                        "of a failed output write (created by the first checkpoint)")
    g.add_argument("--overwrite", type=B, default=False,
                   help="let this run replace output files it did not create (the history, weights, trace, "
                        "step history, plot, and checkpoints in --checkpoint_dir of a later point than this "
                        "run starts from); without it such an output is refused before any work")


def _dataset_flags(g):
    """Which data, its targets, and the held-out and augmentation settings."""
    B = boolean
    g.add_argument("--dataset", dest="dataset_name", default="synthetic", type=dataset_name,
                   help="synthetic (learnable, offline; upstream's default was mnist), mnist, cifar10, imagenet, "
                        "bytes (a text file, --dataset_train_path, default a shipped public-domain text, as "
                        "--sequence_length byte ids with next-byte targets: a language model's), or FILE.py "
                        "defining create_dataset(seed), whose code runs (docs/datasets.md)")
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
    g.add_argument("--optimizer", dest="optimizer_name", default="sgd", choices=list(OPTIMIZERS))
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
    g.add_argument("--grad_compression", default="none", choices=GRAD_COMPRESSIONS,
                   help="the format the weighted gradients cross the network in: none (the model's dtype), fp16 or "
                        "bf16 (half the bytes; each element within P u sum_i |w_i g_i| of the exact sum, u = 2^-11 for "
                        "fp16, 2^-8 for bf16; fp16 overflows above 65504)")
    g.add_argument("--balance", default="none", help=balance_help())
    g.add_argument("--balance_options", type=policy_options, default=None,
                   help="key=value,... for the policy: a user's class gets them as keyword arguments; fpm and "
                        "dynamic take points, rounds, tolerance, bucket (GPU local batches a multiple of it, 8), "
                        "allow_zero (replicas that may get 0 samples, as 1:2), probe_s (seconds of timed passes per "
                        "probe point, 0.2), dynamic also hysteresis, drift, probe")
    g.add_argument("--replica_speeds", type=float_list, default=None, help="v1,v2,... relative replica speeds")
    g.add_argument("--max_local_batch", type=positive_int_list, default=None,
                   help="memory caps: the most samples a replica holds in one pass, one value for all or one per "
                        "replica; a replica whose share is larger runs it as micro-batches of at most its cap "
                        "(gradient accumulation: the same result, one reduction a step); the split is not bounded "
                        "by the caps, and a probe times such shares as their micro-batches")
    g.add_argument("--rebalance_interval", type=positive_int, default=20, help="dynamic: steps between re-splits")
    g.add_argument("--gradient_weighting", default="proportional",
                   help="proportional: w_i = b_i/B (the exact global-batch gradient); uniform: w_i = 1/P; or a "
                        "user's FILE.py:FUNCTION (or module:FUNCTION) weights(sizes) -> list of w_i")
    g.add_argument("--sync_batchnorm", type=B, default=False,
                   help="BatchNormalization in training uses the global batch's statistics, summed over the "
                        "replicas with their own b_i (exact for unequal splits; two small allreduces per layer)")
    g.add_argument("--accumulation_steps", type=positive_int, default=1,
                   help="K: each replica runs its local batch of a global step as K micro-batches (as equal as "
                        "possible; fewer when it holds fewer than K samples) and adds up their gradients; one "
                        "reduction and one update per global step, the same result as one pass on the batch")
    g.add_argument("--emulate_speeds", type=float_list, default=None,
                   help="f1,f2,...: replica i behaves as a device f_i/max(f) as fast as the full-speed replicas (each step's "
                        "compute padded to b_i*t0/f_i, t0 their measured time per sample); for experiments on one machine")
    g.add_argument("--emulate_costs", default=None,
                   help="A+C,...: replica i's compute of b samples takes A + C*b, A a fixed time per step (30ms, 0) and "
                        "C per sample, a factor on this machine's own time per sample (2.0) or a time (0.5ms); e.g. "
                        "40ms+1.0,0+3.0,0+3.0 emulates one GPU-like replica beside two CPU-like ones (not with "
                        "--emulate_speeds)")
    g.add_argument("--emulate_schedule", default=None,
                   help="R:F@FIRST-LAST,...: replica R's emulated compute is F times longer during global steps "
                        "FIRST <= s < LAST (0-based, over epochs), e.g. 1:3@200-400 (a straggler)")
    g.add_argument("--restore_emulation", type=B, default=False,
                   help="with --resume: emulate as the checkpoint's run did (its --emulate_* flags); by default a "
                        "resumed run emulates only what its own command line asks")


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
    g.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "fp32_strict"],
                   help="GPU float32 math: fp32 (no TF32, any cuDNN algorithm, as PyTorch with TF32 off), tf32 "
                        "(tensor cores, ~1e-3 relative error) or fp32_strict (no TF32, FFT or Winograd: errors near "
                        "float32 rounding)")
    g.add_argument("--cuda_graphs", type=B, default=False,
                   help="GPU replicas: capture a step's forward and backward as one CUDA graph after 2 warm-up steps "
                        "and replay it (one launch a step; batches of another shape run as usual)")


def _tracing_and_output_flags(g):
    """Traces, per-step scalars, plots, profiles, the progress bar and how much the start says."""
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
    g.add_argument("--verbose", type=B, default=False,
                   help="print every parameter and the model's layers at the start, not only the few lines "
                        "of the model, data, replicas, precision and outputs")


def parse_args(argv=None):
    return build_parser().parse_args(argv)


# ------------------------------------------------------------------------------- the parser, read back

def option_of(parser: argparse.ArgumentParser, dest: str) -> str:
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return action.option_strings[0]
    return f"--{dest}"


def flag_dests(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag's attribute name, in the parser's (the --help) order."""
    return [a.dest for a in parser._actions if a.option_strings and a.dest != "help"]


def flag_text(value) -> str:
    """A flag's value as it would be typed on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(flag_text(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={flag_text(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if value != "" else '""'


def json_value(value):
    """A flag value as it reads back from a checkpoint's JSON (tuples are lists)."""
    if isinstance(value, tuple):
        return [json_value(v) for v in value]
    return value
