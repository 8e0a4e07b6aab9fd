"""The launcher, with a real signal sent to this process during its Nth training step (on one rank).

    SIGNAL_AT_STEP=N SIGNAL_RANK=r SIGNAL_NAME=SIGTERM python signal_at_step.py <launcher flags>

The signal is raised with os.kill from inside the step, so it lands at a known step without timing.
"""
import os
import signal
import sys

from pydtnn import cli                      # noqa: E402
from pydtnn.training.loop import Trainer          # noqa: E402

AT = int(os.environ["SIGNAL_AT_STEP"])
RANK = int(os.environ.get("SIGNAL_RANK", "0"))
SIGNUM = getattr(signal, os.environ.get("SIGNAL_NAME", "SIGTERM"))
original = Trainer.train_step
calls = [0]


def train_step(self, indices, epoch, step_sizes, *rest):
    calls[0] += 1
    if calls[0] == AT and self.rank == RANK:
        os.kill(os.getpid(), SIGNUM)
    return original(self, indices, epoch, step_sizes, *rest)


Trainer.train_step = train_step
sys.exit(cli.main(sys.argv[1:]))
