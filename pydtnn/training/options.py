"""The Trainer's options in a few groups instead of 33 keywords (each group a dataclass with defaults).

    Trainer(model, dataset, optimizer, loss=..., metrics=...,
            parallel=Parallelism(comm=comm, global_batch=96, policy="dynamic"),
            loop=Loop(steps_per_epoch=0, seed=0, schedulers=[...], callbacks=[...]),
            checkpointing=Checkpointing(checkpoint_dir="ckpt", save_steps=100),
            outputs=Outputs(history_file="h.csv", progress=False),
            emulation=Emulation(emulate_speed=0.5))

Every field may also be given to the Trainer as a keyword of its own name (the flat form older code uses);
such a keyword wins over the same field of a group object given too.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Parallelism:
    """The data-parallel step (pydtnn.parallel.DataParallel): split, weighting, reduction, clipping."""
    comm: Any = None
    global_batch: int = 64
    sizes: Any = None
    policy: Any = None                  # a BalancePolicy or a --balance value; None: from balance_mode
    balance_mode: str = "none"
    devices: Any = None                 # one of "cpu" / "gpu" per replica (what the policy is told)
    rebalance_interval: int = 20
    gradient_weighting: Any = "proportional"
    non_blocking: bool = False
    sync_batchnorm: bool = False
    max_local_batch: Any = None
    clip_grad_norm: float = 0.0
    accumulation_steps: int = 1         # each replica's local batch as K micro-batches (pydtnn.parallel.accumulation)
    grad_compression: str = "none"      # the weighted gradient reduced in 16 bits (pydtnn.parallel.comm.compression)


@dataclass
class Loop:
    """What the loop runs: steps, data order, callbacks (the schedulers are ones), evaluation batch."""
    steps_per_epoch: int = 0
    seed: int = 0
    schedulers: Any = ()
    callbacks: Any = ()
    eval_batch_size: Any = None
    # a step's loss, metrics and compute time read one step late, the host never waiting for the device
    # inside a step (pydtnn.parallel.lagged_step); None: where the backend is asynchronous (a GPU) and the
    # run has one replica, without --emulate_speeds
    lagged_reads: Any = None
    # forward + backward captured as a CUDA graph and replayed (pydtnn.parallel.step_graphs; GPU replicas)
    cuda_graphs: bool = False


@dataclass
class Checkpointing:
    """Checkpoints inside epochs and on preemption signals."""
    checkpoint_dir: str = "checkpoints"
    save_steps: int = 0
    save_minutes: float = 0.0
    handle_signals: bool = False
    clock: Callable = time.monotonic


@dataclass
class Outputs:
    """What the run writes and shows."""
    history_file: Any = None
    progress: bool = True
    tracer_output: Any = None
    log: Any = None
    flags: Any = None
    trace_steps: Any = None             # --trace_steps: which steps the timeline records
    profile_layers: bool = False        # --profile_layers: the per-layer time table


@dataclass
class Emulation:
    """--emulate_speeds: this replica's speed factor, busy-waiting, and the full-speed ranks it follows;
    --emulate_costs and --emulate_schedule: its emulated a + c b (pydtnn.parallel.emulation.EmulatedCost)
    and its slowdowns [(factor, first step, last step)]."""
    emulate_speed: float = 1.0
    emulate_spin: bool = False
    emulate_reference: Any = ()
    emulate_cost: Any = None
    emulate_schedule: Any = ()


GROUPS = {"parallel": Parallelism, "loop": Loop, "checkpointing": Checkpointing, "outputs": Outputs,
          "emulation": Emulation}


def grouped(given: dict, flat: dict) -> dict:
    """{group name: group object}: the group objects given (or defaults), with the flat keywords applied."""
    out = {name: given.get(name) or cls() for name, cls in GROUPS.items()}
    owner = {f.name: name for name, cls in GROUPS.items() for f in dataclasses.fields(cls)}
    for key in flat:
        if key not in owner:
            raise TypeError(f"Trainer() got an unexpected keyword argument {key!r}")
    for name in out:
        mine = {k: v for k, v in flat.items() if owner[k] == name}
        if mine:
            out[name] = dataclasses.replace(out[name], **mine)
    return out
