"""The simulator's policy decisions are the trainer's: the same reports, fed the way the trainer's engine
(DataParallel.after_step) feeds a policy, give the same splits at the same steps."""
import numpy as np

from pydtnn.parallel.balance import proportional
from pydtnn.parallel.comm import SerialComm
from pydtnn.sim.engine import Scenario, simulate
from pydtnn.sim.policies import make_policy
from pydtnn.sim.profile import Network, Profile
from pydtnn.sim.variability import Stragglers


def _profile(L=6):
    return Profile(model="toy", batch_points=[1, 16, 64], layer_names=[f"l{i}" for i in range(L)],
                   layer_types=["FC"] * L, param_bytes=np.full(L, 40000), bn_channels=np.zeros(L, int),
                   forward_s=np.tile([1e-4, 6e-4, 2e-3], (L, 1)), backward_s=np.tile([2e-4, 1.2e-3, 4e-3], (L, 1)),
                   network=Network(5e-6, 1e-9, 2e-10), update_s=1e-4)


class RankOfP(SerialComm):
    """Rank 0 of `size` for DataParallel's split arithmetic (construction only broadcasts, a no-op here)."""
    def __init__(self, size):
        super().__init__()
        self._size = size

    size = property(lambda self: self._size)


def _trainer_decisions(reports, state, global_batch, P, interval):
    """What the Trainer does with the same reports: DataParallel.after_step(step, report) on a dynamic policy
    that starts from the same state (the probe's model); the splits it adopts, with the step."""
    from pydtnn import Model
    from pydtnn.layers import FC, Input
    from pydtnn.optimizers import SGD
    from pydtnn.parallel import DataParallel
    m = Model(dtype="float64", seed=0)
    m.add(Input(shape=(2,)))
    m.add(FC(shape=(3,), activation="softmax"))
    dp = DataParallel(m, SGD(), global_batch=global_batch, comm=RankOfP(P),
                      policy=make_policy("dynamic", rebalance_interval=interval), log=lambda line: None)
    dp.policy.load_state_dict(state)
    dp.adopt(reports[0].sizes)
    out = []
    for step, report in enumerate(reports):
        before = list(dp.sizes)
        dp.after_step(step, report, report.sizes)
        if dp.sizes != before:
            out.append((step, list(dp.sizes)))
    return out


def test_engine_decisions_equal_the_trainers_on_its_own_reports(monkeypatch):
    """Record the reports the engine hands the dynamic policy (after its probe), replay them through the
    trainer's engine (DataParallel.after_step): the same splits at the same steps."""
    from pydtnn.parallel.balance import policies
    seen, decided, state = [], [], {}
    after, probe = policies.DynamicPolicy.after_step, policies.DynamicPolicy.probe_costs

    def spy(self, step, report):
        seen.append(report)
        new = after(self, step, report)
        if new is not None:
            decided.append((step, list(new)))
        return new

    def spy_probe(self, p):
        new = probe(self, p)
        state.update(self.state_dict())
        return new
    monkeypatch.setattr(policies.DynamicPolicy, "after_step", spy)
    monkeypatch.setattr(policies.DynamicPolicy, "probe_costs", spy_probe)
    sc = Scenario([_profile()] * 6, 120, policy="dynamic", speed_factors=[1, 1, 2, 2, 4, 4], noise=0.03,
                  stragglers=Stragglers(1, 3.0, 40), steps=160, rebalance_interval=10, seed=1)
    res = simulate(sc)
    monkeypatch.undo()                                                 # the replay calls the policy itself
    assert state["model"] is not None and len(decided) >= 1           # the stragglers do make it re-split
    assert decided == _trainer_decisions(seen, state, 120, 6, 10)
    assert res.sizes == decided[-1][1]


def test_static_and_probe_use_the_partition():
    assert make_policy("static", [1, 2, 3]).initial_sizes(60, 3, None) == proportional.partition(60, [1, 2, 3])
    probe = make_policy("probe")
    assert probe.wants_probe and probe.initial_sizes(60, 3, None) == [20, 20, 20]
    assert probe.probed(60, [3.0, 1.0, 2.0], None) == proportional.partition(60, [3.0, 1.0, 2.0])
    assert make_policy("none").initial_sizes(7, 2, None) == proportional.partition(7, [1, 1])


