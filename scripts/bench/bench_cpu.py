#!/usr/bin/env python
"""CPU training speed: PyDTNN against PyTorch CPU on the same model, batch, dtype and thread count.

    pip install torch==2.13.0            # the benchmark's peer; not a dependency of PyDTNN
    python scripts/bench/bench_cpu.py                          # the table of docs/performance.md
    python scripts/bench/bench_cpu.py --models resnet20_cifar10 --threads 2 --breakdown
    python scripts/bench/bench_cpu.py --conv_algorithms direct,winograd,auto --ddp    # + the 2-rank row
    python scripts/bench/bench_cpu.py --models vit_tiny_mnist --breakdown      # a Vision Transformer step
    python scripts/bench/bench_cpu.py --models vgg11_cifar10 --user_loop       # the loop a user writes
    python scripts/bench/bench_cpu.py --models vgg11_cifar10 --gains           # each one's 1 -> 2 thread gain
    python scripts/bench/bench_cpu.py --models vgg11_cifar10 --optimizer adam  # Adam instead of SGD, both

The PyTorch network is MIRRORED from the PyDTNN model layer by layer (same convolutions, pools, blocks,
normalizations, attention, initial weights), and the first step's loss of both is checked to agree, so
both frameworks time the very same computation. A step is forward + loss + backward + the optimizer's
update (SGD with momentum; `--optimizer adam` or `adamw`: PyTorch's defaults on both sides), float32.
The two frameworks alternate in rounds, each block after one untimed step (`timed_block`), and the median
step time of each is reported, with the ratio PyDTNN / PyTorch, and the spread of the per-round ratios
(min-max). `conv_algorithm` is the CPU backend's option (PyTorch keeps its
defaults).

`--ddp`: the data-parallel step, 2 ranks x 1 thread, `--batch` samples per rank, ResNet-20 (or
`--ddp_model`): PyDTNN through its launcher (`mpiexec -n 2 scripts/pydtnn_benchmark.py --parallel data`;
step time = epoch time / steps, first epoch dropped) against PyTorch DDP (gloo) on the mirrored net with the
same weights (`mpiexec -n 2` of this script as a DDP worker; mean step time over the same number of steps,
first block dropped), alternated in rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict

import numpy as np  # noqa: E402


def mirror(model):
    """A torch.nn.Module computing what the PyDTNN model computes (logits: the final Softmax is left to the
    loss, as PyDTNN fuses it), with the same initial weights."""
    import torch
    from torch import nn
    from pydtnn import activations as A
    from pydtnn import layers as L

    class Sum(nn.Module):
        def __init__(self, paths):
            super().__init__()
            self.paths = nn.ModuleList(paths)

        def forward(self, x):
            out = None
            for p in self.paths:
                y = p(x)
                out = y if out is None else out + y
            return out

    class Cat(Sum):
        def forward(self, x):
            return torch.cat([p(x) for p in self.paths], dim=1)

    class AddPositions(nn.Module):                 # PositionEmbedding
        def __init__(self, weights):
            super().__init__()
            self.weights = nn.Parameter(weights)

        def forward(self, x):
            return x + self.weights

    class Tokens(nn.Module):                       # ImageToSequence: (N, C, H, W) -> (N, H W, C)
        def forward(self, x):
            return x.flatten(2).transpose(1, 2)

    class SelfAttention(nn.MultiheadAttention):    # MultiHeadAttention: q = k = v, the causal mask if asked
        def __init__(self, layer):
            super().__init__(layer.embed_dim, layer.num_heads, dropout=layer.dropout, batch_first=True)
            self.causal = layer.causal

        def forward(self, x):
            t = x.shape[1]
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1) if self.causal else None
            return super().forward(x, x, x, attn_mask=mask, need_weights=False)[0]

    def convert(layer):
        t = lambda a: torch.from_numpy(np.ascontiguousarray(model.backend.to_numpy(a)))
        if isinstance(layer, L.Input):
            return nn.Identity()
        if isinstance(layer, L.Conv2D):
            s = layer.spec
            m = nn.Conv2d(s.in_channels, s.out_channels, s.kernel, s.stride, s.padding, s.dilation, s.groups,
                          bias=layer.use_bias)
            with torch.no_grad():
                m.weight.copy_(t(layer.weights))
                if layer.use_bias:
                    m.bias.copy_(t(layer.biases))
            return m
        if isinstance(layer, L.FC):
            m = nn.Linear(layer.in_shape[-1], layer.out_features, bias=layer.use_bias)
            with torch.no_grad():
                m.weight.copy_(t(layer.weights).T)
                if layer.use_bias:
                    m.bias.copy_(t(layer.biases))
            return m
        if isinstance(layer, (L.MaxPool2D, L.AveragePool2D)):
            s = layer.spec
            if isinstance(layer, L.MaxPool2D):
                return nn.MaxPool2d(s.pool, s.stride, s.padding)
            return nn.AvgPool2d(s.pool, s.stride, s.padding, count_include_pad=True)
        if isinstance(layer, L.BatchNormalization):
            cls = nn.BatchNorm2d if len(layer.in_shape) == 3 else nn.BatchNorm1d
            m = cls(layer.in_shape[0], eps=layer.epsilon, momentum=1 - layer.momentum)
            with torch.no_grad():
                m.weight.copy_(t(layer.gamma))
                m.bias.copy_(t(layer.beta))
            return m
        if isinstance(layer, (L.LayerNorm, L.GroupNorm)):
            if isinstance(layer, L.GroupNorm):
                m = nn.GroupNorm(layer.groups, layer.in_shape[0], eps=layer.epsilon)
            elif len(layer.in_shape) == 3:
                m = nn.GroupNorm(1, layer.in_shape[0], eps=layer.epsilon)
            else:
                m = nn.LayerNorm(layer.in_shape[-1], eps=layer.epsilon)
            with torch.no_grad():
                m.weight.copy_(t(layer.gamma))
                m.bias.copy_(t(layer.beta))
            return m
        if isinstance(layer, L.MultiHeadAttention):
            m = SelfAttention(layer)
            with torch.no_grad():
                m.in_proj_weight.copy_(t(layer.in_proj_weight))
                m.in_proj_bias.copy_(t(layer.in_proj_bias))
                m.out_proj.weight.copy_(t(layer.out_proj_weight))
                m.out_proj.bias.copy_(t(layer.out_proj_bias))
            return m
        if isinstance(layer, L.Embedding):
            m = nn.Embedding(layer.num_embeddings, layer.embedding_dim)
            with torch.no_grad():
                m.weight.copy_(t(layer.weights))
            return m
        if isinstance(layer, L.PositionEmbedding):
            return AddPositions(t(layer.weights))
        if isinstance(layer, L.ImageToSequence):
            return Tokens()
        if isinstance(layer, L.ConvTranspose2D):
            s = layer.spec
            m = nn.ConvTranspose2d(layer.in_shape[0], layer.nfilters, s.kernel, s.stride, s.padding,
                                   layer.output_padding, bias=layer.use_bias)
            with torch.no_grad():
                m.weight.copy_(t(layer.weights))
                if layer.use_bias:
                    m.bias.copy_(t(layer.biases))
            return m
        if isinstance(layer, L.Upsample2D):
            extra = {"align_corners": False} if layer.mode == "bilinear" else {}
            return nn.Upsample(scale_factor=layer.scale, mode=layer.mode, **extra)
        if isinstance(layer, A.GELU):
            return nn.GELU(approximate=layer.approximate)
        if isinstance(layer, A.SiLU):
            return nn.SiLU()
        if isinstance(layer, L.Dropout):
            return nn.Dropout(layer.rate)
        if isinstance(layer, L.Flatten):
            return nn.Flatten()
        if isinstance(layer, A.Softmax):
            return nn.Identity()                      # fused into the loss, like PyDTNN's
        if isinstance(layer, A.Relu):
            return nn.ReLU()
        if isinstance(layer, A.LeakyRelu):
            return nn.LeakyReLU(layer.negative_slope)
        if isinstance(layer, A.Sigmoid):
            return nn.Sigmoid()
        if isinstance(layer, A.Tanh):
            return nn.Tanh()
        if isinstance(layer, (L.AdditionBlock, L.ConcatenationBlock)):
            paths = [nn.Sequential(*[convert(l) for l in p]) if p else nn.Identity() for p in layer.paths]
            return Sum(paths) if isinstance(layer, L.AdditionBlock) else Cat(paths)
        raise TypeError(f"no PyTorch mirror for {layer.type_name}")

    return nn.Sequential(*[convert(l) for l in model.layers])


def build(name, batch, seed=0, conv_algorithm="auto"):
    from pydtnn import Model
    from pydtnn.backends import get_backend
    from pydtnn.models import build_model, default_input_shape
    model = Model(backend=get_backend("cpu", "float32", seed, conv_algorithm=conv_algorithm), seed=seed)
    build_model(name, model)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch,) + tuple(default_input_shape(name))).astype(np.float32)
    labels = rng.integers(0, model.output_shape[0], batch)
    return model, x, labels


# The step clock: wall time, or with --clock thread the calling thread's CPU time (1 thread only: both
# frameworks then run every kernel on the calling thread, and time taken by other processes of a loaded
# machine does not count)
CLOCK = [time.perf_counter]


def step_gflop(model, batch):
    """GFLOP of a training step by direct convolution: 3x the forward's multiply-adds x 2 of the convolutions,
    FC layers and attention products (forward, backward data, backward weights; the first layer's data
    gradient counted too). Element-wise work is left out."""
    from pydtnn import layers as L
    fwd = 0
    for layer in model.all_layers():
        if isinstance(layer, L.Conv2D):
            s, (k, ho, wo) = layer.spec, layer.shape
            fwd += ho * wo * k * (s.in_channels // s.groups) * s.kernel[0] * s.kernel[1]
        elif isinstance(layer, L.FC):
            rows = int(np.prod(layer.in_shape[:-1])) if len(layer.in_shape) > 1 else 1
            fwd += rows * layer.in_shape[-1] * layer.out_features
        elif isinstance(layer, L.MultiHeadAttention):
            t, d = layer.in_shape
            fwd += 4 * t * d * d + 2 * t * t * d
    return 3 * 2 * batch * fwd / 1e9


class Breakdown:
    """Wraps every leaf layer's forward/backward to accumulate time per layer type."""

    def __init__(self, model):
        self.times = defaultdict(float)
        for layer in model.all_layers():
            if not layer.sublayers() and not hasattr(layer, "paths"):
                self._wrap(layer, "forward")
                self._wrap(layer, "backward")

    def _wrap(self, layer, method):
        inner = getattr(layer, method)
        key = (layer.type_name, method)

        def timed(*args, **kw):
            t0 = CLOCK[0]()
            out = inner(*args, **kw)
            self.times[key] += CLOCK[0]() - t0
            return out
        setattr(layer, method, timed)


