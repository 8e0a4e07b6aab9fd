"""The step model against hand-computed timelines (two replicas, two layers)."""
import numpy as np
import pytest

from pydtnn.sim.collectives import allreduce_seconds
from pydtnn.sim.profile import Network, Profile
from pydtnn.sim.step_model import Collective, StepModel

NET = Network(1e-5, 1e-9, 1e-10)
STATS = allreduce_seconds("ring", 8 * (2 + 8), 2, *NET.as_tuple())     # the trainer's per-step stats reduction


def _profile(bn=(0, 0)):
    # per-sample times (one batch point: proportional to b): layer 0 fwd 1 ms bwd 2 ms, layer 1 fwd 3 ms bwd 4 ms
    return Profile(model="t", batch_points=[1], layer_names=["a", "b"], layer_types=["FC", "BatchNormalization"],
                   param_bytes=np.array([3 << 20, 1 << 20]), bn_channels=np.array(bn),
                   forward_s=np.array([[1e-3], [3e-3]]), backward_s=np.array([[2e-3], [4e-3]]), network=NET,
                   update_s=5e-4)


def test_blocking_step_is_slowest_compute_plus_allreduce_plus_update():
    m = StepModel([_profile()] * 2, [1, 2], Collective("ring", 2, NET))
    t, compute, wait = m.step(np.array([1.0, 1.0]))
    full = allreduce_seconds("ring", 4 << 20, 2, *NET.as_tuple())
    assert compute == pytest.approx([10e-3, 20e-3], rel=1e-12)
    assert t == pytest.approx(20e-3 + full + 5e-4 + STATS, rel=1e-12)
    assert wait == pytest.approx([10e-3 + full, full], rel=1e-12)


def test_overlapped_buckets_start_when_their_layer_is_done_everywhere():
    # 1 MiB buckets from the end: bucket 0 = layer 1's gradients, ready after layer 1's backward on the
    # slower replica (b=2: 2*(1+3) + 2*4 = 16 ms); buckets 1..3 = layer 0's, ready at 20 ms
    # (across two nodes, one replica each: the network moves a bucket while backward goes on)
    m = StepModel([_profile()] * 2, [1, 2], Collective("ring", 2, NET, nodes=2), non_blocking=True)
    t, compute, _ = m.step(np.array([1.0, 1.0]))
    one = allreduce_seconds("ring", 1 << 20, 2, *NET.as_tuple())
    c = max(16e-3 + one, 20e-3) + 3 * one
    assert t == pytest.approx(c + 5e-4 + STATS, rel=1e-12)


def test_buckets_on_one_node_follow_the_slowest_backward():
    # shared memory: the ranks' own cores move the buckets, after their backward; 4 buckets, 4 latencies
    m = StepModel([_profile()] * 2, [1, 2], Collective("ring", 2, NET), non_blocking=True)
    t, _, _ = m.step(np.array([1.0, 1.0]))
    one = allreduce_seconds("ring", 1 << 20, 2, *NET.as_tuple())
    assert t == pytest.approx(20e-3 + 4 * one + 5e-4 + STATS, rel=1e-12)


def test_sync_batchnorm_barriers_take_each_segments_slowest():
    # replica 0 is 3x slower (factor), replica 1 has twice the batch: segment maxima, not one max of sums
    m = StepModel([_profile(bn=(0, 16))] * 2, [1, 2], Collective("ring", 2, NET), sync_bn=True)
    t, compute, _ = m.step(np.array([3.0, 1.0]))
    small_f = allreduce_seconds("ring", (2 * 16 + 1) * 8, 2, *NET.as_tuple())
    small_b = allreduce_seconds("ring", 2 * 16 * 8, 2, *NET.as_tuple())
    # forward to the BN's end: max(3*4, 2*4) = 12 ms; its backward: max(3*4, 2*4) = 12 ms; then layer 0's
    # backward: replica 0 3*2 = 6 ms, replica 1 2*2 = 4 ms
    g = 12e-3 + small_f + 12e-3 + small_b
    assert compute == pytest.approx([g + 6e-3, g + 4e-3], rel=1e-12)
    full = allreduce_seconds("ring", 4 << 20, 2, *NET.as_tuple())
    assert t == pytest.approx(g + 6e-3 + full + 5e-4 + STATS, rel=1e-12)


def test_emulated_speeds_pad_to_the_reference_deadline():
    # factors 1 and 0.5: replica 1 waits until b * (per-sample time of replica 0) * 2
    m = StepModel([_profile()] * 2, [2, 2], Collective("ring", 2, NET), emulate=[1.0, 2.0])
    _, compute, _ = m.step(np.ones(2))
    assert compute == pytest.approx([20e-3, 40e-3], rel=1e-12)


