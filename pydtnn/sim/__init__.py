"""The performance model and cluster simulator (`python -m pydtnn.sim`, `pydtnn-simulate`).

    profile.py        the editable JSON profile and its functional (batch-dependent) per-layer model
    calibrate.py      measure a profile here (layers, optimizer step, MPI sweeps via network_probe.py)
    network_fit.py    alpha, beta, gamma by least squares
    roofline.py       a profile from upstream's five performance-model flags
    trace_profile.py  a profile from a launcher Chrome trace
    model_table.py    a model's layers: gradient bytes, BatchNorm channels, FLOPs
    collectives.py    MPICH's allreduce cost formulas
    links.py          the network a run models, inside and between nodes, and where each came from
    devices.py        --devices KIND[:COUNT],...
    cost_file.py      --cost_model: each device's t_i(b) from a file or a run's checkpoint
    kinds.py          replicas alike, computed once
    step_model.py     one step, vectorized over replicas
    variability.py    lognormal noise, stragglers
    policies.py       the launcher's balancing policies (pydtnn.parallel.balance), one adapter
    engine.py         a run: policy + steps; the best partition
    layout.py         replicas on nodes
    budget.py         what a run costs: memory refused before, time said before
    talk.py           what a run says while it works
    report.py         text, table, plot, JSON
"""
from pydtnn.sim.engine import Result, Scenario, best_partition, simulate
from pydtnn.sim.profile import Network, Profile, load_profile

__all__ = ["Scenario", "Result", "simulate", "best_partition", "Profile", "Network", "load_profile"]
