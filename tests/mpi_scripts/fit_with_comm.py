"""Model.fit(..., comm=make_comm("auto")) under mpiexec against the same fit in one process (float64).
Prints, from rank 0, JSON: the largest relative difference of the weights, and whether the ranks agree."""
import json

import numpy as np
from mpi4py import MPI

from pydtnn import Model
from pydtnn.layers import FC, Input
from pydtnn.optimizers import SGD
from pydtnn.parallel.comm import SerialComm, make_comm


class SplitSeen:
    """The split each step trained with, and this rank's samples (the logs' batch_size is the global one)."""

    def __init__(self):
        self.splits = []

    def on_batch_begin(self, trainer, step):
        self.splits.append((trainer.nreplicas, list(trainer.sizes)))


def fit(comm):
    model = Model(dtype="float64", seed=0)
    model.add(Input(shape=(5,)))
    model.add(FC(shape=(7,), activation="relu"))
    model.add(FC(shape=(3,), activation="softmax"))
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((48, 5)), rng.integers(0, 3, 48)
    seen = SplitSeen()
    history = model.fit(x, y, epochs=2, batch_size=12, optimizer=SGD(learning_rate=0.1), comm=comm, callbacks=[seen])
    return model.params.copy(), history["loss"], seen.splits


params, losses, splits = fit(make_comm("auto"))
world = MPI.COMM_WORLD
agree = all(np.array_equal(p, params) for p in world.allgather(params))
if world.rank == 0:
    ref, ref_losses, _ = fit(SerialComm())
    print(json.dumps({"ranks": world.size, "agree": agree, "splits": splits,
                      "rel_diff": float(np.abs(params - ref).max() / np.abs(ref).max()),
                      "loss_diff": float(np.max(np.abs(np.subtract(losses, ref_losses))))}))