def timed_block(fn, steps):
    """The times of `steps` calls of fn, after one untimed call (for both frameworks alike). After its last
    step, PyTorch's OpenMP threads keep spinning for several milliseconds, and PyDTNN's pool workers for
    PYDTNN_CPU_SPIN_US (3 ms): at 2 threads on 2 cores the other framework's next step runs with a core
    taken. Measured (simplecnn, batch 64, 2 threads, Zen 3 VM): PyDTNN's first step right after three
    PyTorch steps took 13.3 ms, its second 4.4 ms; 20 ms later its first took 5.6 ms (its own workers
    waking). A training run is one framework's steps back to back, so the block times that steady state."""
    fn()
    times = []
    for _ in range(steps):
        t0 = CLOCK[0]()
        fn()
        times.append(CLOCK[0]() - t0)
    return times


OPTIMIZER = ["sgd"]             # --optimizer: the update both frameworks run after each backward


def optimizers():
    """(PyDTNN's optimizer, PyTorch's for the given parameters), the same update with the same
    hyper-parameters: SGD lr 0.01 momentum 0.9, or PyTorch's Adam / AdamW defaults (lr 1e-3, betas
    0.9 / 0.999, eps 1e-8; AdamW weight decay 0.01)."""
    import torch
    from pydtnn import optimizers as ours
    name = OPTIMIZER[0]
    if name == "sgd":
        return ours.SGD(learning_rate=0.01, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)
    if name == "adam":
        return ours.Adam(learning_rate=1e-3, beta1=0.9, epsilon=1e-8), lambda p: torch.optim.Adam(p, lr=1e-3)
    return (ours.AdamW(learning_rate=1e-3, beta1=0.9, epsilon=1e-8, decay=0.01),
            lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01))


