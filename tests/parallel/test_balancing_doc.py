"""docs/balancing.md's worked policy, as written there: driven directly with reports of known affine costs,
and through the launcher in virtual time (tests/mpi_scripts/virtual_time.py) on emulated affine costs."""
import re

import numpy as np
import pytest

from mpi_helpers import REPO_ROOT, describe, run_mpi  # noqa: E402

from pydtnn.parallel.balance.cost_model import CostModel
from pydtnn.parallel.balance.fpm_partition import equal_finish
from pydtnn.parallel.balance.step_report import StepReport

DOC = (REPO_ROOT / "docs" / "balancing.md").read_text()
CODE = re.search(r"```python\n(.*?)```", DOC, re.S).group(1)
TRUTH = CostModel.affine([0.040, 0.0, 0.0], [1e-4, 1.5e-3, 1.5e-3])


def test_the_worked_policy_is_about_thirty_lines():
    lines = [line for line in CODE.splitlines() if line.strip()]
    assert 20 <= len(lines) <= 40 and "class AffineFit(BalancePolicy)" in CODE


def test_the_worked_policy_finds_equal_finish_times():
    scope = {}
    exec(CODE, scope)
    policy = scope["AffineFit"](every=5)
    policy.sizes = [86, 85, 85]
    for step in range(20):
        t = TRUTH.seconds(policy.sizes)
        new = policy.after_step(step, StepReport(tuple(policy.sizes), tuple(t), (0.0,) * 3, float(t.max()),
                                                 (step == 0,) * 3))
        if new is not None:
            policy.sizes = new
    best = TRUTH.makespan(equal_finish(256, TRUTH))
    assert sum(policy.sizes) == 256 and TRUTH.makespan(policy.sizes) <= 1.02 * best, policy.sizes


@pytest.mark.mpi
def test_the_worked_policy_through_the_launcher(tmp_path):
    (tmp_path / "affine_fit.py").write_text(CODE)
    r = run_mpi(3, "virtual_time.py",
                ["--model", "simplemlp", "--parallel", "data", "--lr_schedulers", "", "--progress_bar", "false",
                 "--threads_per_replica", "1", "--balance", f"{tmp_path}/affine_fit.py:AffineFit",
                 "--balance_options", "every=5", "--emulate_costs", "40ms+0.1ms,0+1.5ms,0+1.5ms",
                 "--global_batch_size", 256, "--synthetic_samples", 256 * 10, "--num_epochs", 2],
                timeout=180, env={"VIRTUAL_COST_S": 1e-4})
    assert r.returncode == 0, describe(r)
    found = re.findall(r"re-split after step (\d+): \[[0-9, ]+\] -> \[([0-9, ]+)\] \(affine fits", r.stdout)
    assert found, r.stdout
    # it returns a split only when (step + 1) % 5 == 0: the announcement says step + 1, as the doc says
    assert all(int(step) % 5 == 0 for step, _ in found), r.stdout
    splits = [split for _, split in found]
    last = [int(v) for v in splits[-1].split(",")]
    assert TRUTH.makespan(last) <= 1.02 * TRUTH.makespan(equal_finish(256, TRUTH)), r.stdout
    assert np.all(np.array(last) > 0)
