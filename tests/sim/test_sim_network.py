"""The simulator's network is never silent (issue 46): every run prints the link inside a node and the link
between nodes with where each came from; run's --network_bw/--network_lat override a profile's link between
nodes (and change the result by exactly what the allreduce formula says); calibrate writes the link it is given
and asks for it when it is not."""
import json

import pytest

from pydtnn.sim import calibrate as calibrate_module
from pydtnn.sim.__main__ import main
from pydtnn.sim.collectives import allreduce_seconds
from pydtnn.sim.roofline import roofline_profile

RUN = ["run", "--model", "simplemlp", "--global_batch_size", "256", "--replicas", "8", "--ranks_per_node", "2",
       "--network_alg", "ring", "--steps", "3"]


@pytest.fixture(scope="module")
def node_profile(tmp_path_factory):
    """A profile like calibrate's on a 2-core node: its own network inside the node, none between nodes."""
    prof = roofline_profile("simplemlp", network_bw=80e9, network_lat=1e-6)     # shared memory: 10 GB/s
    prof.network_inter, prof.network_inter_source = None, ""
    prof.network_source, prof.cores = "measured by calibrate (stand-in)", 2
    path = tmp_path_factory.mktemp("net") / "node.json"
    prof.save(str(path))
    return str(path)


def _doc(capsys, argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_run_prints_both_links_and_their_sources(node_profile, capsys):
    assert main([*RUN, "--profile", node_profile]) == 0
    out = capsys.readouterr().out.splitlines()
    inside = next(line for line in out if line.startswith("network inside a node: "))
    between = next(line for line in out if line.startswith("network between nodes: "))
    assert "beta 1e-10 s/B (80 Gb/s)" in inside and "measured by calibrate (stand-in)" in inside, inside
    assert "beta 8e-09 s/B (1 Gb/s)" in between and "alpha 0.5 us" in between, between
    assert "the default (upstream PyDTNN's --network_bw 1e9" in between and "has no link between nodes" in between
    # the roofline mode: upstream's flags, given or at their defaults, said so
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "4", "--steps", "2",
                 "--network_bw", "1e10"]) == 0
    out = capsys.readouterr().out
    assert "roofline: --network_bw 1e+10 (given), --network_lat 5e-07 (upstream default)" in out, out
    assert "(not used: one node)" not in out                  # the roofline mode: one replica per node


def test_the_json_document_holds_the_network(node_profile, capsys):
    doc = _doc(capsys, [*RUN, "--profile", node_profile])
    net = doc["network"]
    assert net["inside_node"]["beta"] == pytest.approx(1e-10) and "stand-in" in net["inside_node"]["source"]
    assert net["between_nodes"]["beta"] == pytest.approx(8e-9) and net["between_nodes"]["used"] is True
    assert "default" in net["between_nodes"]["source"]
    one_node = _doc(capsys, ["run", "--profile", node_profile, "--global_batch_size", "64", "--replicas", "2",
                             "--steps", "2"])
    assert one_node["nodes"] == 1 and one_node["network"]["between_nodes"]["used"] is False


def test_network_flags_override_the_profiles_link_between_nodes(node_profile, capsys):
    """--network_bw with --profile changes the result: by the ring allreduce's difference at the two links,
    over 8 ranks on 4 nodes (a flat ring across nodes uses the slow links), for the gradient and the step's
    statistics (the compute, the update and the overhead are the same)."""
    base = _doc(capsys, [*RUN, "--profile", node_profile])
    fast = _doc(capsys, [*RUN, "--profile", node_profile, "--network_bw", "1e11", "--network_lat", "2e-6"])
    link = fast["network"]["between_nodes"]
    assert (link["alpha"], link["beta"]) == pytest.approx((2e-6, 8e-11)) and link["gamma"] == pytest.approx(6e-11)
    assert link["source"] == "given: --network_bw 1e+11 and --network_lat 2e-06"
    grad = 2678824                                           # simplemlp's float32 gradient bytes
    stats = 8.0 * (8 + 8)                                    # the trainer's per-step statistics reduction

    def ring(n, alpha, beta):
        return allreduce_seconds("ring", n, 8, alpha, beta, 6e-11)
    expected = (ring(grad, 0.5e-6, 8e-9) + ring(stats, 0.5e-6, 8e-9)) - (ring(grad, 2e-6, 8e-11) +
                                                                         ring(stats, 2e-6, 8e-11))
    assert base["step_seconds"] - fast["step_seconds"] == pytest.approx(expected, rel=1e-9)
    assert base["step_seconds"] - fast["step_seconds"] > 0.01                # 1 Gb/s against 100 Gb/s
    # one flag alone: the other from the profile's link or the default, said so
    only_lat = _doc(capsys, [*RUN, "--profile", node_profile, "--network_lat", "1e-5"])["network"]["between_nodes"]
    assert only_lat["beta"] == pytest.approx(8e-9) and only_lat["alpha"] == pytest.approx(1e-5)
    assert only_lat["source"] == "given: --network_lat 1e-05; bandwidth from the default"


def test_calibrate_writes_the_link_between_nodes_it_is_given_and_asks_when_not(tmp_path, monkeypatch, capsys):
    """The measured mode (its measurement stood in for: a profile without a link between nodes)."""
    def measured(*args, **kwargs):
        prof = roofline_profile("simplemlp", network_bw=80e9, network_lat=1e-6)
        prof.network_inter, prof.network_inter_source = None, ""
        prof.network_source = "measured by calibrate: stand-in"
        return prof
    monkeypatch.setattr(calibrate_module, "calibrate", measured)
    out = tmp_path / "p.json"
    assert main(["calibrate", "--model", "simplemlp", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "network between nodes: none (one machine cannot measure a link to another): give it here or to run " \
           "with --network_bw BITS/S --network_lat S" in said, said
    assert "network_inter" not in json.loads(out.read_text())
    assert main(["calibrate", "--model", "simplemlp", "--out", str(out), "--network_bw", "1e11", "--network_lat",
                 "1.5e-6"]) == 0
    doc = json.loads(out.read_text())
    assert (doc["network_inter"]["alpha"], doc["network_inter"]["beta"]) == pytest.approx((1.5e-6, 8e-11))
    assert doc["network_inter_source"].startswith("given: --network_bw 1e+11 and --network_lat 1.5e-06 to calibrate")
    assert doc["network_source"] == "measured by calibrate: stand-in"
    capsys.readouterr()
    # run takes it, and says where it came from
    run = _doc(capsys, ["run", "--profile", str(out), "--global_batch_size", "64", "--replicas", "4", "--nodes", "2",
                        "--steps", "2"])
    assert run["network"]["between_nodes"]["beta"] == pytest.approx(8e-11)
    assert "to calibrate" in run["network"]["between_nodes"]["source"]


@pytest.mark.parametrize("flag, value", [("--network_bw", "0"), ("--network_bw", "inf"), ("--network_bw", "-1"),
                                         ("--network_lat", "nan"), ("--network_lat", "-1e-6")])
def test_a_bad_network_flag_is_one_line(node_profile, flag, value, capsys):
    assert main([*RUN, "--profile", node_profile, f"{flag}={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pydtnn: error: {flag} must be a finite number"), err