def torch_step(net, x, labels, make_optimizer):
    """PyTorch's own training step on the mirrored network (the optimizer from `optimizers`); returns the loss."""
    import torch
    optimizer = make_optimizer(net.parameters())
    tx, ty = torch.from_numpy(x), torch.from_numpy(labels)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        optimizer.zero_grad(set_to_none=True)
        value = loss_fn(net(tx), ty)
        value.backward()
        optimizer.step()
        return value.item()
    return step


def zoo_steps(name, batch, conv_algorithm="auto"):
    """The zoo step of both frameworks on the model and its mirror: (ours, theirs, model, net, x)."""
    from pydtnn.targets import one_hot

    model, x, labels = build(name, batch, conv_algorithm=conv_algorithm)
    net = mirror(model)
    net.train()
    y = one_hot(labels, model.output_shape[0], np.float32)
    opt, make_theirs = optimizers()

    def ours():
        value, _ = model.compute_gradients(x, y, "categorical_cross_entropy")
        opt.step(model.params, model.grads)
        return value
    return ours, torch_step(net, x, labels, make_theirs), model, net, x


def bench_row(name, batch, threads, rounds, steps, breakdown=False, conv_algorithm="auto"):
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    ours, theirs, model, net, x = zoo_steps(name, batch, conv_algorithm)

    with threadpool_limits(threads):
        # the mirror computes the same function: compare inference outputs (no dropout) before training
        net.eval()
        with torch.no_grad():
            p_theirs = torch.softmax(net(torch.from_numpy(x)), dim=1).numpy()
        net.train()
        p_ours = model.forward(x, training=False)
        same = bool(np.allclose(p_ours, p_theirs, atol=1e-4))
        first_ours, first_theirs = ours(), theirs()      # warm-up
        t_ours, t_theirs, ratios = [], [], []
        for _ in range(rounds):
            for fn, acc in ((ours, t_ours), (theirs, t_theirs)):
                acc.extend(timed_block(fn, steps))
            ratios.append(statistics.median(t_ours[-steps:]) / statistics.median(t_theirs[-steps:]))
        table = None
        if breakdown:
            bd = Breakdown(model)
            t0 = CLOCK[0]()
            for _ in range(steps):
                ours()
            total = (CLOCK[0]() - t0) / steps
            table = (bd.times, total, steps)
    return {"model": name, "threads": threads, "batch": batch, "conv_algorithm": conv_algorithm,
            "ours_ms": 1e3 * statistics.median(t_ours), "torch_ms": 1e3 * statistics.median(t_theirs),
            "ratios": ratios, "same_loss": same, "loss": (first_ours, first_theirs), "breakdown": table}


