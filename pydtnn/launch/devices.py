"""Each rank's devices: its threads (and every rank's, for the banner) and its emulated device
(--emulate_speeds factor, --emulate_costs, --emulate_schedule)."""
from __future__ import annotations

import types


def set_up_devices(config, comm):
    """Threads per replica (all ranks' for the banner) and --emulate_speeds' factor for this rank."""
    import numpy as np
    from pydtnn.parallel.runtime.threads import apply_threads
    np.seterr(all="ignore")        # overflow on the way to a NaN loss is reported once, by the trainer
    p = config.p
    threads, why = apply_threads(p.threads_per_replica, comm)
    out = types.SimpleNamespace(kinds=config.devices, threads=threads, threads_why=why,
                                threads_all=[int(t) for t in comm.allgather(float(threads))],
                                emulate=1.0, emulate_spin=False, emulate_reference=(), emulate_cost=None,
                                emulate_schedule=())
    if p.emulate_costs or p.emulate_schedule:
        from pydtnn.parallel.emulation import for_replica
        mine = for_replica(comm.rank, comm.size, p.emulate_costs, p.emulate_schedule)
        out.emulate_cost, out.emulate_schedule = mine.cost, mine.schedule
    if p.emulate_speeds or p.emulate_costs or p.emulate_schedule:
        if p.emulate_speeds:
            fastest = max(p.emulate_speeds)
            out.emulate = p.emulate_speeds[comm.rank] / fastest
            out.emulate_reference = [i for i, f in enumerate(p.emulate_speeds) if f == fastest]
        # busy-wait where the node's cores hold every rank's threads (a sleep slows what follows it)
        from pydtnn.parallel.runtime.threads import node_core_sets
        node = node_core_sets(comm)
        out.emulate_spin = len(node) * threads <= len(set().union(*node))
    return out
