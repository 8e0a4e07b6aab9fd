"""Balancing policies and gradient weightings as plug-ins (pydtnn.parallel.balance.policies / weighting, pydtnn.plugins)."""
import os
import subprocess
import sys

import numpy as np
import pytest

from pydtnn import Model
from pydtnn.errors import CheckpointError, ConfigError
from pydtnn.layers import FC, Input
from pydtnn.optimizers import SGD
from pydtnn.parallel.balance import check_split
from pydtnn.parallel.balance.proportional import partition
from pydtnn.parallel.balance.policies import DynamicPolicy, EqualPolicy, FPMPolicy, ProbePolicy, StaticPolicy, make_policy
from pydtnn.parallel.weighting import make_weighting
from pydtnn.plugins import USER_FRAMES
from pydtnn.training.loop import Trainer
from pydtnn.datasets import from_arrays

from paths import REPO_DIR as REPO  # noqa: E402

POLICY_FILE = '''
from pydtnn.parallel.balance import BalancePolicy

class Halves(BalancePolicy):
    """Starts equal; after every step re-splits so that replica 0 holds one sample more (a toy)."""
    def __init__(self):
        self.steps_seen = 0

    def initial_sizes(self, global_batch, nreplicas, caps):
        return [global_batch // nreplicas + (r < global_batch % nreplicas) for r in range(nreplicas)]

    def after_step(self, step, seconds_per_sample):
        self.steps_seen += 1
        return None

    def state_dict(self):
        return {"steps_seen": self.steps_seen}

    def load_state_dict(self, state):
        self.steps_seen = int(state["steps_seen"])

class Bad(BalancePolicy):
    def after_step(self, step, seconds_per_sample):
        return [self.sizes[0] + 1]

class NotAPolicy:
    pass

class NeedsArgs(BalancePolicy):
    def __init__(self, speed):
        pass
'''


@pytest.fixture
def plugin_dir(tmp_path):
    (tmp_path / "my_policy.py").write_text(POLICY_FILE)
    (tmp_path / "my_weights.py").write_text("def weights(sizes):\n    return [0.5] * len(sizes)\n"
                                            "def broken(sizes):\n    return [1.0]\n")
    (tmp_path / "syntax.py").write_text("def (:\n")
    (tmp_path / "raises.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    return tmp_path


def test_built_in_names():
    assert isinstance(make_policy("none"), EqualPolicy) and isinstance(make_policy("equal"), EqualPolicy)
    assert isinstance(make_policy("static", speeds=[1, 2]), StaticPolicy)
    assert isinstance(make_policy("static"), FPMPolicy) and isinstance(make_policy("fpm"), FPMPolicy)
    assert isinstance(make_policy("probe"), ProbePolicy)
    assert isinstance(make_policy("dynamic", interval=3), DynamicPolicy)
    assert make_policy("static", speeds=[1, 2, 3]).initial_sizes(60, 3, None) == [10, 20, 30]
    assert EqualPolicy().initial_sizes(7, 3, [2, 3, 3]) == partition(7, [1, 1, 1], [2, 3, 3]) == [2, 3, 2]
    assert ProbePolicy().probed(60, [1.0, 1.0, 4.0], None) == [10, 10, 40]
    dyn = make_policy("dynamic", interval=1)
    dyn.bind(0, 3)
    dyn.sizes = dyn.initial_sizes(60, 3, None)
    assert dyn.sizes == [20, 20, 20]
    # a plain list of seconds per sample (the interface's older form): one point per replica, the constant
    # model, whose equal finish times split in proportion to 1 / seconds per sample
    assert dyn.after_step(0, [3.0, 2.0, 1.0]) == partition(60, [1 / 3, 1 / 2, 1.0])
    with pytest.raises(ConfigError, match="--balance must be one of"):
        make_policy("fastest")
    with pytest.raises(ConfigError, match="--balance_options hysteresis: --balance fpm takes points"):
        make_policy("fpm", options={"hysteresis": 0.1})
    with pytest.raises(ConfigError, match="--balance_options points=2: must be >= 4"):
        make_policy("dynamic", options={"points": 2})


def test_user_policy_from_a_file_and_a_module(plugin_dir):
    p = make_policy(f"{plugin_dir}/my_policy.py:Halves")
    assert p.initial_sizes(7, 2, None) == [4, 3] and p.name == "Halves"
    assert isinstance(make_policy("pydtnn.parallel.balance.policies:EqualPolicy"), EqualPolicy)


@pytest.mark.parametrize("spec, needle", [
    ("{d}/missing.py:X", "does not exist"),
    ("{d}/syntax.py:X", "failed to load (line 1): SyntaxError"),
    ("{d}/raises.py:X", "failed to load: RuntimeError: boom"),
    ("{d}/my_policy.py:Nope", "defines no Nope"),
    ("{d}/my_policy.py:NotAPolicy", "expected a subclass of pydtnn.parallel.balance.BalancePolicy"),
    ("{d}/my_policy.py:NeedsArgs", "NeedsArgs() failed: TypeError"),
    ("no_such_module_xyz:Policy", "cannot import no_such_module_xyz"),
    ("{d}/my_policy.py:", "expected FILE.py:NAME or module:NAME"),
])
def test_every_plugin_failure_is_one_line(plugin_dir, spec, needle):
    with pytest.raises(ConfigError) as e:
        make_policy(spec.format(d=plugin_dir))
    first, *frames = str(e.value).splitlines()
    assert needle in first and "--balance" in first, str(e.value)
    # what the user's own code raised is followed by its frames, and by nothing else
    assert len(frames) <= 2 * USER_FRAMES and all(f.startswith(("  File ", "    ")) for f in frames), frames
    assert bool(frames) == (needle in ("failed to load (line 1): SyntaxError", "failed to load: RuntimeError: boom")), \
        frames


@pytest.mark.parametrize("sizes, why", [
    ([20, 20, 19], "sums to 59, not to the global batch 60"),
    ([0, 30, 30], "at least one sample"),
    ([20, 40], "not a list of 3 integers"),
    ([20.5, 19.5, 20], "not a list of 3 integers"),
    ([10, 20, 30], "exceeds the local batch caps [25, 25, 25]"),
    ("abc", "not a list of 3 integers"),
])
def test_a_bad_split_is_one_line_naming_the_policy(sizes, why):
    caps = [25, 25, 25] if why.startswith("exceeds") else None
    with pytest.raises(ConfigError, match="balance policy mine returned") as e:
        check_split(sizes, 60, 3, caps, "balance policy mine")
    assert why in str(e.value)
    assert check_split([20, 20, 20], 60, 3, [25, 25, 25]) == [20, 20, 20]


def _model():
    m = Model(dtype="float64", seed=0)
    m.add(Input(shape=(4,)))
    m.add(FC(shape=(3,), activation="softmax"))
    return m


def _data(n=24):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 4))
    return from_arrays(x, np.eye(3)[rng.integers(0, 3, n)])


