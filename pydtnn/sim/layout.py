"""How `pydtnn-simulate run` lays P replicas out on nodes, and how a `--sweep` grows the cluster.

A node of the simulated cluster is a copy of the profiled one. Its ranks share its cores (the profile's
contention factors) and the collectives inside it use the profile's intra-node network; between nodes, its
`network_inter`. The layout of P replicas:

- `--ranks_per_node K`: P / K nodes of K ranks (P a multiple of K);
- `--nodes N`: N nodes of P / N ranks; both flags: N x K must be P;
- neither: as many ranks per node as the profiled node holds replicas (its cores / threads per replica,
  "slots"), or the largest divisor of P below that; a profile that does not know its node (the roofline
  mode) puts one replica on each node.

A sweep point of p replicas keeps the ranks per node (given, or derived from --nodes for --replicas) and
grows the number of nodes; with neither flag each point is laid out by the default rule. Its replicas keep
the cluster's mix: replica i of p takes the --speed_factors, --replica_speeds and --profile of replica
floor(i * P / p) of the P, so a sweep of a half-slow cluster stays half slow at every size.
"""
from __future__ import annotations

from dataclasses import dataclass

from pydtnn.errors import ConfigError

__all__ = ["Layout", "node_layout", "sweep_layouts", "mix"]


@dataclass(frozen=True)
class Layout:
    replicas: int
    nodes: int
    ranks_per_node: int
    why: str                  # how the layout was chosen, for the output

    def describe(self, slots: int = 0) -> str:
        over = (f"; {self.ranks_per_node} ranks outnumber the node's {slots} replica slots: they time-slice its "
                f"cores" if slots and self.ranks_per_node > slots else "")
        return (f"{self.replicas} replica(s) on {self.nodes} node(s) of {self.ranks_per_node} rank(s) ({self.why}"
                f"{over})")


def _largest_divisor(p: int, limit: int) -> int:
    return max(d for d in range(1, min(p, limit) + 1) if p % d == 0)


def default_layout(p: int, slots: int) -> Layout:
    if not slots:
        return Layout(p, p, 1, "the profile does not say how many replicas a node holds: one per node; "
                               "--ranks_per_node to choose")
    k = _largest_divisor(p, slots)
    why = f"default: the profiled node holds {slots} replica(s)"
    if k != min(p, slots):
        why += f", and {p} is a multiple of {k}"
    return Layout(p, p // k, k, why + "; --ranks_per_node or --nodes to choose")


def node_layout(p: int, nodes: int | None, ranks_per_node: int | None, slots: int) -> Layout:
    """The layout of ``p`` replicas for the flags given (None: not given); ConfigError when impossible."""
    if nodes is not None and ranks_per_node is not None:
        if nodes * ranks_per_node != p:
            raise ConfigError(f"--nodes {nodes} x --ranks_per_node {ranks_per_node} is {nodes * ranks_per_node} "
                              f"ranks, not --replicas {p}")
        return Layout(p, nodes, ranks_per_node, "--nodes and --ranks_per_node")
    if nodes is not None:
        if nodes > p or p % nodes:
            raise ConfigError(f"--replicas {p} must be a multiple of --nodes {nodes}")
        return Layout(p, nodes, p // nodes, f"--nodes {nodes}")
    if ranks_per_node is not None:
        if p % ranks_per_node:
            raise ConfigError(f"--replicas {p} must be a multiple of --ranks_per_node {ranks_per_node}")
        return Layout(p, p // ranks_per_node, ranks_per_node, f"--ranks_per_node {ranks_per_node}")
    return default_layout(p, slots)


def sweep_layouts(sizes, layout: Layout, nodes_given: bool, ranks_given: bool, global_batch: int,
                  slots: int) -> list[Layout]:
    """The layout of every sweep point, or one ConfigError naming the points that cannot be laid out."""
    bad = [p for p in sizes if p > global_batch]
    if bad:
        raise ConfigError(f"--sweep {','.join(map(str, bad))}: more replicas than the global batch {global_batch} "
                          f"(every replica needs a sample)")
    if not (nodes_given or ranks_given):
        return [default_layout(p, slots) for p in sizes]
    k = layout.ranks_per_node
    bad = [p for p in sizes if p % k]
    if bad:
        flag = f"--ranks_per_node {k}" if ranks_given else f"the {k} ranks per node of --nodes {layout.nodes}"
        raise ConfigError(f"--sweep {','.join(map(str, bad))}: not a multiple of {flag} (a sweep grows the number of "
                          f"nodes and keeps the ranks per node)")
    return [Layout(p, p // k, k, f"{k} rank(s) per node, as --replicas {layout.replicas}") for p in sizes]


def mix(values, p: int):
    """The values (one per replica of the full cluster) of a sweep point of ``p`` replicas: replica i takes
    replica floor(i * P / p)'s, keeping the cluster's mix at every size. None stays None."""
    if values is None:
        return None
    P = len(values)
    return [values[i * P // p] for i in range(p)]
