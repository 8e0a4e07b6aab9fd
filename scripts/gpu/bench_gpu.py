#!/usr/bin/env python
"""Training-step time of PyDTNN's GPU backend against PyTorch, same models, batch and precision, one GPU.

    python scripts/gpu/bench_gpu.py                                   # resnet50_imagenet, vgg16_imagenet, simplecnn
    python scripts/gpu/bench_gpu.py --precision fp32 --models simplecnn --block 10
    python scripts/gpu/bench_gpu.py --no_autotune --conv legacy       # heuristic plans, the cuDNN legacy API
    python scripts/gpu/bench_gpu.py --profile --jsonl rows.jsonl      # + a kernel profile of each; a JSON line a row
    python scripts/gpu/bench_gpu.py --max_seconds 120                 # ends by itself within 2 minutes

Like with like:
- precision "tf32": TF32 allowed on both sides; "fp32": TF32 off on both (torch.backends.cuda.matmul.allow_tf32
  = torch.backends.cudnn.allow_tf32 = False), any cuDNN algorithm; "fp32_strict": ours without TF32, FFT or
  Winograd, beside PyTorch's fp32 (PyTorch has no such mode: the row says what strictness costs);
- plans: ours autotuned (the default, with the step-level guard: `ConvRunner.guard`) against
  torch.backends.cudnn.benchmark = True; --no_autotune gives ours the heuristic's plans.
One step, ours:    the training step of `pydtnn.parallel.DataParallel` on one process (forward, loss, backward,
                   SGD with momentum 0.9), with no host synchronization inside (the loss stays on the device)
One step, PyTorch: zero_grad + forward + CrossEntropyLoss + backward + SGD.step (momentum 0.9)
Inputs live on the device. Steps run in blocks of --block with one synchronization at the end of each (as in
training, where nothing waits between steps); each framework's block time is the median over --rounds
blocks, the frameworks alternating block by block. The ratio is ours / PyTorch in images per second
(> 1: ours is faster). "first step" includes building (and tuning) the cuDNN graphs.

--profile: one more block of each framework under PyTorch's profiler with CUDA activities, which records every
kernel of the process (CuPy's and cuDNN's too): per step, wall ms, GPU-busy ms (the kernels' summed
durations), kernels launched, and the top kernels by time.

--max_seconds: the run ends by itself within that time. Before each row (a model in one precision), each timed
round after a row's first and each profile, it checks that the longest such piece so far still fits; rows not
started are printed as skipped, and one closing `STOPPED: ...` line says what was not run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np  # noqa: E402

from time_limit import TimeLimit

DEFAULT_MODELS = "resnet50_imagenet,vgg16_imagenet,simplecnn"


# ----------------------------------------------------------------------------------------------- ours

def ours_setup(name, batch, precision, args):
    from pydtnn import Model
    from pydtnn.backends.gpu.backend import GPUBackend
    from pydtnn.models import build_model
    from pydtnn.optimizers import SGD
    from pydtnn.parallel import DataParallel
    be = GPUBackend(dtype="float32", seed=0, precision=precision, auto_conv_alg=not args.no_autotune,
                    conv_impl=args.conv)
    model = Model(backend=be, seed=0)
    build_model(name, model)
    nclasses, shape = model.output_shape[0], tuple(model.input_shape)
    rng = np.random.default_rng(0)
    x = be.asarray(rng.standard_normal((batch,) + shape).astype(np.float32))
    y = be.asarray(np.eye(nclasses, dtype=np.float32)[rng.integers(0, nclasses, batch)])
    dp = DataParallel(model, SGD(learning_rate=0.01, momentum=0.9), global_batch=batch)
    step = ours_step(dp, x, y)
    return step, be, shape, nclasses


def ours_step(dp, x, y):
    """One training step of DataParallel with no host synchronization inside (the loss stays on the device)."""
    def step():
        dp.local_gradients(x, y, 1.0, sync=False)
        dp.update()
    return step


# -------------------------------------------------------------------------------------------- PyTorch

def _torch_resnet50(nclasses, v15):
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, f, stride):
            super().__init__()
            out = 4 * f
            s1, s3 = (1, stride) if v15 else (stride, 1)
            self.main = nn.Sequential(
                nn.Conv2d(cin, f, 1, s1, bias=False), nn.BatchNorm2d(f), nn.ReLU(inplace=True),
                nn.Conv2d(f, f, 3, s3, 1, bias=False), nn.BatchNorm2d(f), nn.ReLU(inplace=True),
                nn.Conv2d(f, out, 1, bias=False), nn.BatchNorm2d(out))
            self.short = nn.Identity() if stride == 1 and cin == out else nn.Sequential(
                nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

        def forward(self, x):
            return torch.relu(self.main(x) + self.short(x))

    layers, cin = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                   nn.MaxPool2d(3, 2, 1)], 64
    for i, (f, n) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        for b in range(n):
            layers.append(Bottleneck(cin, f, 2 if b == 0 and i > 0 else 1))
            cin = 4 * f
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, nclasses))


def _torch_vgg16(nclasses):
    from torch import nn
    layers, cin = [], 3
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
            cin = v
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
                         nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5), nn.Linear(4096, nclasses))


def torch_model(name, nclasses):
    """(module, description)."""
    from torch import nn
    try:
        import torchvision
    except ImportError:
        torchvision = None
    if name == "simplecnn":
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, nclasses)), "nn.Sequential"
    if name in ("resnet50_imagenet", "resnet50v15_imagenet"):
        v15 = name == "resnet50v15_imagenet"
        if torchvision is None:
            return _torch_resnet50(nclasses, v15), "hand-written ResNet-50 v1" + (".5" if v15 else "")
        m = torchvision.models.resnet50(weights=None, num_classes=nclasses)
        if not v15:        # ResNet v1: the stride on the first 1x1 convolution of a bottleneck, as ours
            for stage in (m.layer2, m.layer3, m.layer4):
                stage[0].conv1.stride, stage[0].conv2.stride = (2, 2), (1, 1)
        return m, "torchvision resnet50" + ("" if v15 else " (strides moved to conv1: v1)")
    if name == "vgg16_imagenet":
        if torchvision is None:
            return _torch_vgg16(nclasses), "hand-written VGG-16"
        return torchvision.models.vgg16(weights=None, num_classes=nclasses), "torchvision vgg16"
    raise SystemExit(f"no PyTorch equivalent of {name!r} in this script")


def torch_setup(name, batch, shape, nclasses, precision, device):
    import torch
    from torch import nn
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda", device)
    module, what = torch_model(name, nclasses)
    model = module.to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn((batch,) + tuple(shape), device=dev, generator=gen)
    y = torch.randint(0, nclasses, (batch,), device=dev, generator=gen)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return step, what


# ------------------------------------------------------------------------------------------ the runs

def block_ms(step, n, synchronize):
    """Milliseconds per step over a block of `n` steps with one synchronization at its end."""
    synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    synchronize()
    return 1e3 * (time.perf_counter() - t0) / n


def kernel_profile(step, n, synchronize, top=12):
    """Per step, from PyTorch's profiler (CUDA activities: every kernel of the process, CuPy's and cuDNN's
    included): wall ms, GPU-busy ms (summed kernel, memcpy and memset durations), launches, top kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        synchronize()
        wall = time.perf_counter() - t0
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    by_name = {}
    for e in events:
        us, count = by_name.get(e.name, (0.0, 0))
        by_name[e.name] = (us + e.time_range.elapsed_us(), count + 1)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {"wall_ms": 1e3 * wall / n, "gpu_busy_ms": sum(e.time_range.elapsed_us() for e in events) / 1e3 / n,
            "launches": len(events) / n,
            "top": [{"kernel": k[:120], "ms": us / 1e3 / n, "per_step": c / n} for k, (us, c) in ranked]}