def _trainer(policy, **kw):
    return Trainer(_model(), _data(), SGD(learning_rate=0.1), global_batch=8, policy=policy, progress=False,
                   log=lambda m: None, **kw)


def test_the_trainer_checks_every_split_a_policy_returns(plugin_dir):
    t = _trainer(f"{plugin_dir}/my_policy.py:Bad")
    with pytest.raises(ConfigError, match=r"balance policy Bad returned the split \[9\]: it sums to 9"):
        t.fit(1)


def test_policy_state_goes_into_checkpoints_and_comes_back(plugin_dir, tmp_path):
    spec = f"{plugin_dir}/my_policy.py:Halves"
    t = _trainer(spec)
    t.fit(1)                                              # 24 samples, batch 8: 3 steps
    assert t.policy.steps_seen == 3
    t.save_checkpoint(tmp_path / "c.npz", 1)
    u = _trainer(spec)
    u.resume(tmp_path / "c.npz")
    assert u.policy.steps_seen == 3 and u.restored_split and u.sizes == [8]
    (tmp_path / "bad.py").write_text(POLICY_FILE.replace('int(state["steps_seen"])', 'int(state["nope"])'))
    with pytest.raises(CheckpointError, match="metadata field 'balance_policy_state'"):
        _trainer(f"{tmp_path}/bad.py:Halves").resume(tmp_path / "c.npz")


def test_gradient_weighting_plugins(plugin_dir):
    assert make_weighting("proportional")([10, 20, 30]) == [10 / 60, 20 / 60, 30 / 60]
    assert make_weighting("uniform")([10, 20, 30]) == [1 / 3] * 3
    assert make_weighting(f"{plugin_dir}/my_weights.py:weights")([1, 2]) == [0.5, 0.5]
    with pytest.raises(ConfigError, match=r"returned \[1.0\] for sizes \[1, 2\]: expected a list of 2 finite numbers"):
        make_weighting(f"{plugin_dir}/my_weights.py:broken")([1, 2])
    with pytest.raises(ConfigError, match="--gradient_weighting .* defines no nothing"):
        make_weighting(f"{plugin_dir}/my_weights.py:nothing")
    with pytest.raises(ConfigError, match="must be one of proportional, uniform"):
        make_weighting("harmonic")


def test_a_weighting_scales_the_step(plugin_dir):
    """One process: a weighting of 0.5 takes exactly half the proportional step (SGD without momentum)."""
    a = Trainer(_model(), _data(8), SGD(learning_rate=0.1, momentum=0.0), global_batch=8, progress=False,
                log=lambda m: None)
    b = Trainer(_model(), _data(8), SGD(learning_rate=0.1, momentum=0.0), global_batch=8, progress=False,
                log=lambda m: None, gradient_weighting=f"{plugin_dir}/my_weights.py:weights")
    p0 = a.model.params.copy()
    a.fit(1), b.fit(1)
    # the halved step is exact in binary: the two deltas differ by rounding of p0 + delta only
    assert np.abs((b.model.params - p0) - 0.5 * (a.model.params - p0)).max() <= 4 * np.finfo(np.float64).eps * \
        np.abs(p0).max()
    assert np.abs(a.model.params - p0).max() > 1e-6


def _launch(*args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.run([sys.executable, os.path.join(REPO, "scripts", "pydtnn_benchmark.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_launcher_takes_a_user_policy_and_refuses_a_bad_one_before_work(plugin_dir):
    fast = ["--model", "simplemlp", "--synthetic_samples", "64", "--batch_size", "16", "--progress_bar", "false",
            "--lr_schedulers", "", "--parallel", "data"]
    r = _launch(*fast, "--balance", "my_policy.py:Halves", "--gradient_weighting", "my_weights.py:weights",
                cwd=plugin_dir)
    assert r.returncode == 0, r.stderr
    assert "split as [16] (balance my_policy.py:Halves, weighting my_weights.py:weights)" in r.stdout
    r = _launch(*fast, "--balance", "my_policy.py:NotAPolicy", cwd=plugin_dir)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "expected a subclass" in lines[0] and r.stdout == "", r.stderr
