#!/usr/bin/env python
"""When does --grad_compression pay? The simulator's step time with and without it, over models, network
bandwidths and replica counts (docs/simulation.md embeds the table).

    python scripts/experiments/compression_sweep.py                      # the doc's table, a few seconds
    python scripts/experiments/compression_sweep.py --models vgg16_cifar10 --bandwidths 1,10 --replicas 16,64

Each case is `pydtnn-simulate run`'s roofline mode (upstream's flags: --cpu_speed, --memory_bw, and
--network_bw as given here; one replica per node, a blocking allreduce under the auto algorithm) for
--local_batch samples a replica: the step time without compression, with fp16 (bf16 sends the same bytes),
and their ratio. Compression halves the gradient's bytes on the wire and adds two memory-bound casts over
the buffer (`pydtnn.sim.step_model`); it pays where the reduction is a large part of the step.
"""
from __future__ import annotations

import argparse

from pydtnn.sim import model_table
from pydtnn.sim.engine import Scenario, simulate
from pydtnn.sim.roofline import roofline_profile


def step_seconds(profile, replicas: int, local_batch: int, compression: str) -> float:
    sc = Scenario(profiles=[profile] * replicas, global_batch=local_batch * replicas, nodes=replicas, steps=3,
                  grad_compression=compression)
    return simulate(sc).step_seconds


def sweep(models, bandwidths_gbit, replicas, local_batch, cpu_speed, memory_bw):
    """Rows (model, gradient MB, Gb/s, P, step s uncompressed, step s fp16, speed-up)."""
    rows = []
    for name in models:
        model = model_table.build(name)
        for gbit in bandwidths_gbit:
            prof = roofline_profile(name, cpu_speed=cpu_speed, memory_bw=memory_bw, network_bw=gbit * 1e9,
                                    model=model)
            for P in replicas:
                plain = step_seconds(prof, P, local_batch, "none")
                half = step_seconds(prof, P, local_batch, "fp16")
                rows.append((name, prof.gradient_bytes / 1e6, gbit, P, plain, half, plain / half))
    return rows


def markdown(rows) -> str:
    lines = ["| model | gradient MB | network Gb/s | replicas | step s | step s, fp16 | speed-up |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, mb, gbit, P, plain, half, ratio in rows:
        lines.append(f"| {name} | {mb:.1f} | {gbit:g} | {P} | {plain:.4f} | {half:.4f} | {ratio:.3f}x |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--models", default="resnet20_cifar10,vgg16_cifar10,resnet50_imagenet")
    ap.add_argument("--bandwidths", default="1,10,100,400", help="Gb/s of the network, comma-separated")
    ap.add_argument("--replicas", default="16,64,256")
    ap.add_argument("--local_batch", type=int, default=32)
    ap.add_argument("--cpu_speed", type=float, default=4e12, help="FLOP/s (upstream's default)")
    ap.add_argument("--memory_bw", type=float, default=50e9, help="B/s (upstream's default)")
    a = ap.parse_args(argv)
    rows = sweep(a.models.split(","), [float(v) for v in a.bandwidths.split(",")],
                 [int(v) for v in a.replicas.split(",")], a.local_batch, a.cpu_speed, a.memory_bw)
    print(f"roofline --cpu_speed {a.cpu_speed:g} --memory_bw {a.memory_bw:g}, {a.local_batch} samples a replica")
    print(markdown(rows))
    return rows


if __name__ == "__main__":
    main()