def alternate_blocks(steps, sync, args, limit, kind):
    """{framework: [ms per step of each block]}: --rounds blocks each, the frameworks alternating (and who goes
    first alternating); a round after the first starts only if the longest round so far fits in the limit."""
    times = {k: [] for k in steps}
    order = list(steps)
    for i in range(args.rounds):
        if i and not limit.fits(kind):
            break
        with limit.timing(kind):
            for k in (order if i % 2 == 0 else order[::-1]):
                times[k].append(block_ms(steps[k], args.block, sync[k]))
    return times


def bench_one(name, precision, args, use_torch, limit):
    row = {"model": name, "precision": precision, "batch": args.batch}
    t0 = time.perf_counter()
    ours, be, shape, nclasses = ours_setup(name, args.batch, precision, args)
    sync = {"ours": be.synchronize}
    t1 = time.perf_counter()
    ours()
    be.synchronize()
    row["ours_first_step_s"] = time.perf_counter() - t1          # includes building (and tuning) the cuDNN graphs
    row["ours_setup_s"] = time.perf_counter() - t0
    for _ in range(args.warmup):
        ours()
    row["guard"] = be.conv.guard(lambda: block_ms(ours, 2, be.synchronize))    # tuned plans vs heuristic's
    steps = {"ours": ours}
    if use_torch:
        import torch
        torch_precision = "fp32" if precision == "fp32_strict" else precision
        theirs, row["torch_model"] = torch_setup(name, args.batch, shape, nclasses, torch_precision, be.device)
        row["torch_precision"] = torch_precision
        steps["torch"] = theirs
        sync["torch"] = torch.cuda.synchronize
        for _ in range(args.warmup):
            theirs()
    times = alternate_blocks(steps, sync, args, limit, f"round {name} {precision}")
    row["rounds"] = len(times["ours"])
    if row["rounds"] < args.rounds:
        limit.skip(f"{precision} {name}: rounds {row['rounds'] + 1}-{args.rounds}")
    for k, ts in times.items():
        med = statistics.median(ts)
        row[f"{k}_ms"] = med
        row[f"{k}_range_ms"] = [min(ts), max(ts)]
        row[f"{k}_img_s"] = 1e3 * args.batch / med
    if use_torch:
        row["ratio"] = row["ours_img_s"] / row["torch_img_s"]
        if args.profile:                    # under the profiler a block takes longer: at least two rounds' time
            kind = f"profile {name} {precision}"
            if limit.fits(kind, like="profile ", at_least=2 * limit.estimate(f"round {name} {precision}")):
                with limit.timing(kind):
                    row["profile"] = {k: kernel_profile(steps[k], args.block, sync[k]) for k in steps}
            else:
                row["profile_skipped"] = "time limit (--max_seconds)"
                limit.skip(f"{precision} {name}: its kernel profile")
    row["conv"] = be.conv_report()
    return row


