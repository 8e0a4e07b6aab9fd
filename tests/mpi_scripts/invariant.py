"""The data-parallel invariant: P heterogeneous replicas == one process on the global batch.

Every rank trains a few steps through the Trainer with sizes partition(B, speeds) and the given gradient
weighting; rank 0 then trains the same model serially on batch B and prints the max relative difference
of the parameters as JSON: {"rel_diff": ..., "sizes": [...]}.
argv: weighting speeds B steps [non_blocking [clip_grad_norm]]; with clipping the JSON also has the
number of clipped steps of the parallel and the serial run ("clipped", "clipped_serial").
"""
import json
import sys

import numpy as np
from mpi4py import MPI

from pydtnn import Model
from pydtnn.datasets import load_dataset
from pydtnn.layers import FC, AveragePool2D, Conv2D, Flatten, Input, MaxPool2D
from pydtnn.optimizers import SGD
from pydtnn.parallel import balance
from pydtnn.parallel.comm import MPIComm, SerialComm
from pydtnn.trainer import Trainer

weighting, speeds, B, steps = sys.argv[1], [float(v) for v in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
non_blocking = len(sys.argv) > 5 and sys.argv[5] == "1"
clip = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0


def make_model():
    m = Model(backend="cpu", dtype="float64", seed=7)
    m.add(Input(shape=(2, 10, 10)))
    m.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1, activation="relu"))
    m.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    m.add(Conv2D(nfilters=5, filter_shape=(3, 3), stride=2, padding=1, activation="tanh"))
    m.add(AveragePool2D(pool_shape=(0, 0)))
    m.add(Flatten())
    m.add(FC(shape=(3,), activation="softmax"))
    return m


def train(comm, sizes):
    ds = load_dataset("synthetic", input_shape=(2, 10, 10), nclasses=3, synthetic_samples=B * steps, seed=5)
    model = make_model()
    t = Trainer(model, ds, SGD(learning_rate=0.1, momentum=0.9), comm=comm, global_batch=B, sizes=sizes,
                gradient_weighting=weighting, non_blocking=non_blocking, steps_per_epoch=steps, seed=11,
                progress=False, log=lambda m: None, clip_grad_norm=clip)
    t.fit(2)
    return model, t.clipped_steps


comm = MPIComm(MPI.COMM_WORLD)
sizes = balance.partition(B, speeds)
parallel, clipped = train(comm, sizes)
if comm.rank == 0:
    serial, clipped_serial = train(SerialComm(), [B])
    a, b = parallel.params, serial.params
    rel = float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
    print(json.dumps({"rel_diff": rel, "sizes": sizes, "clipped": clipped, "clipped_serial": clipped_serial}))
# every rank clipped the same steps
assert len(set(np.asarray(comm.allgather(float(clipped))).ravel().tolist())) == 1
# every rank holds the same parameters
gathered = comm.allgather(np.array([float(np.abs(parallel.params).sum())]))
assert np.all(gathered == gathered[0]), gathered