def user_steps(name, batch):
    """The loop a user writes, both frameworks: (ours, theirs)."""
    from pydtnn import Model
    from pydtnn.losses import CategoricalCrossEntropy
    from pydtnn.models import build_model, default_input_shape

    model = Model("cpu", "float32", seed=0)
    build_model(name, model)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + tuple(default_input_shape(name))).astype(np.float32)
    labels = rng.integers(0, model.output_shape[0], batch)
    y = np.eye(model.output_shape[0], dtype=np.float32)[labels]
    net = mirror(model)
    net.train()
    loss, (opt, make_theirs) = CategoricalCrossEntropy(), optimizers()
    theirs = torch_step(net, x, labels, make_theirs)

    def ours():
        out = model.forward(x, training=True)
        value, dy = loss(out, y)
        model.backward(dy)
        opt.step(model.params, model.grads)
        return value
    return ours, theirs


def user_loop_row(name, batch, threads, rounds, steps):
    """The loop a user writes: the public API only (`Model`, `build_model`, `forward`, a loss, `backward`,
    an optimizer's `step`), no launcher, threads limited the ordinary way (threadpoolctl for PyDTNN's
    BLAS, `torch.set_num_threads` for PyTorch); blocks of `steps` steps alternated with PyTorch's own
    training loop on the mirrored network."""
    import torch
    from threadpoolctl import threadpool_limits

    ours, theirs = user_steps(name, batch)

    with threadpool_limits(threads):
        torch.set_num_threads(threads)
        ours(), theirs()                                   # warm-up (compilation, first allocations)
        t_ours, t_theirs, ratios = [], [], []
        for _ in range(rounds):
            for fn, acc in ((ours, t_ours), (theirs, t_theirs)):
                acc.append(sum(timed_block(fn, steps)) / steps)
            ratios.append(t_ours[-1] / t_theirs[-1])
    return {"model": name + " (user loop)", "threads": threads, "batch": batch, "conv_algorithm": "auto",
            "ours_ms": 1e3 * statistics.median(t_ours), "torch_ms": 1e3 * statistics.median(t_theirs),
            "ratios": ratios}


