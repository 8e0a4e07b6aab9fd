"""What `pydtnn-simulate run` models, said in its output: replicas laid out on nodes (--ranks_per_node,
--nodes, or the profiled node's slots), a --sweep that keeps the ranks per node and the cluster's mix of
devices as P grows; outputs (--plot, calibrate --out) checked before any work."""
import json

import pytest

from pydtnn.errors import ConfigError
from pydtnn.sim import calibrate
from pydtnn.sim.__main__ import main
from pydtnn.sim.layout import Layout, mix, node_layout, sweep_layouts


@pytest.fixture(scope="module")
def node_profile(tmp_path_factory):
    """A roofline profile of a 2-core node (one thread per replica: 2 replica slots)."""
    path = tmp_path_factory.mktemp("sim") / "node.json"
    assert main(["calibrate", "--model", "simplemlp", "--roofline", "--out", str(path)]) == 0
    doc = json.loads(path.read_text())
    doc["cores"] = 2
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_layout_follows_the_flags_or_the_profiled_node():
    assert node_layout(1024, None, None, 2) == Layout(1024, 512, 2, node_layout(1024, None, None, 2).why)
    assert (node_layout(6, None, None, 4).nodes, node_layout(6, None, None, 4).ranks_per_node) == (2, 3)
    assert (node_layout(7, None, None, 4).nodes, node_layout(7, None, None, 4).ranks_per_node) == (7, 1)
    assert node_layout(8, None, None, 0).nodes == 8                       # a profile that does not know its node
    assert (node_layout(8, 2, None, 2).ranks_per_node, node_layout(8, None, 4, 2).nodes) == (4, 2)
    assert node_layout(8, 2, 4, 2).why == "--nodes and --ranks_per_node"
    for nodes, ranks, message in ((3, None, "multiple of --nodes 3"), (None, 3, "multiple of --ranks_per_node 3"),
                                  (2, 2, "is 4 ranks, not --replicas 8")):
        with pytest.raises(ConfigError, match=message):
            node_layout(8, nodes, ranks, 2)
    assert "outnumber the node's 2 replica slots" in node_layout(8, 1, None, 2).describe(2)


def test_a_sweep_keeps_the_ranks_per_node_and_the_clusters_mix():
    fixed = node_layout(16, None, 4, 2)
    assert [(l.replicas, l.nodes) for l in sweep_layouts([4, 8, 16], fixed, False, True, 64, 2)] == \
        [(4, 1), (8, 2), (16, 4)]
    with pytest.raises(ConfigError, match=r"--sweep 2,6: not a multiple of --ranks_per_node 4"):
        sweep_layouts([2, 4, 6], fixed, False, True, 64, 2)
    with pytest.raises(ConfigError, match="more replicas than the global batch 64"):
        sweep_layouts([128], fixed, False, True, 64, 2)
    assert [l.nodes for l in sweep_layouts([1, 2, 3], node_layout(4, None, None, 2), False, False, 64, 2)] == [1, 1, 3]
    half_slow = [1.0] * 4 + [0.5] * 4
    assert mix(half_slow, 2) == [1.0, 0.5] and mix(half_slow, 4) == [1.0, 1.0, 0.5, 0.5]
    assert mix(half_slow, 8) == half_slow and mix(None, 3) is None


def test_the_output_says_what_is_modelled(node_profile, capsys):
    argv = ["run", "--profile", node_profile, "--model", "simplemlp", "--global_batch_size", "256", "--replicas",
            "8", "--steps", "10", "--speed_factors", "1,1,1,1,2,2,2,2"]
    assert main([*argv, "--sweep", "auto"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "pydtnn-simulate: 8 replica(s) of simplemlp, global batch 256, 10 steps, policy equal", out
    assert lines[1].startswith("modelled: 8 replica(s) on 4 node(s) of 2 rank(s) (default: the profiled node holds 2"), out
    assert "sweep: each P on nodes of the default ranks per node" in out and "--speed_factors of replica" in out
    assert main([*argv, "--ranks_per_node", "4", "--sweep", "auto", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["nodes"], doc["ranks_per_node"]) == (2, 4) and "--ranks_per_node 4" in doc["layout"]
    assert [(r["replicas"], r["nodes"]) for r in doc["sweep"]["equal"]] == [(4, 1), (8, 2)]


def test_outputs_are_checked_before_any_work(node_profile, tmp_path, capsys, monkeypatch):
    run = ["run", "--profile", node_profile, "--global_batch_size", "64", "--replicas", "4", "--steps", "5"]
    for extra, message in ((["--sweep", "auto", "--plot", str(tmp_path / "no" / "s.png")], "--plot"),
                           (["--plot", str(tmp_path / "s.png")], "--plot draws the sweep: give --sweep")):
        assert main([*run, *extra]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and message in err[0], err
    (tmp_path / "a_file").write_text("")
    measured = []
    monkeypatch.setattr(calibrate, "calibrate", lambda *a, **k: measured.append(1))
    for out in (tmp_path / "no" / "p.json", tmp_path / "a_file" / "p.json", tmp_path):
        assert main(["calibrate", "--model", "simplemlp", "--out", str(out)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"pydtnn: error: --out {out}"), err
    assert measured == []                      # refused before the ~60 s measurement was started
