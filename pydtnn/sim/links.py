"""The network a run models, inside a node and between nodes, and where each came from; every
`pydtnn-simulate run` prints both (and `--json` holds them under "network").

Inside a node: the profile's `network` (measured by `calibrate`, written by hand, or the roofline's flags), or
its `network_oversubscribed` when the node's ranks outnumber its cores. Between nodes, the first that applies:

1. `--network_bw` / `--network_lat` given to `run` with `--profile`: they override the profile's link between
   nodes (a flag not given keeps the profile's value, or the default);
2. the profile's `network_inter` (`calibrate --network_bw/--network_lat` writes it: one machine cannot measure
   a link to another);
3. the default: upstream PyDTNN's `--network_bw` 1 Gb/s and `--network_lat` 0.5 us.

Without `--profile` (the roofline mode) the two flags are upstream's, the network of the whole cluster. A
link's gamma (the reduction's arithmetic, s per byte) is the node's: the sums run on the ranks' cores.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pydtnn.errors import ConfigError
from pydtnn.sim.profile import Network

__all__ = ["Link", "DEFAULT_BW", "DEFAULT_LAT", "flag_network", "default_inter", "inside_node", "between_nodes",
           "check_flags"]

DEFAULT_BW = 1e9                      # bits/s: upstream PyDTNN's --network_bw
DEFAULT_LAT = 0.5e-6                  # s: upstream's --network_lat
DEFAULT_WORDS = "the default (upstream PyDTNN's --network_bw 1e9 bits/s, --network_lat 5e-07 s)"


@dataclass(frozen=True)
class Link:
    network: Network
    source: str

    def describe(self) -> str:
        a, b, g = self.network.as_tuple()
        speed = f"{8 / b / 1e9:.3g} Gb/s" if b > 0 else "unlimited bandwidth"
        return f"alpha {a * 1e6:.3g} us, beta {b:.3g} s/B ({speed}), gamma {g:.3g} s/B; {self.source}"

    def to_json(self) -> dict:
        return dict(vars(self.network), source=self.source)


def check_flags(network_bw, network_lat) -> None:
    """--network_bw > 0 and --network_lat >= 0, finite (each where given)."""
    if network_bw is not None and not (math.isfinite(network_bw) and network_bw > 0):
        raise ConfigError(f"--network_bw must be a finite number of bits/s > 0, got {network_bw}")
    if network_lat is not None and not (math.isfinite(network_lat) and network_lat >= 0):
        raise ConfigError(f"--network_lat must be a finite number of seconds >= 0, got {network_lat}")


def flag_network(network_bw, network_lat, gamma) -> Network:
    """alpha = latency, beta = 8 / bandwidth (s per byte), gamma the node's."""
    return Network(float(network_lat), 8.0 / float(network_bw), float(gamma))


def default_inter(intra: Network) -> Network:
    return flag_network(DEFAULT_BW, DEFAULT_LAT, intra.gamma)


def inside_node(profile, where: str, ranks_per_node: int) -> Link:
    """The link the collectives inside a node use, and its source."""
    net = profile.network_for(ranks_per_node)
    source = profile.network_source or f"{where}'s network"
    if net is not profile.network:
        source = (f"{where}'s network_oversubscribed: {ranks_per_node} ranks outnumber the node's "
                  f"{profile.replica_slots} replica slots")
    return Link(net, source)


def between_nodes(profile, where: str, network_bw=None, network_lat=None) -> Link:
    """The link between nodes under the rules above (`--profile` given; the roofline mode's profile carries its
    flags' link as its own network_inter)."""
    intra = profile.network
    known = profile.network_inter
    if network_bw is not None or network_lat is not None:
        base = known if known is not None else default_inter(intra)
        base_words = (f"{where}'s network_inter" if known is not None else "the default")
        bw = network_bw if network_bw is not None else 8.0 / base.beta if base.beta > 0 else math.inf
        lat = network_lat if network_lat is not None else base.alpha
        given = " and ".join(f"{flag} {v:g}" for flag, v in (("--network_bw", network_bw),
                                                              ("--network_lat", network_lat)) if v is not None)
        kept = ("" if network_bw is not None and network_lat is not None else
                f"; {'latency' if network_lat is None else 'bandwidth'} from {base_words}")
        return Link(Network(float(lat), 8.0 / bw if math.isfinite(bw) else 0.0, base.gamma), f"given: {given}{kept}")
    if known is not None:
        return Link(known, profile.network_inter_source or f"{where}'s network_inter")
    return Link(default_inter(intra), f"{DEFAULT_WORDS}: {where} has no link between nodes; give run "
                                      f"--network_bw/--network_lat, or calibrate them into the profile")
