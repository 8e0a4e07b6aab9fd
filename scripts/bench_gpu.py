#!/usr/bin/env python
"""Training-step time of PyDTNN's GPU backend against PyTorch, same models, batch and precision, one GPU.

    python scripts/bench_gpu.py                                   # resnet50_imagenet, vgg16_imagenet, simplecnn
    python scripts/bench_gpu.py --precision fp32 --models simplecnn --steps 20
    python scripts/bench_gpu.py --conv legacy --autotune          # the cuDNN legacy API, measured algorithms

One step, ours:    model.compute_gradients(x, y_onehot, "categorical_cross_entropy")
                   + SGD.step(model.params, model.grads) + backend.synchronize()
One step, PyTorch: zero_grad + forward + CrossEntropyLoss + backward + SGD.step + torch.cuda.synchronize()
(SGD with momentum 0.9 in both; ours also brings the loss value to the host every step, as its training
loop needs it, which PyTorch's step here does not.)

Inputs live on the device (no host transfer in the timed step). Precision "fp32": TF32 off everywhere
(torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False; our backend's strict
precision); "tf32": both allowed. torch.backends.cudnn.benchmark = True. After warm-up steps (which for
us include building the cuDNN graphs, reported as "first step"), the timed steps alternate between the
two frameworks and the median is reported; the ratio is ours / PyTorch in images per second (> 1: ours
is faster).

PyTorch models: torchvision's resnet50 (its strides moved to the first 1x1 convolution of each bottleneck
for resnet50_imagenet, which is ResNet v1 like ours) and vgg16 when torchvision is importable, else
hand-written equivalents; simplecnn as nn.Sequential(Conv 1->4 3x3 pad 1, ReLU, MaxPool 2, Flatten,
Linear 784->128, ReLU, Linear 128->10).

Meant to finish well under 3 minutes on an H200 (--max_seconds stops starting new configurations).
NOT RUN ON HARDWARE when written (no GPU where it was written).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np  # noqa: E402

DEFAULT_MODELS = "resnet50_imagenet,vgg16_imagenet,simplecnn"


# ----------------------------------------------------------------------------------------------- ours

def ours_setup(name, batch, precision, args):
    from pydtnn import Model
    from pydtnn.backends.gpu.backend import GPUBackend
    from pydtnn.models import build_model
    from pydtnn.optimizers import SGD
    be = GPUBackend(dtype="float32", seed=0, precision=precision, auto_conv_alg=args.autotune, conv_impl=args.conv)
    model = Model(backend=be, seed=0)
    build_model(name, model)
    nclasses, shape = model.output_shape[0], tuple(model.input_shape)
    rng = np.random.default_rng(0)
    x = be.asarray(rng.standard_normal((batch,) + shape).astype(np.float32))
    y = be.asarray(np.eye(nclasses, dtype=np.float32)[rng.integers(0, nclasses, batch)])
    opt = SGD(learning_rate=0.01, momentum=0.9)

    def step():
        model.compute_gradients(x, y, "categorical_cross_entropy")
        opt.step(model.params, model.grads)
        be.synchronize()

    return step, be, shape, nclasses


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
        torch.cuda.synchronize(dev)

    return step, what


# ------------------------------------------------------------------------------------------ the runs

def timed(step):
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def bench_one(name, precision, args, use_torch):
    import cupy
    row = {"model": name, "precision": precision, "batch": args.batch}
    t0 = time.perf_counter()
    ours, be, shape, nclasses = ours_setup(name, args.batch, precision, args)
    row["ours_first_step_s"] = timed(ours)                        # includes building the cuDNN graphs
    row["ours_setup_s"] = time.perf_counter() - t0
    steps = {"ours": ours}
    if use_torch:
        theirs, row["torch_model"] = torch_setup(name, args.batch, shape, nclasses, precision, be.device)
        steps["torch"] = theirs
    for _ in range(args.warmup):
        for s in steps.values():
            s()
    times = {k: [] for k in steps}
    order = list(steps)
    for i in range(args.steps):                                  # alternate, and alternate who goes first
        for k in (order if i % 2 == 0 else order[::-1]):
            times[k].append(timed(steps[k]))
    for k, ts in times.items():
        med = statistics.median(ts)
        row[f"{k}_ms"] = 1e3 * med
        row[f"{k}_img_s"] = args.batch / med
    if use_torch:
        row["ratio"] = row["ours_img_s"] / row["torch_img_s"]
    row["conv"] = be.conv_report()
    del ours, steps, be
    cupy.get_default_memory_pool().free_all_blocks()
    if use_torch:
        import torch
        torch.cuda.empty_cache()
    return row


def print_table(rows):
    head = f"{'precision':9}  {'model':22} {'ours ms':>9} {'ours img/s':>11} {'torch ms':>9} {'torch img/s':>12} " \
           f"{'ours/torch':>10} {'first step s':>12}  convolutions"
    print(head)
    print("-" * len(head))
    for r in rows:
        if "skipped" in r:
            print(f"{r['precision']:9}  {r['model']:22} skipped: {r['skipped']}")
            continue
        t = (f"{r['torch_ms']:9.2f} {r['torch_img_s']:12.0f} {r['ratio']:10.2f}" if "torch_ms" in r
             else f"{'-':>9} {'-':>12} {'-':>10}")
        served = r["conv"]["served"]
        conv = ", ".join(f"{k} {v}" for k, v in served.items() if v) + (
            f" ({len(r['conv']['fallbacks'])} fallbacks)" if r["conv"]["fallbacks"] else "")
        print(f"{r['precision']:9}  {r['model']:22} {r['ours_ms']:9.2f} {r['ours_img_s']:11.0f} {t} "
              f"{r['ours_first_step_s']:12.1f}  {conv}")


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
    p.add_argument("--precision", default="fp32,tf32", help="fp32, tf32 or both (default fp32,tf32)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=10, help="timed steps per framework (median reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--conv", default=None, choices=["auto", "frontend", "legacy"],
                   help="cuDNN implementation of our convolutions (see pydtnn/backends/gpu/cudnn.py; default: "
                        "$PYDTNN_GPU_CONV, else auto)")
    p.add_argument("--autotune", action="store_true", help="our convolutions: measure plans/algorithms")
    p.add_argument("--no_torch", action="store_true", help="time ours only")
    p.add_argument("--max_seconds", type=float, default=150.0, help="start no new configuration after this")
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
    rows = []
    precisions = [s.strip() for s in args.precision.split(",") if s.strip()]
    names = [s.strip() for s in args.models.split(",") if s.strip()]
    for name in names:                 # a model in every precision before the next model (most useful first)
        for precision in precisions:
            if time.perf_counter() - t_start > args.max_seconds:
                rows.append({"model": name, "precision": precision, "skipped": "time budget (--max_seconds)"})
                append_jsonl(args.jsonl, rows[-1])
                continue
            try:
                rows.append(bench_one(name, precision, args, use_torch))
            except Exception as e:  # noqa: BLE001 - one failing configuration must not lose the others
                rows.append({"model": name, "precision": precision,
                             "skipped": "FAILED " + " ".join(f"{type(e).__name__}: {e}".split())[:400]})
            r = rows[-1]
            append_jsonl(args.jsonl, r)
            if "skipped" in r:
                print(f"# {precision} {name}: {r['skipped']}", file=sys.stderr, flush=True)
                continue
            print(f"# {precision} {name}: ours {r['ours_ms']:.2f} ms"
                  + (f", torch {r['torch_ms']:.2f} ms ({r['torch_model']})" if use_torch else "")
                  + f", first step {r['ours_first_step_s']:.1f} s", file=sys.stderr, flush=True)
    print(f"\nbatch {args.batch}, median of {args.steps} steps after {args.warmup} warm-up, "
          f"convolutions: {args.conv}{' autotuned' if args.autotune else ''}; "
          f"total {time.perf_counter() - t_start:.0f} s")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
