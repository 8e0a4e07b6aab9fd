"""The data-parallel invariant: P heterogeneous replicas == one process on the global batch.

Every rank trains a few steps through the Trainer with sizes partition(B, speeds) and the given gradient
weighting; rank 0 then trains the same model serially (CPU) on batch B and prints the max relative
difference of the parameters, and of the BatchNorm running statistics, as JSON:
{"rel_diff": ..., "stats_rel_diff": ..., "sizes": [...], "clipped": ..., "clipped_serial": ...}.

argv: weighting speeds B steps [key=value ...] with the options
  non_blocking=0|1   overlapped bucketed reduction (--non_blocking_mpi)
  clip=X             --clip_grad_norm X ("clipped": the number of clipped steps, parallel and serial)
  model=plain|bn|vit bn: BatchNorm after convolutions, inside a residual block and after an FC;
                     vit: a tiny Vision Transformer (patch Conv2D, LayerNorm, attention, GELU MLP, residuals)
  sync=0|1           --sync_batchnorm
  devices=gpu,cpu    one backend per rank ("gpu" is the host stand-in under tests/gpu_standin)
  policy=rotate      a BalancePolicy that re-splits after every step (the sizes rotated by one replica)
"""
import json
import sys

import numpy as np
from mpi4py import MPI

from pydtnn import Model
from pydtnn.datasets import load_dataset
from pydtnn.layers import (FC, AdditionBlock, AveragePool2D, BatchNormalization, Conv2D, Flatten, Input, MaxPool2D,
                           Relu)
from pydtnn.optimizers import SGD
from pydtnn.parallel import balance
from pydtnn.parallel.balance import proportional
from pydtnn.parallel.comm import MPIComm, SerialComm
from pydtnn.training.loop import Trainer

weighting, speeds, B, steps = sys.argv[1], [float(v) for v in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
opts = {"non_blocking": "0", "clip": "0", "model": "plain", "sync": "0", "devices": "", "policy": ""}
for arg in sys.argv[5:]:
    key, _, value = arg.partition("=")
    if key not in opts:
        sys.exit(f"invariant.py: unknown option {arg!r} (key=value, one of {', '.join(opts)})")
    opts[key] = value
non_blocking, clip, sync = opts["non_blocking"] == "1", float(opts["clip"]), opts["sync"] == "1"


def make_model(backend="cpu"):
    m = Model(backend=backend, dtype="float64", seed=7)
    m.add(Input(shape=(2, 10, 10)))
    if opts["model"] == "vit":
        from pydtnn.layers import ImageToSequence, LayerNorm, PositionEmbedding
        from pydtnn.models.transformers import transformer_block
        m.add(Conv2D(nfilters=8, filter_shape=(5, 5), stride=5))       # 2 x 2 = 4 tokens of 8
        m.add(ImageToSequence())
        m.add(PositionEmbedding())
        for layer in transformer_block(8, 2):
            m.add(layer)
        m.add(LayerNorm())
        m.add(Flatten())
        m.add(FC(shape=(3,), activation="softmax"))
        return m
    if opts["model"] == "bn":
        m.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1))
        m.add(BatchNormalization(momentum=0.8))
        m.add(Relu())
        m.add(AdditionBlock([Conv2D(nfilters=4, filter_shape=(3, 3), padding=1), BatchNormalization(momentum=0.7),
                             Relu(), Conv2D(nfilters=4, filter_shape=(3, 3), padding=1), BatchNormalization()], []))
        m.add(Relu())
        m.add(MaxPool2D(pool_shape=(2, 2), stride=2))
        m.add(Flatten())
        m.add(FC(shape=(6,)))
        m.add(BatchNormalization(momentum=0.6))
        m.add(Relu())
        m.add(FC(shape=(3,), activation="softmax"))
        return m
    m.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1, activation="relu"))
    m.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    m.add(Conv2D(nfilters=5, filter_shape=(3, 3), stride=2, padding=1, activation="tanh"))
    m.add(AveragePool2D(pool_shape=(0, 0)))
    m.add(Flatten())
    m.add(FC(shape=(3,), activation="softmax"))
    return m


class Rotate(balance.BalancePolicy):
    """After every step the split in force rotated by one replica: [10, 20, 30] -> [20, 30, 10] -> ..."""
    def after_step(self, step, seconds_per_sample):
        self.resplits = getattr(self, "resplits", 0) + 1
        return self.sizes[1:] + self.sizes[:1]


def train(comm, sizes, backend="cpu"):
    ds = load_dataset("synthetic", input_shape=(2, 10, 10), nclasses=3, synthetic_samples=B * steps, seed=5)
    model = make_model(backend)
    t = Trainer(model, ds, SGD(learning_rate=0.1, momentum=0.9), comm=comm, global_batch=B, sizes=sizes,
                gradient_weighting=weighting, non_blocking=non_blocking, steps_per_epoch=steps, seed=11,
                progress=False, log=lambda m: None, clip_grad_norm=clip, sync_batchnorm=sync,
                policy=Rotate() if opts["policy"] == "rotate" and comm.size > 1 else None)
    t.fit(2)
    train.resplits = getattr(t.policy, "resplits", 0)
    return model, t.clipped_steps


def running_stats(model):
    arrays = [model.backend.to_numpy(a) for layer in model.all_layers() for a in layer.state_arrays().values()]
    return np.concatenate([a.ravel() for a in arrays]) if arrays else np.zeros(1)


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


comm = MPIComm(MPI.COMM_WORLD)
sizes = proportional.partition(B, speeds)
devices = opts["devices"].split(",") if opts["devices"] else ["cpu"] * comm.size
if devices[comm.rank] == "gpu":
    from pydtnn.backends.gpu.backend import GPUBackend
    backend = GPUBackend(dtype="float64", seed=0)
else:
    backend = "cpu"
parallel, clipped = train(comm, sizes, backend)
resplits = train.resplits
params = parallel.backend.to_numpy(parallel.params)
stats = running_stats(parallel)
if comm.rank == 0:
    serial, clipped_serial = train(SerialComm(), [B])
    print(json.dumps({"rel_diff": rel(params, serial.backend.to_numpy(serial.params)),
                      "stats_rel_diff": rel(stats, running_stats(serial)), "sizes": sizes, "clipped": clipped,
                      "resplits": resplits,
                      "clipped_serial": clipped_serial}))
# every rank clipped the same steps
assert len(set(np.asarray(comm.allgather(float(clipped))).ravel().tolist())) == 1
# every rank holds the same parameters and running statistics (to rounding when backends differ)
gathered = comm.allgather(np.array([float(np.abs(params).sum()), float(np.abs(stats).sum())]))
if len(set(devices)) == 1:
    assert np.all(gathered == gathered[0]), gathered
else:
    assert np.allclose(gathered, gathered[0], rtol=1e-10, atol=0), gathered
