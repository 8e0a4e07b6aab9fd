"""The launcher in virtual time: timing results that cannot depend on the machine's speed or load.

    VIRTUAL_COST_S=c python virtual_time.py <launcher flags>      (under mpiexec, one per rank)
    import virtual_time                                            (a script's own loop, on this clock)

Each process gets a virtual clock in place of time.perf_counter / time.sleep in pydtnn's own modules
(the step timer, the timeline, the speed probe, the speed emulation; libraries keep the real clock).
On it:
- a forward + backward of b samples (`Model.compute_gradients`) lasts exactly b x c seconds: every
  replica is the same device, and `--emulate_speeds` slows one down by padding, on this clock, as it
  would on a real one. The cost is charged when the pass starts, so a replica with more samples also
  arrives later at the collectives inside the pass (synchronized BatchNorm's reductions);
- a blocking allreduce (or a barrier: the lock-step probe's) ends when the last rank arrives: the ranks'
  clocks meet at the latest of them, so a rank that arrives early waits for exactly the difference;
- anything else costs one tick (1e-7 s) per clock reading, so a spin loop ends; the emulation sleeps
  (exactly, on this clock) up to its last SPIN_S instead of spinning all the way (which would take
  hundreds of thousands of readings per step; its busy-wait is tested on a fake clock in test_emulation).
What it tests is our logic (the emulation's deadlines, the probe, the balancers, the per-replica
statistics and the trace) on times that are known exactly; the emulation's fidelity in real time is
measured by scripts/experiments/heterogeneity_experiment.py, not asserted by a test.
"""
import os
import sys
import time
import types

import numpy as np

COST = float(os.environ.get("VIRTUAL_COST_S", "0.001"))
TICK = 1e-7


class VirtualClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        self.now += TICK
        return self.now

    def sleep(self, seconds):
        self.now += max(0.0, float(seconds))


clock = VirtualClock()
virtual_time = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("__")})
virtual_time.perf_counter, virtual_time.sleep = clock, clock.sleep
real = time.perf_counter, time.sleep
time.perf_counter, time.sleep = clock, clock.sleep    # while pydtnn is imported: default arguments bind it
from pydtnn import cli                               # noqa: E402
from pydtnn.observe import timing as trace           # noqa: E402
from pydtnn.training import loop as trainer          # noqa: E402
from pydtnn.parallel.balance import probe                    # noqa: E402
from pydtnn.model import Model                       # noqa: E402
from pydtnn.parallel import balance, emulation       # noqa: E402
from pydtnn.parallel.comm import MPIComm             # noqa: E402
from pydtnn.observe import layer_timer, timeline     # noqa: E402
time.perf_counter, time.sleep = real
for module in (cli, trace, trainer, probe, balance, emulation, layer_timer, timeline):
    module.time = virtual_time

compute_gradients = Model.compute_gradients
allreduce_sum_ = MPIComm.allreduce_sum_
barrier = MPIComm.barrier


def timed_compute(self, x, *args, **kwargs):
    clock.now += len(x) * COST
    return compute_gradients(self, x, *args, **kwargs)


def meet(comm):
    latest = np.array([clock.now])
    comm.comm.Allreduce(comm.MPI.IN_PLACE, latest, op=comm.MPI.MAX)
    clock.now = float(latest[0])


def meeting_allreduce(self, array):
    meet(self)
    return allreduce_sum_(self, array)


def meeting_barrier(self):
    meet(self)
    return barrier(self)


def sleeping_emulator(self, fraction, spin=False, clock=clock, sleep=clock.sleep, **kw):
    emulator_init(self, fraction, False, clock, sleep, **kw)


emulator_init = emulation.SpeedEmulator.__init__
emulation.SpeedEmulator.__init__ = sleeping_emulator
Model.compute_gradients = timed_compute
MPIComm.allreduce_sum_ = meeting_allreduce
MPIComm.barrier = meeting_barrier

if __name__ == "__main__":           # imported (another script's virtual clock): the patches only
    sys.exit(cli.main(sys.argv[1:]))
