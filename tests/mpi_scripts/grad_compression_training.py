"""A few SGD steps with --grad_compression against the same steps uncompressed; rank 0 prints JSON.

Both runs start from the same weights on the same batches (unequal shares, proportional weights). Before each
compressed step every rank computes its weighted gradient x_i in a pass that does not communicate, and the
ranks gather them: E_t = GradCompression.error_bound(sum_i |x_i|) bounds the step's gradient error e_t
elementwise (the bound tests/mpi_scripts/grad_compression.py checks). With SGD (rate eta, no momentum) the
parameters then differ by delta_K = -eta sum_t e_t + (the curvature's part, eta H delta_t at each step), so
|delta_K| <= eta sum_t E_t to first order, and the losses after K steps differ by |L' - L| <= |grad L(theta_K)|
. eta sum_t E_t to first order: "tol" is twice that (the factor covers the second-order terms, which are
smaller by a factor of about eta |H| K = a few hundredths here).

Output per format: "losses" (the compressed run's, one per step), "reference" (the uncompressed run's),
"diff" (|L'_K - L_K| of the loss after the last step, measured in one more pass) and "tol".

argv: fmt,... sizes steps
"""
import json
import sys

import numpy as np

from pydtnn import Model
from pydtnn.layers import FC, Conv2D, Flatten, Input, MaxPool2D
from pydtnn.losses import get_loss
from pydtnn.optimizers import SGD
from pydtnn.parallel import DataParallel
from pydtnn.parallel.comm import GradCompression, MPIComm
from pydtnn.targets import as_targets

formats, sizes, steps = sys.argv[1].split(","), [int(v) for v in sys.argv[2].split(",")], int(sys.argv[3])
comm = MPIComm()
B, ETA = sum(sizes), 0.05


def make_model():
    m = Model(backend="cpu", dtype="float32", seed=5)
    m.add(Input(shape=(1, 8, 8)))
    m.add(Conv2D(nfilters=6, filter_shape=(3, 3), padding=1, activation="relu"))
    m.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    m.add(Flatten())
    m.add(FC(shape=(24,), activation="relu"))
    m.add(FC(shape=(4,), activation="softmax"))
    return m


rng = np.random.default_rng(2)
X = rng.standard_normal((steps, B, 1, 8, 8)).astype(np.float32)
Y = rng.integers(0, 4, (steps, B))
X[..., 2:6, 2:6] += Y[..., None, None, None].astype(np.float32)    # learnable: the class shifts a patch


def parallel(name):
    model = make_model()
    return DataParallel(model, SGD(learning_rate=ETA), global_batch=B, comm=comm, sizes=sizes, grad_compression=name)


def exact_gradient(dp, x, y):
    """The exact sum of the replicas' weighted gradients at dp's weights (float64), and sum_i |x_i|."""
    xl, yl = dp.local_slice(x, y)
    dp.forward_backward(xl, as_targets(yl, 4, dp.model.dtype), dp.weight(sizes), overlap=False)
    parts = comm.allgather(dp.model.grads.astype(np.float64))
    return parts.sum(axis=0), np.abs(parts).sum(axis=0)


def global_loss(dp, x, y):
    xl, yl = dp.local_slice(x, y)
    value, _ = dp.model.compute_gradients(xl, as_targets(yl, 4, dp.model.dtype), get_loss("categorical_cross_entropy"))
    return comm.weighted_mean(float(value), len(xl))


reference = parallel("none")
ref_losses = [reference.train_step(*reference.local_slice(X[t], Y[t])) for t in range(steps)]
grad_ref, _ = exact_gradient(reference, X[-1], Y[-1])
out = {}
for name in formats:
    dp = parallel(name)
    losses, bounds = [], np.zeros(dp.model.grads.size)
    for t in range(steps):
        _, abs_sum = exact_gradient(dp, X[t], Y[t])
        bounds += dp.compression.error_bound(abs_sum, comm.size)
        losses.append(dp.train_step(*dp.local_slice(X[t], Y[t])))
    diff = abs(global_loss(dp, X[-1], Y[-1]) - global_loss(reference, X[-1], Y[-1]))
    out[name] = {"losses": losses, "reference": ref_losses, "diff": diff,
                 "tol": 2 * ETA * float(np.abs(grad_ref) @ bounds)}
if comm.rank == 0:
    print(json.dumps(out))
