"""The simulator's --grad_compression: the gradient's modelled bytes halved (a float32 profile), the casts
costed as memory passes, and said in the printed header."""
import json

import pytest

from pydtnn.sim.__main__ import main
from pydtnn.sim.collectives import allreduce_seconds
from pydtnn.sim.roofline import roofline_profile

RUN = ["run", "--model", "simplemlp", "--global_batch_size", "256", "--replicas", "8", "--ranks_per_node", "2",
       "--network_alg", "ring", "--steps", "3"]
GRAD = 2678824                  # simplemlp's float32 gradient bytes


@pytest.fixture(scope="module")
def node_profile(tmp_path_factory):
    prof = roofline_profile("simplemlp", network_bw=80e9, network_lat=1e-6)
    prof.network_inter, prof.network_inter_source = None, ""       # between nodes: the default 1 Gb/s link
    path = tmp_path_factory.mktemp("net") / "node.json"
    prof.save(str(path))
    return str(path), prof


def _doc(capsys, argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("overlapped", [False, True])
def test_compression_changes_the_step_by_the_allreduce_of_half_the_bytes_less_the_casts(node_profile, capsys, fmt,
                                                                                       overlapped):
    """8 ranks, 4 nodes, a flat ring over the 1 Gb/s links between nodes: the step is shorter by the ring's time
    for the gradient's bytes less its time for half of them, less the casts (update_s x 2 (d + 2) / (5 d) =
    0.6 update_s for float32); the overlapped reduction's buckets are bound by the network here (each takes longer on
    the 1 Gb/s links than the backward between two of them), so their chain is shorter by the sum of their
    differences. The statistics' reduction and the compute do not change."""
    path, prof = node_profile
    extra = ["--non_blocking_mpi", "true", "--bucket_bytes", str(GRAD // 4)] if overlapped else []
    base = _doc(capsys, [*RUN, "--profile", path, *extra])
    half = _doc(capsys, [*RUN, "--profile", path, *extra, "--grad_compression", fmt])
    assert (base["grad_compression"], half["grad_compression"]) == ("none", fmt)

    def ring(n):
        return allreduce_seconds("ring", n, 8, 0.5e-6, 8e-9, 6e-11)
    if overlapped:     # 4 equal buckets (GRAD is a multiple of 4)
        saved = 4 * (ring(GRAD / 4) - ring(GRAD / 8))
    else:
        saved = ring(GRAD) - ring(GRAD / 2)
    assert prof.dtype_bytes == 4
    assert base["step_seconds"] - half["step_seconds"] == pytest.approx(saved - 0.6 * prof.update_s, rel=1e-9)


def test_the_header_says_the_gradients_are_compressed(node_profile, capsys):
    assert main([*RUN, "--profile", node_profile[0], "--grad_compression", "fp16"]) == 0
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert "policy equal, gradients sent in fp16 (2 bytes an element, plus the casts)" in said, said
    assert main([*RUN, "--profile", node_profile[0]]) == 0
    captured = capsys.readouterr()
    assert "gradients sent in" not in captured.out + captured.err


def test_an_unknown_format_is_one_line(node_profile, capsys):
    assert main([*RUN, "--profile", node_profile[0], "--grad_compression", "fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pydtnn") and "--grad_compression" in err[0], err
