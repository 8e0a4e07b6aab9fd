#!/usr/bin/env python
"""What --tracing and --profile_layers cost per step, in one process (the per-layer timer is per rank).

    python scripts/bench/bench_tracing.py                          # simplecnn, batch 64: small layers, the worst case
    python scripts/bench/bench_tracing.py --model resnet20 --batch 32 --rounds 5

Each round trains the same model one epoch of --steps steps three times, alternating (drift in the machine's
load hits all alike): tracing off, tracing every step (--trace_steps 1:STEPS, the most it can record), and
--profile_layers. A run's step time is its second epoch's time over its steps (the trace file's write
at the end is not in it). Prints the medians over the rounds and
the ratios against "off", with the per-round ratios (their spread is this machine's noise).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pydtnn.datasets import load_dataset  # noqa: E402
from pydtnn.model import Model  # noqa: E402
from pydtnn.models import build_model  # noqa: E402
from pydtnn.optimizers import SGD  # noqa: E402
from pydtnn.training.loop import Trainer  # noqa: E402


def step_seconds(args, mode, folder):
    model = Model(backend="cpu", seed=0)
    build_model(args.model, model)
    data = load_dataset("synthetic", input_shape=model.input_shape, nclasses=model.output_shape[0],
                        synthetic_samples=args.batch * args.steps, seed=0)
    extra = {"off": {}, "tracing": {"tracer_output": os.path.join(folder, "t.json"), "trace_steps": (1, args.steps)},
             "profile_layers": {"profile_layers": True}}[mode]
    trainer = Trainer(model, data, SGD(learning_rate=0.01), global_batch=args.batch, progress=False,
                      log=lambda m: None, **extra)
    trainer.fit(1)                   # warm-up epoch: compiled kernels, allocations
    trainer.start_epoch = 0
    trainer.fit(1)
    return trainer.history[-1]["time_s"] / args.steps       # the epoch's steps (not the trace file's write)


def per_call_overhead(calls=100_000):
    """Seconds the layer timer adds to one layer call (a no-op layer: only the timer's own work), with the
    timeline recording: robust to the machine's load, unlike the step ratios."""
    from pydtnn.layers import Input
    from pydtnn.observe.layer_profile import LayerProfile
    from pydtnn.observe.layer_timer import LayerTimer
    from pydtnn.observe.timeline import Timeline
    model = Model(backend="cpu", seed=0)
    layer = model.add(Input(shape=(1,)))
    x = [0.0]
    noop = lambda data: data           # noqa: E731
    best = {}
    for name, timer in (("tracing", LayerTimer(model.backend, timeline=Timeline(0))),
                        ("profile_layers", LayerTimer(model.backend, profile=LayerProfile()))):
        rounds = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(calls):
                noop(x)
            bare = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(calls):
                timer.run(layer, "forward", noop, x)
            rounds.append((time.perf_counter() - t0 - bare) / calls)
            if timer.timeline is not None:
                timer.timeline.events.clear()
        best[name] = min(rounds)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="simplecnn")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    modes = ("off", "tracing", "profile_layers")
    times = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            for m in modes:
                times[m].append(step_seconds(args, m, folder))
    print(f"{args.model}, batch {args.batch}, {args.steps} steps x {args.rounds} rounds; load {os.getloadavg()[0]:.1f}")
    off = statistics.median(times["off"])
    for m in modes:
        ratios = [t / o for t, o in zip(times[m], times["off"])]
        print(f"{m:>15}: {1e3 * statistics.median(times[m]):8.2f} ms/step  x{statistics.median(times[m]) / off:.3f} "
              f"(rounds: {', '.join(f'{r:.3f}' for r in ratios)})")
    model = Model(backend="cpu", seed=0)
    build_model(args.model, model)
    calls = 2 * len(model.layers)                  # at most one forward and one backward per top-level layer
    for m, seconds in per_call_overhead().items():
        print(f"{m:>15}: {1e6 * seconds:.2f} us per layer call; {calls} calls per step: "
              f"{1e3 * calls * seconds:.3f} ms = {100 * calls * seconds / off:.2f}% of the step off")


if __name__ == "__main__":
    main()
