"""probe_speeds, sharding, epoch_summary and the Chrome trace across real ranks.

Usage: mpiexec -n K python -m mpi4py balance_trace.py TRACE_PATH
"""
import json
import sys
import time

import numpy as np

from pydtnn.parallel import sharding
from pydtnn.parallel.balance import probe_speeds, proportional
from pydtnn.parallel.comm import MPIComm
from pydtnn.observe.timeline import Timeline, write_chrome_trace
from pydtnn.observe.timing import ReplicaStats, StepTimer, epoch_summary

trace_path = sys.argv[1]
comm = MPIComm()
rank, size = comm.rank, comm.size

# probe: rank r is (r+1) times slower per sample; every rank gets the same vector
delay = 0.01 * (rank + 1)
speeds = probe_speeds(lambda: time.sleep(delay), comm, k=3, samples_per_call=4)
assert speeds.shape == (size,)
allv = comm.allgather(speeds)
assert np.all(allv == allv[0]), allv                      # bit-identical on every rank
assert speeds[0] > speeds[-1]

# every rank derives the same split and the same number of steps, and together they cover the data
B, N = 29, 101
sizes = proportional.partition(B, speeds)
assert np.all(comm.allgather(np.array(sizes)) == np.array(sizes))
order = sharding.epoch_permutation(N, seed=7, epoch=3)
assert np.all(comm.allgather(order) == order)
n_steps = sharding.steps_in_epoch(N, B)
assert np.all(comm.allgather(float(n_steps)) == n_steps)
mine = [sharding.shard(order, s, B, sizes, rank, N) for s in range(n_steps)]
assert all(len(m) >= 1 for m in mine)
counts = comm.allgather(np.array([len(m) for m in mine]))
flat = np.concatenate(mine)
lengths = comm.allgather(float(len(flat)))
pieces = comm.allgather(np.pad(flat, (0, int(lengths.max()) - len(flat)), constant_values=-1))
everything = np.concatenate([p[: int(n)] for p, n in zip(pieces, lengths)])
assert sorted(everything.tolist()) == list(range(N)), "ranks do not cover the epoch exactly"
assert np.array_equal(counts.sum(axis=0)[:-1], np.full(n_steps - 1, B))

# timing statistics and the timeline
stats = ReplicaStats()
timeline = Timeline(rank)
timeline.start(comm)
timer = StepTimer(stats, timeline)
grads = np.ones(1000)
for s in range(3):
    timer.start_step(sizes[rank])
    with timer.compute():
        time.sleep(delay)
    with timer.wait():
        comm.allreduce_sum_(grads)
    with timer.phase("update"):
        grads[:] = 1
    timer.end_step()
summary = epoch_summary(comm, stats)
assert [r["rank"] for r in summary.rows] == list(range(size))
assert [r["b_i"] for r in summary.rows] == sizes
assert all(r["steps"] == 3 and r["samples"] == 3 * sizes[r["rank"]] for r in summary.rows)
assert all(r["compute_s"] >= 3 * 0.01 * (r["rank"] + 1) * 0.9 for r in summary.rows)
# the fast replicas wait for the slow one
assert summary.rows[0]["wait_s"] > summary.rows[-1]["wait_s"]
written = write_chrome_trace(trace_path, timeline, comm)
if rank == 0:
    assert written == trace_path
    print(summary.format(), flush=True)
    doc = json.load(open(trace_path))
    pids = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert pids == set(range(size)), pids
    assert sum(1 for e in doc["traceEvents"] if e["ph"] == "X") == size * 9
else:
    assert written is None
comm.barrier()
print(f"OK rank {rank}", flush=True)