def gain_row(name, batch, threads, rounds, steps, user_loop=False):
    """The speed-up each framework gets from more threads, measured so that noise cancels: in every round,
    each thread count of `threads` in turn runs a block of `steps` steps of PyDTNN and then of PyTorch
    (threadpoolctl for PyDTNN's pool and BLAS, `torch.set_num_threads` for PyTorch), so the round's gain
    t(threads[0]) / t(threads[-1]) of both frameworks comes from times taken seconds apart. The default mode
    times one thread count after the other, minutes apart; on a shared VM the 2-thread gain of one VGG-11
    convolution pass read 1.22x in one run and 1.76x in the next (docs/performance.md, seventh pass)."""
    import torch
    from threadpoolctl import threadpool_limits

    ours, theirs = user_steps(name, batch) if user_loop else zoo_steps(name, batch)[:2]
    t = {(fw, nt): [] for fw in ("ours", "theirs") for nt in threads}
    for r in range(rounds + 1):                 # round 0 warms both at every thread count, untimed
        for nt in threads:
            with threadpool_limits(nt):
                torch.set_num_threads(nt)
                for fw, fn in (("ours", ours), ("theirs", theirs)):
                    block = timed_block(fn, steps)
                    if r:
                        t[fw, nt].append(sum(block) / steps)
    lo, hi = threads[0], threads[-1]
    gains = {fw: [a / b for a, b in zip(t[fw, lo], t[fw, hi])] for fw in ("ours", "theirs")}
    return {"model": name + (" (user loop)" if user_loop else ""), "threads": threads, "times": t,
            "gains": gains, "relative": [a / b for a, b in zip(gains["ours"], gains["theirs"])]}


def print_gains(rows):
    """The gains table. Its last column is the time each framework's step at `hi` threads takes beyond a
    perfect split of its `lo`-thread step: a framework with faster compute gains less from the same
    non-scaling passes (memory-bound ones, on a machine whose bandwidth does not grow with the cores), so
    a lower gain can come with fewer milliseconds lost."""
    lo, hi = rows[0]["threads"][0], rows[0]["threads"][-1]
    print(f"\n| model | PyDTNN ms/step {lo} / {hi} threads | gain | PyTorch ms/step {lo} / {hi} threads | gain | "
          f"gain PyDTNN / PyTorch (rounds' median, min-max) | ms beyond t({lo}) x {lo}/{hi}, PyDTNN / PyTorch |"
          "\n|---|---:|---:|---:|---:|---:|---:|")
    med = statistics.median
    for r in rows:
        t, g, rel = r["times"], r["gains"], r["relative"]
        (a1, a2), (b1, b2) = ((1e3 * med(t[fw, lo]), 1e3 * med(t[fw, hi])) for fw in ("ours", "theirs"))
        print(f"| {r['model']} | {a1:.1f} / {a2:.1f} | {med(g['ours']):.2f} | {b1:.1f} / {b2:.1f} | "
              f"{med(g['theirs']):.2f} | {med(rel):.2f} ({min(rel):.2f}-{max(rel):.2f}) | "
              f"{a2 - a1 * lo / hi:.1f} / {b2 - b1 * lo / hi:.1f} |")


# --- the data-parallel row: PyDTNN's launcher against PyTorch DDP (gloo), 2 ranks x 1 thread -------------

