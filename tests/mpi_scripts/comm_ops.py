"""Every MPIComm collective checked against values computed locally; run with 2 or 3 processes.

Usage: mpiexec -n K python -m mpi4py comm_ops.py
Any failed assertion raises on that rank, and `python -m mpi4py` turns it into MPI_Abort (non-zero exit).
"""
import numpy as np

from pydtnn.parallel.comm import BucketedReducer, MPIComm, make_comm

comm = MPIComm()
rank, size = comm.rank, comm.size
assert size >= 2, size
auto = make_comm("auto")
assert isinstance(auto, MPIComm) and auto.size == size

# --- bcast_: in place, several dtypes, every root, non-contiguous arrays
for dtype in (np.float32, np.float64, np.int64):
    for root in range(size):
        a = np.full((3, 4), rank + 10, dtype=dtype)
        out = comm.bcast_(a, root=root)
        assert out is a
        assert np.all(a == root + 10) and a.dtype == dtype, (dtype, root, a)
strided = np.zeros((4, 6))
strided[:, ::2] = rank + 1
comm.bcast_(strided[:, ::2], root=size - 1)
assert np.all(strided[:, ::2] == size) and np.all(strided[:, 1::2] == 0)

# --- allreduce_sum_: in place, float32/float64, exact on integer-valued data
for dtype in (np.float32, np.float64):
    a = (np.arange(1000, dtype=dtype) + rank)
    ref = sum(np.arange(1000, dtype=np.float64) + r for r in range(size))
    assert comm.allreduce_sum_(a) is a
    assert a.dtype == dtype and np.array_equal(a, ref.astype(dtype))
scalar0d = np.array(float(rank + 1))
comm.allreduce_sum_(scalar0d)
assert float(scalar0d) == size * (size + 1) / 2

# --- allgather: scalars -> (P,) float64, 1-D arrays -> (P, n) of their dtype
g = comm.allgather(rank * 1.5)
assert g.shape == (size,) and g.dtype == np.float64 and np.array_equal(g, np.arange(size) * 1.5)
g = comm.allgather(np.array([rank, rank * 2, 7], dtype=np.int32))
assert g.shape == (size, 3) and g.dtype == np.int32
assert np.array_equal(g[:, 0], np.arange(size)) and np.array_equal(g[:, 1], 2 * np.arange(size)) and np.all(g[:, 2] == 7)

# --- weighted_mean: sum_i w_i v_i / sum_i w_i with w_i = local batch sizes
weights = [1 + 3 * r for r in range(size)]
values = [np.array([r + 0.5, -2.0 * r, 1.0]) for r in range(size)]
wm = comm.weighted_mean(values[rank], weights[rank])
ref = sum(w * v for w, v in zip(weights, values)) / sum(weights)
assert np.allclose(wm, ref, rtol=1e-14, atol=0), (wm, ref)
s = comm.weighted_mean(float(rank), weights[rank])
assert isinstance(s, float) and abs(s - sum(w * r for r, w in enumerate(weights)) / sum(weights)) < 1e-12
# a NaN on one rank poisons the mean everywhere (consistently, no hang)
nanv = comm.weighted_mean(np.array([np.nan if rank == 1 else 1.0]), 2.0)
assert np.isnan(nanv[0])

# --- any_true: true everywhere iff true somewhere
assert comm.any_true(rank == size - 1) is True
assert comm.any_true(False) is False
assert comm.any_true(True) is True
assert comm.any_true(np.isnan(np.nan) and rank == 0) is True

# --- BucketedReducer == one blocking allreduce, float32 and float64, several bucket sizes
rng = np.random.default_rng(1234 + rank)
SMALL = [3, 1, 5, 2, 4]                                    # with one-element buckets (many collectives)
LARGE = [7, 130, 1, 2048, 33, 500, 4, 999]                 # forward order; backward visits them reversed
CASES = [(SMALL, 1), (SMALL, 8), (LARGE, 100), (LARGE, 1000), (LARGE, 4096), (LARGE, 1 << 20)]
for dtype in (np.float32, np.float64):
    for layer_sizes, bucket_bytes in CASES:
        n = sum(layer_sizes)
        offsets = np.cumsum([0] + layer_sizes)
        for integer_valued in (True, False):
            grads = (rng.integers(-1000, 1000, n) if integer_valued else rng.standard_normal(n)).astype(dtype)
            expected = grads.copy()
            comm.allreduce_sum_(expected)
            buf = np.zeros(n, dtype=dtype)
            red = BucketedReducer(comm, buf, bucket_bytes=bucket_bytes)
            elems = max(1, bucket_bytes // buf.itemsize)
            assert red.nbuckets == -(-n // elems)
            for rep in range(2):                             # two steps: start_step() resets
                buf[:] = 0
                red.start_step()
                for layer in reversed(range(len(layer_sizes))):
                    lo, hi = offsets[layer], offsets[layer + 1]
                    buf[lo:hi] = grads[lo:hi]
                    red.ready(lo)
                    # every bucket fully inside [lo, n) has been started, none beyond
                    assert red.started == sum(1 for b_lo, _ in red.bounds if b_lo >= lo)
                out = red.finish()
                assert out is buf
                if integer_valued:
                    assert np.array_equal(buf, expected), (dtype, bucket_bytes)
                else:
                    tol = 1e-5 if dtype == np.float32 else 1e-12
                    assert np.allclose(buf, expected, rtol=tol, atol=tol), (dtype, bucket_bytes)
# finish() without any ready() call reduces everything too
buf = np.full(1000, rank + 1.0, dtype=np.float32)
red = BucketedReducer(comm, buf, bucket_bytes=256)
red.start_step()
red.finish()
assert np.all(buf == size * (size + 1) / 2)

comm.barrier()
print(f"OK rank {rank} of {size}", flush=True)
