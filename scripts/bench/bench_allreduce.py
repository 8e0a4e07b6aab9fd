"""Gradient reduction: PyDTNN's communicators against a raw mpi4py Allreduce of the same bytes, same run.

    mpiexec -n 2 python -m mpi4py scripts/bench/bench_allreduce.py [--repeats 20] [--bucket_mb 1,4]

For each size (ResNet-20 ~0.27 M and ResNet-50 ~25.6 M float32 parameters) it times, interleaved:
  raw      MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buf)  (the peer)
  comm     MPIComm.allreduce_sum_(buf)
  bucketed BucketedReducer(bucket_bytes).finish() after ready() calls over ~50 fake layers, without
           any compute in between (so it measures the bucketing overhead, not the overlap gain)
and prints the median times and their ratio to raw (rank 0).
"""
import argparse
import time

import numpy as np
from mpi4py import MPI

from pydtnn.parallel.comm import BucketedReducer, MPIComm

SIZES = {"resnet20 (0.27M)": 272_474, "resnet50 (25.6M)": 25_557_032}


def timed(fn, comm):
    """One run of ``fn``, started together on every rank; the slowest rank's seconds."""
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    t = time.perf_counter() - t0
    return comm.allreduce(t, op=MPI.MAX)   # pickle-based, but outside the timed region


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--bucket_mb", default="1,4,25", help="comma list of bucket sizes in MiB")
    args = ap.parse_args()
    world = MPI.COMM_WORLD
    comm = MPIComm()
    buckets = [float(x) for x in args.bucket_mb.split(",")]
    if comm.rank == 0:
        print(f"{comm.size} ranks, {MPI.Get_library_version().splitlines()[0].strip()}, median of {args.repeats}")
        print(f"{'size':<18} {'variant':<16} {'ms':>9} {'vs raw':>7}")
    for name, n in SIZES.items():
        buf = np.ones(n, dtype=np.float32)
        nlayers = 50
        bounds = np.linspace(0, n, nlayers + 1).astype(int)
        variants = {"raw Allreduce": lambda: world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                    "allreduce_sum_": lambda: comm.allreduce_sum_(buf)}
        for mb in buckets:
            red = BucketedReducer(comm, buf, bucket_bytes=int(mb * (1 << 20)))

            def bucketed(red=red):
                red.start_step()
                for lo in bounds[::-1][1:]:
                    red.ready(lo)
                red.finish()
            variants[f"bucketed {mb:g}MiB"] = bucketed
        for fn in variants.values():   # warm-up
            fn()
        # interleave the variants round by round so drift hits them all alike
        times = {k: [] for k in variants}
        for _ in range(args.repeats):
            for k, fn in variants.items():
                times[k].append(timed(fn, world))
        raw = float(np.median(times["raw Allreduce"]))
        if comm.rank == 0:
            for k, ts in times.items():
                med = float(np.median(ts))
                print(f"{name:<18} {k:<16} {med * 1e3:>9.3f} {med / raw:>7.2f}")


if __name__ == "__main__":
    main()