def ddp_worker(a):
    """One rank of PyTorch DDP (gloo) on the mirror of the PyDTNN model; rank 0 prints one JSON line with
    the mean step time of each block of `--steps` steps."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    size = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.ddp_port}", rank=rank, world_size=size)
    model, x, labels = build(a.ddp_model, a.batch, seed=rank)
    net = DDP(mirror(model))                       # DDP broadcasts rank 0's weights: the same start everywhere
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    lossf = torch.nn.CrossEntropyLoss()
    tx, ty = torch.from_numpy(x), torch.from_numpy(labels)
    blocks = []
    for _ in range(a.ddp_epochs):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            opt.zero_grad(set_to_none=True)
            lossf(net(tx), ty).backward()
            opt.step()
        blocks.append((time.perf_counter() - t0) / a.steps)
    if rank == 0:
        print(json.dumps({"step_s": blocks}), flush=True)
    dist.destroy_process_group()


def _run(cmd, env):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"bench_cpu.py: {' '.join(cmd[:6])} ... failed:\n{r.stderr[-3000:]}")
    return r.stdout


def ddp_row(a, conv_algorithm):
    """(ours ms, DDP ms, per-round ratios): median step time of each over rounds, alternated."""
    from pydtnn.models import default_input_shape  # noqa: F401  (the launcher builds the same model)
    from pydtnn.parallel.runtime.mpirun import find_mpiexec
    mpiexec = find_mpiexec()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    scripts = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours_cmd = [mpiexec, "-n", "2", sys.executable, os.path.join(scripts, "pydtnn_benchmark.py"),
                "--model", a.ddp_model, "--parallel", "data", "--batch_size", str(a.batch),
                "--threads_per_replica", "1", "--steps_per_epoch", str(a.steps), "--num_epochs", str(a.ddp_epochs),
                "--synthetic_samples", str(2 * a.batch * a.steps), "--progress_bar", "false", "--lr_schedulers", "",
                "--learning_rate_scaling", "false", "--conv_algorithm", conv_algorithm]
    theirs_cmd = [mpiexec, "-n", "2", sys.executable, os.path.abspath(__file__), "--ddp-worker",
                  "--ddp_model", a.ddp_model, "--batch", str(a.batch), "--steps", str(a.steps),
                  "--ddp_epochs", str(a.ddp_epochs), "--ddp_port", str(a.ddp_port)]
    ours, theirs, ratios = [], [], []
    for _ in range(a.ddp_rounds):
        out = _run(ours_cmd, env)
        epochs = [float(t) for t in re.findall(r"^epoch \d+: .*?([0-9.]+) s$", out, re.M)]
        if len(epochs) != a.ddp_epochs:
            sys.exit(f"bench_cpu.py: could not read the launcher's epoch times from:\n{out[-2000:]}")
        o = statistics.median(epochs[1:]) / a.steps
        line = [l for l in _run(theirs_cmd, env).splitlines() if l.startswith("{")][-1]
        t = statistics.median(json.loads(line)["step_s"][1:])
        ours.append(o)
        theirs.append(t)
        ratios.append(o / t)
    return 1e3 * statistics.median(ours), 1e3 * statistics.median(theirs), ratios


def print_breakdown(row):
    times, total, steps = row["breakdown"]
    print(f"\nper-layer breakdown, {row['model']}, {row['threads']} thread(s): ms per step "
          f"(total {1e3 * total:.1f} ms)")
    types = sorted({t for t, _ in times}, key=lambda t: -(times[(t, 'forward')] + times[(t, 'backward')]))
    print(f"{'layer type':<22}{'forward':>10}{'backward':>10}{'share':>8}")
    accounted = 0.0
    for t in types:
        f, b = times[(t, "forward")] / steps, times[(t, "backward")] / steps
        accounted += f + b
        print(f"{t:<22}{1e3 * f:>10.2f}{1e3 * b:>10.2f}{100 * (f + b) / total:>7.1f}%")
    print(f"{'other (loss, blocks, update)':<22}{1e3 * (total - accounted):>20.2f}"
          f"{100 * (total - accounted) / total:>7.1f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="simplecnn,resnet20_cifar10,alexnet_cifar10")
    ap.add_argument("--threads", default="1,2", help="comma list of thread counts")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5, help="alternations of the two frameworks")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per framework per round")
    ap.add_argument("--breakdown", action="store_true", help="per-layer-type forward/backward times of PyDTNN")
    ap.add_argument("--conv_algorithms", default="auto", help="comma list of the CPU backend's conv_algorithm "
                                                                 "(direct, winograd, auto): a row each")
    ap.add_argument("--ddp", action="store_true", help="add the 2-rank data-parallel row against PyTorch DDP")
    ap.add_argument("--ddp_model", default="resnet20_cifar10")
    ap.add_argument("--ddp_rounds", type=int, default=3, help="alternations of the two 2-rank jobs")
    ap.add_argument("--ddp_epochs", type=int, default=3, help="blocks of --steps steps per job (the first is dropped)")
    ap.add_argument("--ddp_port", type=int, default=29517)
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--skip_single", action="store_true", help="only the --ddp row")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="wall time, or the calling thread's CPU time (1 thread only; robust to a loaded machine)")
    ap.add_argument("--flops", action="store_true", help="only print each model's step GFLOP by direct convolution")
    ap.add_argument("--gains", action="store_true",
                    help="the speed-up from the first to the last of --threads, both frameworks, the thread "
                         "counts alternated within every round (with --user_loop: of the user loop)")
    ap.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default="sgd",
                    help="the update both frameworks run (SGD momentum 0.9, or PyTorch's Adam / AdamW defaults)")
    ap.add_argument("--user_loop", action="store_true",
                    help="time the loop a user writes (public API, no launcher, threadpoolctl) instead of the "
                         "zoo step (compute_gradients)")
    a = ap.parse_args()
    if a.ddp_worker:
        return ddp_worker(a)
    OPTIMIZER[0] = a.optimizer
    if a.clock == "thread":
        if a.threads != "1":
            sys.exit("bench_cpu.py: --clock thread measures the calling thread only: use it with --threads 1")
        CLOCK[0] = time.thread_time
    if a.flops:
        for name in a.models.split(","):
            print(f"{name}: {step_gflop(build(name, a.batch)[0], a.batch):.2f} GFLOP per step (batch {a.batch})")
        return
    try:
        import torch
    except ImportError:
        sys.exit("bench_cpu.py needs PyTorch as its peer: pip install torch==2.13.0")
    print(f"PyTorch {torch.__version__}, NumPy {np.__version__}, {os.cpu_count()} CPUs, float32, batch {a.batch}, "
          f"optimizer {a.optimizer}")
    if a.gains:
        threads = [int(t) for t in a.threads.split(",")]
        if len(threads) < 2:
            sys.exit("bench_cpu.py: --gains compares thread counts: give two or more in --threads")
        rows = []
        for name in a.models.split(","):
            rows.append(gain_row(name, a.batch, threads, a.rounds, a.steps, a.user_loop))
            r, med = rows[-1], statistics.median
            print(f"{r['model']:<30} gain {threads[0]}->{threads[-1]} threads: pydtnn {med(r['gains']['ours']):.2f}  "
                  f"torch {med(r['gains']['theirs']):.2f}  ratio {med(r['relative']):.2f} "
                  f"({min(r['relative']):.2f}-{max(r['relative']):.2f})", flush=True)
        print_gains(rows)
        return
    rows = []
    algorithms = a.conv_algorithms.split(",")
    for name in ([] if a.skip_single else a.models.split(",")):
        for threads in [int(t) for t in a.threads.split(",")]:
            if a.user_loop:
                row = user_loop_row(name, a.batch, threads, a.rounds, a.steps)
                rows.append(row)
                print(f"{row['model']:<30} threads={threads} pydtnn {row['ours_ms']:8.1f} ms  "
                      f"torch {row['torch_ms']:8.1f} ms  ratio {row['ours_ms'] / row['torch_ms']:5.2f} "
                      f"({min(row['ratios']):.2f}-{max(row['ratios']):.2f})", flush=True)
                continue
            for alg in algorithms:
                row = bench_row(name, a.batch, threads, a.rounds, a.steps, a.breakdown, alg)
                rows.append(row)
                flag = "" if row["same_loss"] else "  (WARNING: the mirror's outputs differ from PyDTNN's)"
                print(f"{name:<18} threads={threads} conv={alg:<8} pydtnn {row['ours_ms']:8.1f} ms  "
                      f"torch {row['torch_ms']:8.1f} ms  ratio {row['ours_ms'] / row['torch_ms']:5.2f} "
                      f"({min(row['ratios']):.2f}-{max(row['ratios']):.2f}){flag}", flush=True)
                if a.breakdown:
                    print_breakdown(row)
    if a.ddp:
        for alg in algorithms:
            o, t, ratios = ddp_row(a, alg)
            rows.append({"model": f"{a.ddp_model}, 2 ranks (DDP gloo)", "threads": "2x1", "conv_algorithm": alg,
                         "ours_ms": o, "torch_ms": t, "ratios": ratios})
            print(f"{a.ddp_model} 2 ranks x 1 thread conv={alg:<8} pydtnn {o:8.1f} ms  DDP {t:8.1f} ms  "
                  f"ratio {o / t:5.2f} ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    print("\n| model | threads | conv_algorithm | PyDTNN ms/step | PyTorch ms/step | ratio | spread over rounds |\n"
          "|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['threads']} | {r['conv_algorithm']} | {r['ours_ms']:.1f} | {r['torch_ms']:.1f} | "
              f"{r['ours_ms'] / r['torch_ms']:.2f} | {min(r['ratios']):.2f}-{max(r['ratios']):.2f} |")


if __name__ == "__main__":
    main()
