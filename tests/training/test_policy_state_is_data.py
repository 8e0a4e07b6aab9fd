"""A checkpoint's balance-policy state is data (issue 46): the fpm and dynamic policies' stored cost model, window
and counters are checked for type, finiteness and range before anything is restored, and a problem is one line
naming the checkpoint and the field (a list or a string where an object is due, an infinite or 10^300 batch in a
point, a device "tpu" once gave tracebacks or were taken silently)."""
import copy
import json

import numpy as np
import pytest

from mpi_helpers import REPO_ROOT, describe, output_of_our_processes, run_mpi  # noqa: E402

from pydtnn.errors import CheckpointError, ConfigError
from pydtnn.parallel.balance.cost_model import CostModel
from pydtnn.parallel.balance.policies import DynamicPolicy, FPMPolicy
from pydtnn.training.checkpointing import FORMAT, validate_meta

MODEL = CostModel.affine([0.040, 0.0], [1e-4, 1.5e-3], ["gpu", "cpu"]).state_dict()
DYNAMIC = {"model": MODEL, "window": [[[40.0, 0.044]], [[20.0, 0.03]]], "noise": [0.01, None], "suspect": [0, 1],
           "n_rebalances": 2}


def _meta(policy, key, state):
    return {"format": FORMAT, "epoch": 1, "step": 0, "nreplicas": 2, "seed": 0, "nparams": 10, "optimizer_name": "sgd",
            "history": [], "flags": {}, "optimizer": {"learning_rate": 0.1, "iterations": 3}, "sizes": [40, 20],
            "rng_states": [None, None], "schedulers": [], "balancer": None, "balance_policy": policy, key: state}


def _changed(state, path, value):
    state = copy.deepcopy(state)
    node, keys = state, path.split(".")
    for k in keys[:-1]:
        node = node[int(k) if k.isdigit() else k]
    node[int(keys[-1]) if keys[-1].isdigit() else keys[-1]] = value
    return state


BAD = {   # (what is stored, the field named)
    "a list for the state": ([DYNAMIC], "'balancer'"),
    "a string for the model": (_changed(DYNAMIC, "model", "fpm"), "'balancer.model'"),
    "a list for the model": (_changed(DYNAMIC, "model", [MODEL]), "'balancer.model'"),
    "no replicas": (_changed(DYNAMIC, "model.replicas", []), "'balancer.model.replicas'"),
    "an infinite batch": (_changed(DYNAMIC, "model.replicas.0.points.0", [float("inf"), 0.04]),
                          "'balancer.model.replicas[0].points[0]'"),
    "a batch of 10^300": (_changed(DYNAMIC, "model.replicas.1.points.1", [10 ** 300, 0.04]),
                          "'balancer.model.replicas[1].points[1]'"),
    "infinite seconds": (_changed(DYNAMIC, "model.replicas.1.points.0", [1, float("inf")]),
                         "'balancer.model.replicas[1].points[0]'"),
    "a device tpu": (_changed(DYNAMIC, "model.devices", ["tpu", "cpu"]), "'balancer.model.devices'"),
    "devices as a string": (_changed(DYNAMIC, "model.devices", "gpucpu"), "'balancer.model.devices'"),
    "a window of 10^300": (_changed(DYNAMIC, "window.0.0", [1e300, 0.04]), "'balancer.window[0][0]'"),
    "a window of one replica": (_changed(DYNAMIC, "window", [[[40.0, 0.044]]]), "'balancer.window'"),
    "a negative noise": (_changed(DYNAMIC, "noise", [-1.0, None]), "'balancer.noise'"),
    "a suspect of 7": (_changed(DYNAMIC, "suspect", [7, 0]), "'balancer.suspect'"),
    "rebalances as text": (_changed(DYNAMIC, "n_rebalances", "2"), "'balancer.n_rebalances'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_dynamic_policys_state_is_checked_field_by_field(case):
    state, field = BAD[case]
    with pytest.raises(CheckpointError) as e:
        validate_meta(_meta("dynamic", "balancer", state), "c.npz")
    assert str(e.value).startswith(f"checkpoint c.npz: metadata field {field} must be "), str(e.value)
    assert "\n" not in str(e.value)
    policy = DynamicPolicy()
    policy.bind(0, 2)
    with pytest.raises(ConfigError):                  # the same refusal in a loop of your own
        policy.load_state_dict(state)


@pytest.mark.parametrize("state, field", [
    ("fpm", "'balance_policy_state'"),
    ({"model": _changed(MODEL, "replicas.0.points.0", [8, -1.0])}, "'balance_policy_state.model.replicas[0].points[0]'"),
    ({"model": _changed(MODEL, "format", "other")}, "'balance_policy_state.model.format'"),
])
def test_an_fpm_policys_state_is_checked(state, field):
    with pytest.raises(CheckpointError) as e:
        validate_meta(_meta("fpm", "balance_policy_state", state), "c.npz")
    assert str(e.value).startswith(f"checkpoint c.npz: metadata field {field} must be "), str(e.value)


def test_sound_states_pass_and_a_users_policy_state_is_its_own():
    validate_meta(_meta("dynamic", "balancer", DYNAMIC), "c.npz")
    validate_meta(_meta("fpm", "balance_policy_state", {"model": MODEL}), "c.npz")
    validate_meta(_meta("fpm", "balance_policy_state", {"model": None}), "c.npz")
    validate_meta(_meta("Mine", "balance_policy_state", ["a user's policy", "may keep a list"]), "c.npz")
    policy = FPMPolicy()
    policy.bind(0, 2)
    policy.load_state_dict({"model": MODEL})
    assert policy.model.devices == ["gpu", "cpu"]


LAUNCHER = str(REPO_ROOT / "scripts" / "pydtnn_benchmark.py")
FAST = ["--model", "simplemlp", "--dataset", "synthetic", "--synthetic_samples", "128", "--global_batch_size", "32",
        "--steps_per_epoch", "2", "--progress_bar", "false", "--lr_schedulers", "", "--parallel", "data",
        "--threads_per_replica", "1", "--balance", "fpm"]


@pytest.mark.mpi
def test_a_crafted_policy_state_is_one_line_on_every_rank_before_work(tmp_path):
    r = run_mpi(2, LAUNCHER, [*FAST, "--num_epochs", "1", "--checkpoint_dir", tmp_path / "ck",
                              "--model_checkpoint_save_steps", "1"], timeout=180)
    saved = sorted((tmp_path / "ck").glob("*.npz"))
    assert r.returncode == 0 and saved, describe(r)
    with np.load(saved[0]) as d:
        arrays = {k: d[k] for k in d.files}
    meta = json.loads(arrays["__meta__"].tobytes())
    assert meta["balance_policy_state"]["model"]["replicas"], meta.keys()         # the fpm's probed model
    meta["balance_policy_state"]["model"]["replicas"][1]["points"][0][0] = 1e300
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(tmp_path / "bad.npz", **arrays)
    r = run_mpi(2, LAUNCHER, [*FAST, "--num_epochs", "2", "--resume", tmp_path / "bad.npz"], timeout=180)
    lines = output_of_our_processes(r)
    assert r.returncode == 2 and len(lines) == 1, describe(r)
    assert lines[0].startswith(f"pydtnn: error: checkpoint {tmp_path / 'bad.npz'}: metadata field "
                               f"'balance_policy_state.model.replicas[1].points[0]' must be [b, seconds]"), lines
