"""The simulator's policy decisions are the trainer's: the same timing sequence, fed the way
Trainer.train_epoch feeds pydtnn.parallel.balance, gives the same splits at the same steps."""
import numpy as np

from pydtnn.parallel import balance
from pydtnn.sim.engine import Scenario, simulate
from pydtnn.sim.policies import make_policy
from pydtnn.sim.profile import Network, Profile
from pydtnn.sim.variability import Stragglers


def _profile(L=6):
    return Profile(model="toy", batch_points=[1, 16, 64], layer_names=[f"l{i}" for i in range(L)],
                   layer_types=["FC"] * L, param_bytes=np.full(L, 40000), bn_channels=np.zeros(L, int),
                   forward_s=np.tile([1e-4, 6e-4, 2e-3], (L, 1)), backward_s=np.tile([2e-4, 1.2e-3, 4e-3], (L, 1)),
                   network=Network(5e-6, 1e-9, 2e-10), update_s=1e-4)


def _trainer_decisions(seq, global_batch, P, interval):
    """What Trainer does: DynamicBalancer(B, P, interval, initial equal split), then per step
    observe(times) and maybe_rebalance(global_step); a returned split replaces self.sizes."""
    bal = balance.DynamicBalancer(global_batch, P, interval=interval,
                                  initial_sizes=balance.partition(global_batch, [1] * P))
    out = []
    for step, times in enumerate(seq):
        if bal.observe(times):
            new = bal.maybe_rebalance(step)
            if new is not None:
                out.append((step, new))
    return out


def test_dynamic_policy_replays_the_trainers_decisions():
    rng = np.random.default_rng(3)
    P, B, interval = 5, 100, 10
    speed = np.array([1.0, 1.0, 2.0, 0.5, 1.5])
    seq = [(1e-3 / speed) * np.exp(0.05 * rng.standard_normal(P)) for _ in range(120)]
    seq[37][2] = 0.0                      # an observation the trainer ignores (non-positive entry)
    policy = make_policy("dynamic", rebalance_interval=interval)
    policy.initial_sizes(B, P, None)
    sim = [(s, new) for s, t in enumerate(seq) if (new := policy.after_step(s, t)) is not None]
    assert sim == _trainer_decisions(seq, B, P, interval)
    assert len(sim) >= 1                  # the sequence does make it re-split


def test_engine_decisions_equal_the_trainers_on_its_own_timing_sequence(monkeypatch):
    """Record what the engine hands the policy, replay it into the trainer's calls: same splits."""
    from pydtnn.parallel import policies
    seen, decided = [], []
    original = policies.DynamicPolicy.after_step

    def spy(self, step, seconds_per_sample):
        seen.append(np.array(seconds_per_sample))
        new = original(self, step, seconds_per_sample)
        if new is not None:
            decided.append((step, list(new)))
        return new
    monkeypatch.setattr(policies.DynamicPolicy, "after_step", spy)
    sc = Scenario([_profile()] * 6, 120, policy="dynamic", speed_factors=[1, 1, 2, 2, 4, 4], noise=0.03,
                  stragglers=Stragglers(1, 3.0, 40), steps=160, rebalance_interval=10, seed=1)
    res = simulate(sc)
    assert decided == _trainer_decisions(seen, 120, 6, 10)
    assert res.sizes == (decided[-1][1] if decided else balance.partition(120, [1] * 6))


def test_static_and_probe_use_the_partition():
    assert make_policy("static", [1, 2, 3]).initial_sizes(60, 3, None) == balance.partition(60, [1, 2, 3])
    probe = make_policy("probe")
    assert probe.wants_probe and probe.initial_sizes(60, 3, None) == [20, 20, 20]
    assert probe.probed(60, [3.0, 1.0, 2.0], None) == balance.partition(60, [3.0, 1.0, 2.0])
    assert make_policy("none").initial_sizes(7, 2, None) == balance.partition(7, [1, 1])


def test_the_probe_splits_by_the_speeds_of_the_compute_model():
    sc = Scenario([_profile()] * 3, 60, policy="probe", speed_factors=[1, 2, 4], steps=5, seed=0)
    res = simulate(sc)
    # the emulated factors make replica i (4/f_i) times slower per sample: speeds 1:2:4
    assert res.sizes == balance.partition(60, [1.0, 2.0, 4.0]) and res.rebalances == 1


USER_POLICY = """
from pydtnn.parallel.balance import BalancePolicy

class LopSided(BalancePolicy):
    def initial_sizes(self, global_batch, nreplicas, caps):
        return [global_batch - nreplicas + 1] + [1] * (nreplicas - 1)

    def after_step(self, step, seconds_per_sample):
        return [1] * len(seconds_per_sample) if step == 2 else None     # a bad split: it does not sum to B
"""


def test_a_users_policy_file_runs_in_the_simulator_and_its_bad_split_is_one_line(tmp_path):
    import pytest
    from pydtnn.errors import ConfigError
    path = tmp_path / "lopsided.py"
    path.write_text(USER_POLICY)
    ok = simulate(Scenario([_profile()] * 3, 30, policy=f"{path}:LopSided", steps=2, seed=0))
    assert ok.sizes == [28, 1, 1]
    with pytest.raises(ConfigError) as err:
        simulate(Scenario([_profile()] * 3, 30, policy=f"{path}:LopSided", steps=4, seed=0))
    assert "LopSided" in str(err.value) and "\n" not in str(err.value)
