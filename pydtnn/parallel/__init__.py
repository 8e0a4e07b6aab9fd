"""Data parallelism: communicators, the batch split and its policies, and `DataParallel` for your own loop.

    comm/              communicators (serial, MPI, NCCL), `make_comm`, the bucketed gradient reduction
    partition.py       the global batch split in proportion to the replicas' speeds, within their caps
    sharding.py        which samples each replica takes at each step of an epoch
    balance.py         the balancing policies' interface, the dynamic balancer, the speed probe
    policies.py        the built-in policies (--balance) and `make_policy`
    weighting.py       the replicas' gradient weights (--gradient_weighting)
    data_parallel.py   `DataParallel`: one data-parallel step, for the trainer and for your own loop
    sync_batchnorm.py  BatchNorm statistics of the global batch (--sync_batchnorm)
    emulation.py       replicas of emulated relative speeds (--emulate_speeds)
    accumulation.py    a local batch as micro-batches whose gradients add up (--accumulation_steps)
    runtime/           the process around a replica: the job's environment, mpiexec lines, threads, ending
"""


def __getattr__(name):
    # lazy: `pydtnn.parallel.balance` and friends stay importable without the model's layers
    if name == "DataParallel":
        from pydtnn.parallel.data_parallel import DataParallel
        return DataParallel
    raise AttributeError(f"module 'pydtnn.parallel' has no attribute {name!r}")


__all__ = ["DataParallel"]
