"""What rank 0 prints before training: the parameters, the resumed state, the model and how it runs."""
from __future__ import annotations

import sys


def print_banner(config, devices, local, split, trainer):
    p, model = config.p, local.model
    _print_params(p, config.nreplicas)
    for line in config.resume.lines + (config.notes or []):
        print(line)
    in_force, rate = trainer.optimizer.learning_rate, config.learning_rate
    if p.resume and in_force != rate:
        print(f"learning rate in force: {in_force:g} (restored from the checkpoint {p.resume})")
    elif config.learning_rate_why:
        print(f"learning rate in force: {rate:g} ({config.learning_rate_why})")
    print(model.summary())
    print(f"threads per replica: {', '.join(map(str, devices.threads_all))} ({devices.threads_why})")
    if "gpu" in devices.kinds:
        what = {"tf32": "TF32 tensor cores", "fp32": "no TF32, any cuDNN algorithm",
                "fp32_strict": "no TF32, FFT or Winograd"}[p.precision]
        print(f"GPU float32 precision: {p.precision} ({what})")
    if getattr(split, "batch_note", None):
        print(split.batch_note)
    if config.data_parallel:
        print(f"global batch {split.global_batch} split as {trainer.sizes} (balance {p.balance}, weighting "
              f"{p.gradient_weighting})")
        for line in trainer.policy.describe():          # the model it balances by (probed points, fit)
            print(line)
    if devices.kinds[0] == "cpu":
        print(f"CPU convolutions: {local.options['conv_algorithm']}")
    for flag in ("enable_conv_gemm", "enable_memory_cache"):
        if getattr(p, flag):
            print(f"note: --{flag} is accepted for upstream's job scripts and has no effect")
    if local.dataset.val is None and p.lr_schedulers_names:
        print("note: no validation data; metric-driven LR schedulers are off "
              "(use --validation_split or --test_as_validation)")
    sys.stdout.flush()


def _print_params(p, comm_size):
    rows = [(k, v) for k, v in sorted(vars(p).items())]
    width = max(len(k) for k, _ in rows)
    print(f"PyDTNN parameters ({comm_size} replica(s)):")
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")
