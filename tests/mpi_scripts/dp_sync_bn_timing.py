"""DataParallel.train_step in a user's loop with synchronized BatchNorm, in virtual time (virtual_time.py:
a pass of b samples costs exactly b x VIRTUAL_COST_S, charged when it starts, so the replica with fewer
samples waits inside the pass, at the BatchNorm reductions). Prints, from rank 0, JSON with the seconds
per sample every step handed the policy, and each rank's compute and wait totals from dp.timer."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import virtual_time  # noqa: E402,F401  (the clock: imported before the step runs)

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from pydtnn import Model  # noqa: E402
from pydtnn.layers import FC, BatchNormalization, Input  # noqa: E402
from pydtnn.optimizers import SGD  # noqa: E402
from pydtnn.parallel import DataParallel  # noqa: E402
from pydtnn.parallel.balance import BalancePolicy  # noqa: E402


class Recorder(BalancePolicy):
    def __init__(self):
        self.seen = []

    def after_step(self, step, seconds_per_sample):
        self.seen.append(list(seconds_per_sample))
        return None


model = Model(dtype="float64", seed=0)
model.add(Input(shape=(6,)))
model.add(FC(shape=(5,)))
model.add(BatchNormalization())
model.add(FC(shape=(3,), activation="softmax"))
policy = Recorder()
dp = DataParallel(model, SGD(learning_rate=0.1), global_batch=64, sizes=[16, 48], policy=policy,
                  sync_batchnorm=True)
rng = np.random.default_rng(0)
for step in range(3):
    x, y = rng.standard_normal((64, 6)), rng.integers(0, 3, 64)
    dp.train_step(*dp.local_slice(x, y))
totals = MPI.COMM_WORLD.gather(dp.timer.stats.totals(), root=0)
if MPI.COMM_WORLD.rank == 0:
    print(json.dumps({"seconds_per_sample": policy.seen, "totals": [list(map(float, t)) for t in totals]}))