def test_the_probe_splits_by_the_speeds_of_the_compute_model():
    sc = Scenario([_profile()] * 3, 60, policy="probe", speed_factors=[1, 2, 4], steps=5, seed=0)
    res = simulate(sc)
    # the emulated factors make replica i (4/f_i) times slower per sample: speeds 1:2:4
    assert res.sizes == proportional.partition(60, [1.0, 2.0, 4.0])
    # the probe's split is the first split, not a re-split during training
    assert res.rebalances == 0 and res.extra["first_split"] == "probe"


def test_the_static_fpm_policy_never_rebalances():
    """fpm probes once, before training, and keeps its split: 0 rebalances (it had said 1: its probe's split)."""
    sc = Scenario([_profile()] * 3, 60, policy="fpm", speed_factors=[1, 2, 4], noise=0.1, steps=40, seed=0)
    res = simulate(sc)
    assert res.sizes != [20, 20, 20] and res.extra["first_split"] == "probe"
    assert res.rebalances == 0
    dyn = simulate(Scenario([_profile()] * 3, 60, policy="dynamic", speed_factors=[1, 2, 4], rebalance_interval=5,
                            stragglers=Stragglers(1, 3.0, 10), steps=40, seed=0))
    assert dyn.rebalances >= 1                                 # a policy that does re-split is counted


USER_POLICY = """
from pydtnn.parallel.balance import BalancePolicy

class LopSided(BalancePolicy):
    def initial_sizes(self, global_batch, nreplicas, caps):
        return [global_batch - nreplicas + 1] + [1] * (nreplicas - 1)

    def after_step(self, step, report):
        return [1] * len(report) if step == 2 else None     # a bad split: it does not sum to B
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


def test_the_simulator_takes_a_runs_cost_model(tmp_path):
    """--cost_model: each replica's compute is the run's t_i(b) (whatever the profile says), and fpm's probe of
    the step model finds its equal-finish split: one model, in one place."""
    from pydtnn.parallel.balance.cost_model import CostModel
    from pydtnn.parallel.balance.fpm_partition import equal_finish
    model = CostModel.affine([0.040, 0.0, 0.0], [1e-4, 1.5e-3, 1.5e-3], ["gpu", "cpu", "cpu"])
    res = simulate(Scenario([_profile()] * 3, 256, policy="fpm", balance_options={"bucket": 1}, cost_model=model,
                            devices=["gpu", "cpu", "cpu"], steps=3, seed=0))
    assert res.sizes == equal_finish(256, model) == [180, 38, 38]
    assert np.allclose(res.compute_s, model.seconds(res.sizes), rtol=1e-12)


def test_the_cost_model_flag_reads_json_and_checkpoints(tmp_path, capsys):
    import json
    import subprocess
    import sys
    from pydtnn.parallel.balance.cost_model import CostModel
    from pydtnn.sim.__main__ import main
    state = dict(CostModel.affine([0.040, 0.0], [1e-4, 1.5e-3]).state_dict(), model="simplemlp",
                 gradient_bytes=2678824)             # simplemlp's 669,706 float32 parameters
    (tmp_path / "m.json").write_text(json.dumps(state))
    args = ["run", "--model", "simplemlp", "--global_batch_size", "128", "--replicas", "2", "--steps", "2",
            "--balance", "fpm", "--json"]
    assert main([*args, "--cost_model", str(tmp_path / "m.json")]) == 0
    assert json.loads(capsys.readouterr().out)["sizes"] == [95, 33]     # 40 + 0.1 b0 = 1.5 b1, b0 + b1 = 128
    # a run's checkpoint (one replica, fpm): its probed model
    run = subprocess.run([sys.executable, "scripts/pydtnn_benchmark.py", "--model", "simplemlp", "--parallel", "data",
                          "--balance", "fpm", "--synthetic_samples", "128", "--global_batch_size", "32",
                          "--progress_bar", "false", "--lr_schedulers", "model_checkpoint", "--model_checkpoint_metric",
                          "loss", "--model_checkpoint_save_freq", "1", "--checkpoint_dir", str(tmp_path / "c")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert main([*args, "--cost_model", str(tmp_path / "c" / "epoch_0001.npz")]) == 0
    assert sum(json.loads(capsys.readouterr().out)["sizes"]) == 128
    assert main([*args, "--cost_model", str(tmp_path / "m.npz")]) == 2
    assert "pydtnn: error:" in capsys.readouterr().err