def free_device_memory(use_torch):
    """Between configurations: CuPy's and PyTorch's cached blocks back to the device."""
    import cupy
    cupy.get_default_memory_pool().free_all_blocks()
    if use_torch:
        import torch
        torch.cuda.empty_cache()


def print_table(rows):
    head = f"{'precision':11}  {'model':22} {'ours ms':>9} {'ours img/s':>11} {'torch ms':>9} {'torch img/s':>12} " \
           f"{'ours/torch':>10} {'first step s':>12}  convolutions"
    print(head)
    print("-" * len(head))
    for r in rows:
        if "skipped" in r:
            print(f"{r['precision']:11}  {r['model']:22} skipped: {r['skipped']}")
            continue
        t = (f"{r['torch_ms']:9.2f} {r['torch_img_s']:12.0f} {r['ratio']:10.2f}" if "torch_ms" in r
             else f"{'-':>9} {'-':>12} {'-':>10}")
        served = r["conv"]["served"]
        conv = ", ".join(f"{k} {v}" for k, v in served.items() if v) + (
            f" ({len(r['conv']['fallbacks'])} fallbacks)" if r["conv"]["fallbacks"] else "")
        if r.get("guard"):
            g = r["guard"]
            conv += f"; guard kept {g['kept']} ({g['tuned']:.1f} vs {g['heuristic']:.1f} ms)"
        print(f"{r['precision']:11}  {r['model']:22} {r['ours_ms']:9.2f} {r['ours_img_s']:11.0f} {t} "
              f"{r['ours_first_step_s']:12.1f}  {conv}")
    for r in rows:
        for who, prof in r.get("profile", {}).items():
            print(f"\nkernel profile, {r['precision']} {r['model']}, {who}: {prof['wall_ms']:.1f} ms wall, "
                  f"{prof['gpu_busy_ms']:.1f} ms GPU busy, {prof['launches']:.0f} launches a step")
            for k in prof["top"][:8]:
                print(f"  {k['ms']:8.2f} ms  x{k['per_step']:<5.0f} {k['kernel'][:90]}")


