"""What rank 0 prints before training: a few lines (the model, the data, the replicas and their split, the
precision, the outputs), then what the run decided for the user (resumed state, learning rate, notes).
`--verbose true` adds every parameter and the model's layers in front of them."""
from __future__ import annotations

import sys

from pydtnn.launch.flags import flag_text

GPU_PRECISION = {"tf32": "TF32 tensor cores", "fp32": "no TF32, any cuDNN algorithm",
                 "fp32_strict": "no TF32, FFT or Winograd"}

# (flag, what it holds): the files and folders a run writes when given, in the order they are said
OUTPUT_FILES = (("history_file", "history"), ("save_weights_and_bias_filename", "final weights"),
                ("step_history_file", "step history"), ("tensorboard_dir", "TensorBoard"), ("plots_dir", "plots"))


def print_banner(config, devices, local, split, trainer):
    p, model = config.p, local.model
    if p.verbose:
        _print_params(p, config.nreplicas)
        print(model.summary())
    print(_model_line(p, model))
    print(f"data: {local.dataset.describe()}")
    print(_replicas_line(config, split))
    if getattr(split, "batch_note", None):
        print(split.batch_note)
    if config.data_parallel:
        print(f"global batch {split.global_batch} split as {trainer.sizes} (balance {p.balance}, weighting "
              f"{p.gradient_weighting})")
        for line in trainer.policy.describe():          # the model it balances by (probed points, fit)
            print(line)
        if p.grad_compression != "none":
            print(_compression_line(p.grad_compression, config.nreplicas))
    micro_batches = trainer.dp.micro_batch_counts(trainer.sizes)
    if any(n > 1 for n in micro_batches):
        print(_accumulation_line(p.accumulation_steps, trainer.dp.caps, trainer.sizes, micro_batches))
    print(f"threads per replica: {', '.join(map(str, devices.threads_all))} ({devices.threads_why})")
    if "gpu" in devices.kinds:
        print(f"GPU float32 precision: {p.precision} ({GPU_PRECISION[p.precision]})")
    if devices.kinds[0] == "cpu":
        print(f"CPU convolutions: {local.options['conv_algorithm']}")
    print(_outputs_line(p))
    for line in config.resume.lines + (config.notes or []):
        print(line)
    in_force, rate = trainer.optimizer.learning_rate, config.learning_rate
    if p.resume and in_force != rate:
        print(f"learning rate in force: {in_force:g} (restored from the checkpoint {p.resume})")
    elif config.learning_rate_why:
        print(f"learning rate in force: {rate:g} ({config.learning_rate_why})")
    for flag in ("enable_conv_gemm", "enable_memory_cache"):
        if getattr(p, flag):
            print(f"note: --{flag} is accepted for upstream's job scripts and has no effect")
    if local.dataset.val is None and p.lr_schedulers_names:
        print("note: no validation data; metric-driven LR schedulers are off "
              "(use --validation_split or --test_as_validation)")
    sys.stdout.flush()


def _model_line(p, model) -> str:
    """The model's name and size, its floating type and backend (the total line of `Model.summary`)."""
    size = f"{model.nparams * model.dtype.itemsize / 2**20:.2f} MiB as {model.dtype.name}"
    more = "" if p.verbose else "; its layers and every parameter: --verbose true"
    return f"model: {p.model_name}, {model.nparams:,} parameters ({size}, backend {model.backend.name}){more}"


def _replicas_line(config, split) -> str:
    """How many replicas, on which devices, and the batch (data parallel: the split follows on its own line)."""
    p, n = config.p, config.nreplicas
    if not config.data_parallel:
        return f"replicas: 1 (--parallel sequential) on {config.devices[0]}, batch {split.global_batch}"
    kinds = sorted(set(config.devices), key=config.devices.index)
    if len(kinds) == 1:
        on = f"all on {kinds[0]}"
    elif n <= 16:
        on = f"on {', '.join(config.devices)}"
    else:
        on = "on " + ", ".join(f"{config.devices.count(k)} {k}" for k in kinds)
    emulated = [f"--{flag} {flag_text(getattr(p, flag))}" for flag in ("emulate_speeds", "emulate_costs",
                                                                        "emulate_schedule") if getattr(p, flag)]
    return f"replicas: {n} (--parallel data) {on}" + (f", emulating {', '.join(emulated)}" if emulated else "")


def _outputs_line(p) -> str:
    """The files the run writes, and when it writes checkpoints (always on a stop signal once training)."""
    if p.evaluate_only:
        return "outputs: none (--evaluate_only true)"
    files = [f"{what} {getattr(p, flag)}" for flag, what in OUTPUT_FILES if getattr(p, flag)]
    if p.tracing:
        files.append(f"trace {p.tracer_output}")
    when = []
    if "model_checkpoint" in [name.strip() for name in (p.lr_schedulers_names or "").split(",")]:
        when.append(f"every {p.model_checkpoint_save_freq} epoch(s) and best.npz")
    if p.model_checkpoint_save_steps:
        when.append(f"every {p.model_checkpoint_save_steps} step(s)")
    if p.model_checkpoint_save_minutes:
        when.append(f"every {p.model_checkpoint_save_minutes:g} min")
    when.append("on SIGTERM, SIGUSR1 or Ctrl-C")
    return (f"outputs: {', '.join(files) or 'no files'}; checkpoints (--checkpoint_dir {p.checkpoint_dir}) "
            f"{', '.join(when)}")


def _print_params(p, comm_size):
    rows = [(k, v) for k, v in sorted(vars(p).items())]
    width = max(len(k) for k, _ in rows)
    print(f"PyDTNN parameters ({comm_size} replica(s)):")
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")


def _compression_line(name, nreplicas) -> str:
    """--grad_compression: the format and the error bound it costs (`pydtnn.parallel.comm.compression`)."""
    if nreplicas < 2:
        return f"gradient compression {name}: one replica reduces nothing, so nothing is compressed"
    u = {"fp16": "2^-11", "bf16": "2^-8"}[name]
    return (f"gradients reduced in {name} (2 bytes an element on the wire): each element within about {nreplicas} x "
            f"{u} x sum_i |w_i g_i| of the exact sum (docs/data_parallel.md#compressed-reductions)")


def _accumulation_line(steps, caps, sizes, counts) -> str:
    """--accumulation_steps, and the memory caps of a pass (--max_local_batch, lowered by a GPU's measured
    cap): each replica's micro-batches of its local batch in the first split (their sizes, the larger first:
    `pydtnn.parallel.accumulation`)."""
    from pydtnn.parallel.accumulation import micro_batch_bounds
    shown = []
    for b, n in zip(sizes, counts):
        parts = [hi - lo for lo, hi in micro_batch_bounds(b, n)] if n else []
        shown.append(f"{b} = " + ("+".join(map(str, parts)) if len(set(parts)) > 1 else
                                  f"{n} x {parts[0]}" if parts else "none"))
    held = f", memory caps {flag_text(caps)} samples a pass" if caps else ""
    return (f"gradient accumulation: --accumulation_steps {steps}{held}, one reduction and one update per step; "
            f"micro-batches {'; '.join(shown)}")
