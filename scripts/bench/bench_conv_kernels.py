#!/usr/bin/env python
"""Time the CPU backend's convolution, pooling and batch-norm kernels on ResNet-20 / MNIST-CNN shapes.

If PyTorch is importable, the same operations are timed with torch (NCHW, its default layout) in the
same run and the ratio ours/torch is printed (< 1: we are faster).

    python scripts/bench/bench_conv_kernels.py [--threads 2] [--batch 64] [--repeat 15] [--dtype float32]

Times are the minimum over `--repeat` runs after warm-up (the median is printed too); ours and torch's
calls alternate, so both see the same machine conditions. On a shared machine the minimum is the most
stable estimate of what a kernel costs.
"""
from __future__ import annotations

import argparse
import time

import numpy as np  # noqa: E402

from pydtnn.backends import ConvSpec, PoolSpec  # noqa: E402
from pydtnn.backends.cpu.backend import CPUBackend  # noqa: E402


def timeit(fn, repeat, peer=None, block=5):
    """(min, median) ms of fn, and of peer when given. The two alternate in blocks of `block` calls, so
    that both see the same machine conditions (this matters on a shared machine), while each block
    starts with a call that absorbs the switch between thread pools (torch's OpenMP threads spin)."""
    fns = [fn] if peer is None else [fn, peer]
    ts = [[] for _ in fns]
    for _ in range(max(1, repeat // block)):
        for f, tl in zip(fns, ts):
            f()
            for _ in range(block):
                t0 = time.perf_counter()
                f()
                tl.append(time.perf_counter() - t0)
    res = [(min(tl) * 1e3, float(np.median(tl)) * 1e3) for tl in ts]
    return res if peer is not None else res[0]


def timeboth(ours, theirs, repeat):
    if theirs is None:
        return timeit(ours, repeat), None
    return tuple(timeit(ours, repeat, theirs))


def conv_cases(n):
    # (label, N, C, H, W, K, kernel, stride, padding, groups)
    return [
        ("r20 conv1 3->16 32x32", n, 3, 32, 32, 16, 3, 1, 1, 1),
        ("r20 s1 16->16 32x32", n, 16, 32, 32, 16, 3, 1, 1, 1),
        ("r20 s2 16->32 32x32", n, 16, 32, 32, 32, 3, 2, 1, 1),
        ("r20 1x1 s2 16->32", n, 16, 32, 32, 32, 1, 2, 0, 1),
        ("r20 s1 32->32 16x16", n, 32, 16, 16, 32, 3, 1, 1, 1),
        ("r20 s2 32->64 16x16", n, 32, 16, 16, 64, 3, 2, 1, 1),
        ("r20 s1 64->64 8x8", n, 64, 8, 8, 64, 3, 1, 1, 1),
        ("1x1 s1 64->256 8x8", n, 64, 8, 8, 256, 1, 1, 0, 1),
        ("mnist 1->32 28x28", n, 1, 28, 28, 32, 3, 1, 1, 1),
        ("mnist 32->64 14x14", n, 32, 14, 14, 64, 3, 1, 1, 1),
        ("alexnet 64->192 8x8", n, 64, 8, 8, 192, 3, 1, 1, 1),
        ("alexnet 384->256 4x4", n, 384, 4, 4, 256, 3, 1, 1, 1),
        ("depthwise 3x3 32ch 32x32", n, 32, 32, 32, 32, 3, 1, 1, 32),
    ]


def pool_cases(n):
    # (label, N, C, H, W, kind, pool, stride, padding)
    return [
        ("max 2x2/2 16ch 32x32", n, 16, 32, 32, "max", 2, 2, 0),
        ("max 3x3/2 p1 64ch 32x32", n, 64, 32, 32, "max", 3, 2, 1),
        ("avg 2x2/2 32ch 28x28", n, 32, 28, 28, "avg", 2, 2, 0),
        ("global avg 64ch 8x8", n, 64, 8, 8, "avg", 8, 8, 0),
        ("global max 64ch 8x8", n, 64, 8, 8, "max", 8, 8, 0),
    ]


def conv_ops(be, torch, rng, n, c, h, w, k, ks, s, p, g):
    """[(op, ours, theirs or None)] for one convolution shape."""
    spec = ConvSpec(c, k, (ks, ks), (s, s), (p, p), (1, 1), g)
    x = be.asarray(rng.standard_normal((n, h, w, c)))
    wt = be.asarray(rng.standard_normal((k, c // g, ks, ks)) * 0.1)
    y, ctx = be.conv2d_forward(x, wt, None, spec)
    dy = be.asarray(rng.standard_normal(y.shape))
    ours = [lambda: be.conv2d_forward(x, wt, None, spec),
            lambda: be.conv2d_backward_data(dy, wt, ctx, spec),
            lambda: be.conv2d_backward_weights(dy, ctx, spec, False)]
    theirs = [None] * 3
    if torch is not None:
        tx = torch.from_numpy(be.to_user(x).copy())
        tw = torch.from_numpy(wt.copy())
        tdy = torch.from_numpy(be.to_user(dy).copy())
        cb = torch.ops.aten.convolution_backward
        theirs = [lambda: torch.nn.functional.conv2d(tx, tw, None, s, p, 1, g),
                  lambda: cb(tdy, tx, tw, None, [s, s], [p, p], [1, 1], False, [0, 0], g, [True, False, False]),
                  lambda: cb(tdy, tx, tw, None, [s, s], [p, p], [1, 1], False, [0, 0], g, [False, True, False])]
    return list(zip(("fwd", "bwd-data", "bwd-w"), ours, theirs))


def pool_ops(be, torch, rng, n, c, h, w, kind, ks, s, p):
    spec = PoolSpec(kind, (ks, ks), (s, s), (p, p))
    x = be.asarray(rng.standard_normal((n, h, w, c)))
    y, ctx = be.pool2d_forward(x, spec)
    dy = be.asarray(rng.standard_normal(y.shape))
    ours = [lambda: be.pool2d_forward(x, spec), lambda: be.pool2d_backward(dy, ctx, spec)]
    theirs = [None, None]
    if torch is not None:
        F = torch.nn.functional
        tx = torch.from_numpy(be.to_user(x).copy()).requires_grad_(True)
        pool = F.max_pool2d if kind == "max" else F.avg_pool2d
        ty = pool(tx, ks, s, p)
        tdy = torch.from_numpy(be.to_user(dy).copy())
        theirs = [lambda: pool(tx, ks, s, p).detach(), lambda: torch.autograd.grad(ty, tx, tdy, retain_graph=True)]
    return list(zip(("fwd", "bwd"), ours, theirs))


def batchnorm_ops(be, torch, rng, n, c, h, w):
    x = be.asarray(rng.standard_normal((n, h, w, c)))
    gamma, beta = be.asarray(np.ones(c)), be.asarray(np.zeros(c))
    y, _, _, ctx = be.batchnorm_forward_train(x, gamma, beta, 1e-5)
    dy = be.asarray(rng.standard_normal(y.shape))
    ours = [lambda: be.batchnorm_forward_train(x, gamma, beta, 1e-5), lambda: be.batchnorm_backward(dy, ctx)]
    theirs = [None, None]
    if torch is not None:
        F = torch.nn.functional
        tx = torch.from_numpy(be.to_user(x).copy()).requires_grad_(True)
        tg = torch.ones(c, requires_grad=True)
        tb = torch.zeros(c, requires_grad=True)
        rm, rv = torch.zeros(c), torch.ones(c)
        ty = F.batch_norm(tx, rm, rv, tg, tb, True, 0.1, 1e-5)
        tdy = torch.from_numpy(be.to_user(dy).copy())
        theirs = [lambda: F.batch_norm(tx, rm, rv, tg, tb, True, 0.1, 1e-5).detach(),
                  lambda: torch.autograd.grad(ty, (tx, tg, tb), tdy, retain_graph=True)]
    return list(zip(("train-fwd", "bwd"), ours, theirs))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--only", default="", help="run only the cases whose label contains this text")
    ap.add_argument("--fold", choices=("yes", "auto"), default="auto",
                    help="convolution packing: always im2col blocks (yes) or the backend's choice (auto)")
    args = ap.parse_args(argv)

    from threadpoolctl import threadpool_limits
    threadpool_limits(args.threads)
    try:
        if args.no_torch:
            raise ImportError
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None

    be = CPUBackend(args.dtype)
    be.num_threads = args.threads
    be._force_fold = args.fold == "yes"
    rng = np.random.default_rng(0)
    tot = {"ours": 0.0, "torch": 0.0}

    print(f"threads={args.threads} batch={args.batch} dtype={args.dtype} "
          f"torch={torch.__version__ if torch else 'not available'}")
    print(f"{'case':28s} {'op':9s} {'ours min':>8} {'med':>8} {'torch min':>8} {'med':>8} {'ratio':>6}")
    bn_shapes = ((16, 32, 32), (64, 8, 8))
    cases = ([(c[0], conv_ops, c[1:]) for c in conv_cases(args.batch)]
             + [(c[0], pool_ops, c[1:]) for c in pool_cases(args.batch)]
             + [(f"batchnorm {c}ch {h}x{w}", batchnorm_ops, (args.batch, c, h, w)) for c, h, w in bn_shapes])
    for label, make, params in cases:
        if args.only not in label:
            continue
        for op, ours_fn, theirs_fn in make(be, torch, rng, *params):
            ours, theirs = timeboth(ours_fn, theirs_fn, args.repeat)
            ratio = f"{ours[0] / theirs[0]:6.2f}" if theirs else "     -"
            th = f"{theirs[0]:8.3f} {theirs[1]:8.3f}" if theirs else f"{'-':>8} {'-':>8}"
            print(f"{label:28s} {op:9s} {ours[0]:8.3f} {ours[1]:8.3f} {th} {ratio}")
            if theirs:
                tot["ours"] += ours[0]
                tot["torch"] += theirs[0]

    if torch is not None and tot["torch"] > 0:
        print(f"{'sum of min times (ms)':28s} {'':9s} {tot['ours']:8.2f} {'':8s} {tot['torch']:8.2f} {'':8s} "
              f"{tot['ours'] / tot['torch']:6.2f}")


if __name__ == "__main__":
    main()