def test_launcher_overhead_delays_each_replica_before_the_reduction():
    prof = _profile()
    prof.step_overhead_s = (1e-3, 4e-3)                  # o0 + o1 * b: 5 ms at b=1, 9 ms at b=2
    m = StepModel([prof] * 2, [1, 2], Collective("ring", 2, NET))
    t, compute, wait = m.step(np.array([2.5, 1.0]))      # compute 25 ms and 20 ms
    full = allreduce_seconds("ring", 4 << 20, 2, *NET.as_tuple())
    assert compute == pytest.approx([25e-3, 20e-3], rel=1e-12)
    assert t == pytest.approx(max(25e-3 + 5e-3, 20e-3 + 9e-3) + full + 5e-4 + STATS, rel=1e-12)
    assert wait == pytest.approx([full, 1e-3 + full], rel=1e-9)


def test_contention_slows_each_replicas_local_work_by_its_factor():
    prof = _profile()
    prof.step_overhead_s = (1e-3, 0.0)
    m = StepModel([prof] * 2, [1, 2], Collective("ring", 2, NET), contention=[2.0, 1.5])
    t, compute, _ = m.step(np.ones(2))
    full = allreduce_seconds("ring", 4 << 20, 2, *NET.as_tuple())
    # compute 10 and 20 ms alone -> 20 and 30 ms; overhead 1 ms -> 2 and 1.5 ms; the update at the slowest factor
    assert compute == pytest.approx([20e-3, 30e-3], rel=1e-12)
    assert t == pytest.approx(max(20e-3 + 2e-3, 30e-3 + 1.5e-3) + full + 2.0 * 5e-4 + STATS, rel=1e-12)


def test_contention_factor_between_and_beyond_the_measured_counts():
    prof = _profile()
    assert prof.contention_factor(7) == 1.0                       # unmeasured: no contention
    prof.cores, prof.contention = 4, {1: 1.0, 2: 1.2, 4: 1.6, 5: 2.5}
    assert prof.contention_factor(3) == pytest.approx(1.4, rel=1e-12)   # linear between 2 and 4
    assert prof.contention_factor(10) == pytest.approx(2.5 * 10 / 5, rel=1e-12)  # time-slicing beyond
    prof.contention = {1: 1.0, 2: 1.2}                            # measured up to 2 of 4 cores
    assert prof.contention_factor(4) == pytest.approx(1.2, rel=1e-12)
    assert prof.contention_factor(8) == pytest.approx(1.2 * 8 / 4, rel=1e-12)
    prof.threads_per_replica = 2                                  # 2 slots of 2 threads on 4 cores
    assert prof.replica_slots == 2 and prof.contention_factor(3) == pytest.approx(1.2 * 3 / 2, rel=1e-12)


def test_oversubscribed_network_only_when_ranks_outnumber_the_slots():
    prof = _profile()
    over = Network(1e-3, 1e-8, 1e-9)
    prof.network_oversubscribed = over
    assert prof.network_for(3) is NET                             # cores unknown: the one network
    prof.cores = 2
    assert prof.network_for(2) is NET and prof.network_for(3) is over


def test_engine_applies_the_node_rank_count():
    from pydtnn.sim.engine import Scenario, simulate
    prof = _profile()
    prof.cores, prof.contention = 2, {1: 1.0, 2: 1.25, 3: 2.0}
    one_node = simulate(Scenario(profiles=[prof] * 4, global_batch=4, steps=1, nodes=1))
    two_nodes = simulate(Scenario(profiles=[prof] * 4, global_batch=4, steps=1, nodes=2))
    # b = 1 each: 10 ms alone; 4 ranks on 2 cores -> 2.0 * 4 / 3; 2 ranks per node -> 1.25
    assert one_node.compute_s == pytest.approx([10e-3 * 2.0 * 4 / 3] * 4, rel=1e-12)
    assert two_nodes.compute_s == pytest.approx([10e-3 * 1.25] * 4, rel=1e-12)


def test_an_emulated_replica_sleeping_to_its_deadline_leaves_its_core_to_the_others():
    from pydtnn.sim.engine import Scenario, simulate
    prof = _profile()
    prof.contention = {1: 1.0, 2: 1.25, 3: 2.0}
    common = dict(global_batch=3, steps=1, speed_factors=[1.0, 1.0, 0.5])
    # 3 ranks on 2 cores: the emulator sleeps. At k = 3 (factor 2) compute is 20 ms each and the half-speed
    # replica's deadline 40 ms, so it works half its step: 2.5 ranks at work -> factor 1.625 (between 1.25
    # and 2), compute 16.25 ms, deadline 32.5 ms
    prof.cores = 2
    got = simulate(Scenario(profiles=[prof] * 3, **common)).compute_s
    assert got == pytest.approx([16.25e-3, 16.25e-3, 32.5e-3], rel=1e-12)
    # 3 ranks on 4 cores: the emulator spins, every rank keeps its core busy: factor 2 at k = 3
    prof.cores = 4
    got = simulate(Scenario(profiles=[prof] * 3, **common)).compute_s
    assert got == pytest.approx([20e-3, 20e-3, 40e-3], rel=1e-12)