def run_rows(names, precisions, measure, limit, jsonl=None):
    """Every model in every precision (a model in all its precisions before the next: most useful first),
    `measure(name, precision) -> row`. A row starts only if the longest earlier row of its model (of any model
    before its first) fits in what is left of the limit; one that does not, or that fails, is a row with
    "skipped". Each row goes to `jsonl` as soon as it ends."""
    rows = []
    for name in names:
        for precision in precisions:
            kind = f"row {name}"
            if not limit.fits(kind, like="row "):
                rows.append({"model": name, "precision": precision, "skipped": "time limit (--max_seconds)"})
                limit.skip(f"{precision} {name}")
            else:
                t0 = time.perf_counter()
                try:
                    with limit.timing(kind):
                        rows.append(measure(name, precision))
                    rows[-1]["row_s"] = time.perf_counter() - t0
                except Exception as e:  # noqa: BLE001 - one failing configuration must not lose the others
                    rows.append({"model": name, "precision": precision,
                                 "skipped": "FAILED " + " ".join(f"{type(e).__name__}: {e}".split())[:400]})
            r = rows[-1]
            append_jsonl(jsonl, r)
            if "skipped" in r:
                print(f"# {precision} {name}: {r['skipped']}", file=sys.stderr, flush=True)
                continue
            print(f"# {precision} {name}: ours {r['ours_ms']:.2f} ms"
                  + (f", torch {r['torch_ms']:.2f} ms ({r['torch_model']})" if "torch_ms" in r else "")
                  + f", first step {r['ours_first_step_s']:.1f} s", file=sys.stderr, flush=True)
    return rows


def seed_row_estimates(limit, path):
    """The longest row of each model in an earlier run's JSON lines, as this run's estimates: a run that
    follows another within one time limit knows before its first row how long a row takes."""
    for line in open(path):
        row = json.loads(line)
        if "row_s" in row and "model" in row:
            kind = f"row {row['model']}"
            limit.longest[kind] = max(row["row_s"], limit.longest.get(kind, 0.0))


def append_jsonl(path, row):
    """One JSON line per row, flushed and fsynced at once."""
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated zoo names (default {DEFAULT_MODELS})")
    p.add_argument("--precision", default="tf32,fp32,fp32_strict",
                   help="comma-separated: tf32, fp32, fp32_strict (default all three)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--block", type=int, default=5, help="steps per timed block (one synchronization a block)")
    p.add_argument("--rounds", type=int, default=5, help="timed blocks per framework (median reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--conv", default=None, choices=["auto", "frontend", "legacy"],
                   help="cuDNN implementation of our convolutions (see pydtnn/backends/gpu/cudnn/; default: "
                        "$PYDTNN_GPU_CONV, else auto)")
    p.add_argument("--no_autotune", action="store_true", help="our convolutions: the heuristic's plans")
    p.add_argument("--profile", action="store_true", help="add a kernel profile of each framework's step")
    p.add_argument("--no_torch", action="store_true", help="time ours only")
    p.add_argument("--max_seconds", type=float, default=None,
                   help="end within this many seconds: a row, a timed round or a profile starts only if the longest "
                        "of its kind so far fits in what is left; what was not run is one 'STOPPED:' line at the end "
                        "(default: no limit)")
    p.add_argument("--estimates_from", default=None,
                   help="JSON lines of an earlier run (its --jsonl): their rows' durations are the first estimates "
                        "of --max_seconds")
    p.add_argument("--json", default=None, help="also write the rows as JSON here, at the end")
    p.add_argument("--jsonl", default=None,
                   help="append each row as one JSON line here as soon as it is measured (flushed: a timeout "
                        "loses only the configuration in progress)")
    args = p.parse_args(argv)
    use_torch = not args.no_torch
    if use_torch:
        try:
            import torch
            use_torch = torch.cuda.is_available()
        except ImportError:
            use_torch = False
        if not use_torch:
            print("PyTorch with CUDA is not available: timing ours only", file=sys.stderr)
    t_start = time.perf_counter()
    limit = TimeLimit(args.max_seconds)
    if args.estimates_from and os.path.exists(args.estimates_from):
        seed_row_estimates(limit, args.estimates_from)
    precisions = [s.strip() for s in args.precision.split(",") if s.strip()]
    names = [s.strip() for s in args.models.split(",") if s.strip()]

    def measure(name, precision):
        row = bench_one(name, precision, args, use_torch, limit)
        free_device_memory(use_torch)
        return row

    rows = run_rows(names, precisions, measure, limit, args.jsonl)
    print(f"\nbatch {args.batch}, median of {args.rounds} blocks of {args.block} steps after {args.warmup} warm-up, "
          f"convolutions: {args.conv or 'auto'}{'' if args.no_autotune else ' autotuned'}; "
          f"total {time.perf_counter() - t_start:.0f} s")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    if limit.stopped_line():
        print(limit.stopped_line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
