#!/usr/bin/env python
"""The launcher's training step on a GPU: its loop (`Trainer`) with each step's numbers read a step late (the
default with one replica: `pydtnn.parallel.lagged_step`) and read at each step's end, beside the bare step of
`scripts/gpu/bench_gpu.py` (forward, backward and update, nothing read), and lagged with the step's forward and
backward replayed as a CUDA graph (`--cuda_graphs`: `pydtnn.parallel.step_graphs`).

    python scripts/gpu/bench_loop.py                          # resnet50_imagenet, batch 64, tf32
    python scripts/gpu/bench_loop.py --model vgg16_imagenet --precision fp32 --epochs 4

Per mode, ms per step: the median over the steps of every epoch after the first (plans built, buffers
allocated), timed from one step's on_batch_begin to the next's (a step's whole host and device work);
the modes alternate epoch by epoch on one model. "loop overhead" is a mode's step over the bare one's: the
host time per step the device waits for. One JSON line per mode goes to --jsonl. With --max_seconds it ends by
itself within that time (fewer epochs, said in a closing `STOPPED: ...` line).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


class StepClock:
    """perf_counter at every on_batch_begin, and at the end of training."""

    def __init__(self):
        self.marks = []

    def on_batch_begin(self, trainer, step):
        self.marks.append(time.perf_counter())

    def on_train_end(self, trainer):
        self.marks.append(time.perf_counter())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50_imagenet", help="a model of pydtnn.models")
    p.add_argument("--batch", type=int, default=64, help="samples per step")
    p.add_argument("--precision", default="tf32", help="tf32, fp32 or fp32_strict")
    p.add_argument("--steps_per_epoch", type=int, default=8, help="steps timed per epoch")
    p.add_argument("--epochs", type=int, default=3, help="epochs per mode; the first is warm-up")
    p.add_argument("--jsonl", default=None, help="append one JSON line per mode to this file")
    p.add_argument("--max_seconds", type=float, default=None,
                   help="end within this many seconds: an epoch after the first (and a bare block after the first) "
                        "starts only if it fits; what was not run is one 'STOPPED:' line at the end (default: no "
                        "limit)")
    a = p.parse_args(argv)

    from bench_gpu import block_ms
    from time_limit import TimeLimit
    from pydtnn import Model
    from pydtnn.backends.gpu.backend import GPUBackend
    from pydtnn.datasets import from_arrays
    from pydtnn.models import build_model
    from pydtnn.optimizers import SGD
    from pydtnn.parallel import DataParallel
    from pydtnn.training.loop import Trainer

    be = GPUBackend(dtype="float32", seed=0, precision=a.precision, auto_conv_alg=False)
    model = build_model(a.model, Model(backend=be, seed=0))
    nclasses, shape = model.output_shape[0], tuple(model.input_shape)
    n = a.batch * a.steps_per_epoch
    rng = np.random.default_rng(0)
    data = from_arrays(rng.random((n,) + shape, dtype=np.float32), rng.integers(0, nclasses, n))
    optimizer = SGD(learning_rate=0.01, momentum=0.9)

    clocks = {"lagged": StepClock(), "read at end": StepClock(), "graphs": StepClock()}
    said = []
    trainers = {mode: Trainer(model, data, optimizer, global_batch=a.batch, progress=False, seed=0,
                              callbacks=[clock], lagged_reads=(mode != "read at end"),
                              cuda_graphs=(mode == "graphs"), log=said.append)
                for mode, clock in clocks.items()}
    limit = TimeLimit(a.max_seconds)
    per_step = {mode: [] for mode in clocks}
    for epoch in range(a.epochs):
        # the first epoch builds plans and buffers; a later one starts only if it fits: the longest timed epoch
        # so far, or before any, the first epoch's median step times the epoch's steps, every mode
        guess = sum(a.steps_per_epoch * statistics.median(np.diff(clocks[m].marks)) for m in clocks) if epoch else 0
        if epoch and not limit.fits("epoch", at_least=guess):
            limit.skip(f"epochs {epoch + 1}-{a.epochs} of every mode")
            break
        with limit.timing("epoch" if epoch else "epoch 0"):
            for mode, trainer in trainers.items():
                clock = clocks[mode]
                clock.marks = []
                trainer.fit(1)
                if epoch:
                    per_step[mode] += list(np.diff(clock.marks) * 1e3)
    x = be.asarray(rng.random((a.batch,) + shape, dtype=np.float32))
    y = be.asarray(np.eye(nclasses, dtype=np.float32)[rng.integers(0, nclasses, a.batch)])
    dp = DataParallel(model, optimizer, global_batch=a.batch)

    def bare():
        dp.local_gradients(x, y, 1.0, sync=False)
        dp.update()
    blocks = []
    for i in range(a.epochs):                           # one block per epoch, the first always
        if i and not limit.fits("bare block"):
            limit.skip(f"bare blocks {i + 1}-{a.epochs}")
            break
        with limit.timing("bare block"):
            blocks.append(block_ms(bare, a.steps_per_epoch, be.synchronize))
    bare_ms = statistics.median(blocks)
    print(f"{a.model} batch {a.batch} {a.precision}: bare step {bare_ms:.2f} ms")
    median = {}
    for mode, times in per_step.items():
        if not times:
            print(f"  loop, {mode}: not timed (no epoch after the first fitted in --max_seconds)")
            continue
        ms = median[mode] = statistics.median(times)
        row = {"model": a.model, "batch": a.batch, "precision": a.precision, "mode": mode, "step_ms": ms,
               "bare_ms": bare_ms, "overhead_ms": ms - bare_ms, "steps": len(times),
               "lagged": trainers[mode].lagged}
        graphs = trainers[mode].dp.graphs
        if graphs is not None:
            row.update(captures=graphs.captures, replays=graphs.replays, graphs_off=graphs.off)
        print(f"  loop, {mode}: {ms:.2f} ms per step ({len(times)} steps), loop overhead {ms - bare_ms:+.2f} ms "
              f"({100 * (ms - bare_ms) / bare_ms:+.1f}%)")
        if a.jsonl:
            with open(a.jsonl, "a") as f:
                f.write(json.dumps(row) + "\n")
    for line in said:
        if "CUDA graphs" in line:
            print(line)
    if len(median) == len(clocks):
        lag, now, graphed = (median[m] for m in ("lagged", "read at end", "graphs"))
        print(f"RESULT: {a.model} {a.precision} b={a.batch}: bare {bare_ms:.1f} ms, loop lagged {lag:.1f} ms, "
              f"read at end {now:.1f} ms, graphs {graphed:.1f} ms (lagged: {now / lag:.3f}x the steps per second; "
              f"graphs: {lag / graphed:.3f}x lagged's)")
    else:
        print(f"RESULT: {a.model} {a.precision} b={a.batch}: bare {bare_ms:.1f} ms; the loop's modes not timed")
    if limit.stopped_line():
        print(limit.stopped_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
