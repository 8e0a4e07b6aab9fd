#!/usr/bin/env python
"""CPU training speed: PyDTNN against PyTorch CPU on the same model, batch, dtype and thread count.

    pip install torch==2.13.0            # the benchmark's peer; not a dependency of PyDTNN
    python scripts/bench_cpu.py                          # the table of docs/performance.md
    python scripts/bench_cpu.py --models resnet20_cifar10 --threads 2 --breakdown

The PyTorch network is MIRRORED from the PyDTNN model layer by layer (same convolutions, pools, blocks,
initial weights), and the first step's loss of both is checked to agree, so both frameworks time the very
same computation. A step is forward + loss + backward + SGD update, float32. The two frameworks alternate
in rounds and the median step time of each is reported, with the ratio PyDTNN / PyTorch.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
            m = nn.Linear(layer.in_shape[0], layer.out_features, bias=layer.use_bias)
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


def build(name, batch, seed=0):
    from pydtnn import Model
    from pydtnn.models import build_model, default_input_shape
    model = Model(backend="cpu", dtype="float32", seed=seed)
    build_model(name, model)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch,) + tuple(default_input_shape(name))).astype(np.float32)
    labels = rng.integers(0, model.output_shape[0], batch)
    return model, x, labels


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
            t0 = time.perf_counter()
            out = inner(*args, **kw)
            self.times[key] += time.perf_counter() - t0
            return out
        setattr(layer, method, timed)


def bench_row(name, batch, threads, rounds, steps, breakdown=False):
    import torch
    from threadpoolctl import threadpool_limits
    from pydtnn.model import one_hot
    from pydtnn.optimizers import SGD

    torch.set_num_threads(threads)
    model, x, labels = build(name, batch)
    net = mirror(model)
    net.train()
    y = one_hot(labels, model.output_shape[0], np.float32)
    opt = SGD(learning_rate=0.01, momentum=0.9)
    topt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    tx, ty = torch.from_numpy(x), torch.from_numpy(labels)
    lossf = torch.nn.CrossEntropyLoss()

    def ours():
        value, _ = model.compute_gradients(x, y, "categorical_cross_entropy")
        opt.step(model.params, model.grads)
        return value

    def theirs():
        topt.zero_grad(set_to_none=True)
        loss = lossf(net(tx), ty)
        loss.backward()
        topt.step()
        return loss.item()

    with threadpool_limits(threads):
        # the mirror computes the same function: compare inference outputs (no dropout) before training
        net.eval()
        with torch.no_grad():
            p_theirs = torch.softmax(net(tx), dim=1).numpy()
        net.train()
        p_ours = model.forward(x, training=False)
        same = bool(np.allclose(p_ours, p_theirs, atol=1e-4))
        first_ours, first_theirs = ours(), theirs()      # warm-up
        t_ours, t_theirs = [], []
        for _ in range(rounds):
            for fn, acc in ((ours, t_ours), (theirs, t_theirs)):
                for _ in range(steps):
                    t0 = time.perf_counter()
                    fn()
                    acc.append(time.perf_counter() - t0)
        table = None
        if breakdown:
            bd = Breakdown(model)
            t0 = time.perf_counter()
            for _ in range(steps):
                ours()
            total = (time.perf_counter() - t0) / steps
            table = (bd.times, total, steps)
    return {"model": name, "threads": threads, "batch": batch, "ours_ms": 1e3 * statistics.median(t_ours),
            "torch_ms": 1e3 * statistics.median(t_theirs), "same_loss": same,
            "loss": (first_ours, first_theirs), "breakdown": table}


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
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("bench_cpu.py needs PyTorch as its peer: pip install torch==2.13.0")
    print(f"PyTorch {torch.__version__}, NumPy {np.__version__}, {os.cpu_count()} CPUs, float32, batch {a.batch}")
    rows = []
    for name in a.models.split(","):
        for threads in [int(t) for t in a.threads.split(",")]:
            row = bench_row(name, a.batch, threads, a.rounds, a.steps, a.breakdown)
            rows.append(row)
            flag = "" if row["same_loss"] else "  (WARNING: the mirror's outputs differ from PyDTNN's)"
            print(f"{name:<20} threads={threads}  pydtnn {row['ours_ms']:8.1f} ms  torch {row['torch_ms']:8.1f} ms  "
                  f"ratio {row['ours_ms'] / row['torch_ms']:5.2f}{flag}", flush=True)
            if a.breakdown:
                print_breakdown(row)
    print("\n| model | threads | PyDTNN ms/step | PyTorch ms/step | ratio |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['threads']} | {r['ours_ms']:.1f} | {r['torch_ms']:.1f} | "
              f"{r['ours_ms'] / r['torch_ms']:.2f} |")


if __name__ == "__main__":
    main()
