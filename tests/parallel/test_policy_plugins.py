"""A user's balancing policy and gradient weighting that fail, at the right time, in one line plus the user's
own frames (issue 38): raising in initial_sizes, after_step (launcher, simulator, under MPICH and Open MPI) or
state_dict (a checkpoint),
splits that differ between ranks (agreed on, or refused), weightings that return what is not a list of
finite numbers (refused on the initial split, before any work).

The MPI jobs run with PYDTNN_ERROR_SYNC_S=600: a failure not agreed at a collective would leave the other
ranks waiting 10 minutes and the job would outlive its timeout (a test failure)."""
import os
import subprocess
import sys

import pytest

from mpi_helpers import REPO_ROOT, describe, output_of_our_processes, run_mpi  # noqa: E402

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance.policies import make_policy
from pydtnn.parallel.balance.policy_calls import call
from pydtnn.parallel.weighting import make_weighting

LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"
QUICK = ["--model", "simplemlp", "--synthetic_samples", "64", "--progress_bar", "false", "--lr_schedulers", "",
         "--parallel", "data", "--global_batch_size", "16"]
NO_WAITING = {"PYDTNN_ERROR_SYNC_S": 600}
MAX_FRAME_LINES = 4             # at most 2 of the user's frames: "File ..., line N, in f" and its source line

POLICIES = '''
from pydtnn.parallel.balance import BalancePolicy


def helper(step):
    raise RuntimeError(f"boom at step {step}")


class RaisesAtStart(BalancePolicy):
    def initial_sizes(self, global_batch, nreplicas, caps):
        raise ValueError("no split for you")


class RaisesAfterStep(BalancePolicy):
    def after_step(self, step, report):
        if step == 1:
            helper(step)


class RaisesOnRankOne(BalancePolicy):
    def after_step(self, step, report):
        if step == 1 and self.rank == 1:
            raise KeyError("only here")


class RaisesInStateDict(BalancePolicy):
    def state_dict(self):
        return {"ratio": 1 / 0}


class ByRankAtStart(BalancePolicy):
    def initial_sizes(self, global_batch, nreplicas, caps):
        return [global_batch - nreplicas + 1 - self.rank] + [1] * (nreplicas - 2) + [1 + self.rank]


class ByRankAfterStep(BalancePolicy):
    def after_step(self, step, report):
        if step == 2 and self.rank == 0:
            return [self.sizes[0] + 1, self.sizes[1] - 1]


class WithOptions(BalancePolicy):
    def __init__(self, shift=0, label="x"):
        self.shift, self.label = shift, label

    def initial_sizes(self, global_batch, nreplicas, caps):
        assert self.label == "ok" and nreplicas == len(self.devices)
        return [global_batch // nreplicas + self.shift, global_batch - global_batch // nreplicas - self.shift]
'''

WEIGHTS = '''
def short(sizes):
    return [1.0]

def nan(sizes):
    return [float("nan")] * len(sizes)

def inf(sizes):
    return [float("inf")] * len(sizes)

def nothing(sizes):
    return None

def text(sizes):
    return ["0.5"] * len(sizes)

def nested(sizes):
    return [[0.5]] * len(sizes)

def flags(sizes):
    return [True] * len(sizes)

def raises(sizes):
    return 1 / 0
'''


@pytest.fixture
def plugins(tmp_path):
    (tmp_path / "pol.py").write_text(POLICIES)
    (tmp_path / "w.py").write_text(WEIGHTS)
    return tmp_path


def user_error(stderr, first):
    """The error's lines: `pydtnn: error: ...` starting with `first`, then only the user's own frames."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and lines[0].startswith("pydtnn: error: " + first), stderr
    assert len(lines) <= 1 + MAX_FRAME_LINES and "Traceback" not in stderr, stderr
    assert all(line.startswith("    ") or ("pol.py" in line or "w.py" in line) for line in lines[1:]), stderr
    assert not any("pydtnn/" in line for line in lines[1:]), stderr         # never our stack
    return lines


# ------------------------------------------------------------------------------------------- in process

def test_a_policy_that_raises_is_its_line_and_its_own_frames(plugins):
    policy = make_policy(f"{plugins}/pol.py:RaisesAfterStep")
    with pytest.raises(ConfigError) as e:
        call(policy, "after_step", 1, [0.1, 0.2])
    lines = str(e.value).splitlines()
    assert lines[0] == "balance policy RaisesAfterStep: after_step failed: RuntimeError: boom at step 1"
    assert lines[1].endswith(", in after_step") and "pol.py" in lines[1] and lines[2].strip() == "helper(step)"
    assert lines[3].endswith(", in helper") and lines[4].strip().startswith("raise RuntimeError")
    assert len(lines) == 1 + MAX_FRAME_LINES


def test_options_and_rank_reach_a_users_policy(plugins):
    policy = make_policy(f"{plugins}/pol.py:WithOptions", options={"shift": 3, "label": "ok"})
    policy.bind(1, 2, ["gpu", "cpu"], {"shift": 3, "label": "ok"})
    assert (policy.rank, policy.devices, policy.options["shift"]) == (1, ["gpu", "cpu"], 3)
    assert policy.initial_sizes(16, 2, None) == [11, 5]
    with pytest.raises(ConfigError, match=r"WithOptions\(nope=1\) failed: TypeError"):
        make_policy(f"{plugins}/pol.py:WithOptions", options={"nope": 1})


@pytest.mark.parametrize("fn", ["short", "nan", "inf", "nothing", "text", "nested", "flags"])
def test_a_weighting_that_returns_no_list_of_numbers_is_one_line(plugins, fn):
    weights = make_weighting(f"{plugins}/w.py:{fn}")
    with pytest.raises(ConfigError) as e:
        weights([8, 8])
    assert "expected a list of 2 finite numbers" in str(e.value) and "\n" not in str(e.value)


def test_a_weighting_that_raises_keeps_its_frame(plugins):
    with pytest.raises(ConfigError) as e:
        make_weighting(f"{plugins}/w.py:raises")([8, 8])
    lines = str(e.value).splitlines()
    assert lines[0].endswith("failed on sizes [8, 8]: ZeroDivisionError: division by zero")
    assert "w.py" in lines[1] and lines[2].strip() == "return 1 / 0"


def test_dataparallel_calls_the_weighting_once_before_any_step(plugins):
    import numpy as np
    from pydtnn import Model
    from pydtnn.layers import FC, Input
    from pydtnn.optimizers import SGD
    from pydtnn.parallel import DataParallel
    m = Model(dtype="float64", seed=0)
    m.add(Input(shape=(2,)))
    m.add(FC(shape=(2,), activation="softmax"))
    with pytest.raises(ConfigError, match="gradient weighting .*nan returned"):
        DataParallel(m, SGD(), global_batch=8, weighting=f"{plugins}/w.py:nan")
    assert np.isfinite(m.params).all()


# ------------------------------------------------------------------------------------ the launcher, alone

def launch(*args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(LAUNCHER), *QUICK, *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=env)


@pytest.mark.parametrize("cls, first, before_work", [
    ("RaisesAtStart", "balance policy RaisesAtStart: initial_sizes failed: ValueError: no split for you", True),
    ("RaisesAfterStep", "balance policy RaisesAfterStep: after_step failed: RuntimeError: boom at step 1", False),
    ("RaisesInStateDict", "balance policy RaisesInStateDict: state_dict failed: ZeroDivisionError: division by zero",
     False),                                                     # at the checkpoint after step 1
])
def test_the_launcher_gives_a_raising_policy_one_line_and_status_2(plugins, cls, first, before_work):
    r = launch("--balance", f"pol.py:{cls}", "--model_checkpoint_save_steps", "1", "--checkpoint_dir", "ck",
               cwd=plugins)
    assert r.returncode == 2, r.stderr
    user_error(r.stderr, first)
    assert ("model: simplemlp" in r.stdout) is not before_work, r.stdout     # the banner's first line


@pytest.mark.parametrize("fn", ["nan", "inf", "text", "nested", "nothing", "flags"])
def test_the_launcher_refuses_a_bad_weighting_before_work(plugins, fn):
    r = launch("--gradient_weighting", f"w.py:{fn}", cwd=plugins)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "expected a list of 1 finite numbers" in lines[0], r.stderr
    assert r.stdout == "", r.stdout                                         # no banner: nothing started


# ------------------------------------------------------------------------------------------ the simulator

@pytest.mark.parametrize("cls, first", [
    ("RaisesAtStart", "balance policy RaisesAtStart: initial_sizes failed: ValueError"),
    ("RaisesAfterStep", "balance policy RaisesAfterStep: after_step failed: RuntimeError"),
])
def test_the_simulator_gives_a_raising_policy_one_line_and_status_2(plugins, cls, first, capsys):
    from pydtnn.sim.__main__ import main
    status = main(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "2", "--steps", "4",
                   "--balance", f"{plugins}/pol.py:{cls}"])
    assert status == 2
    user_error(capsys.readouterr().err, first)


# ----------------------------------------------------------------------------------- under MPI (2 ranks)

def mpi_user_error(r, first):
    assert r.returncode == 2, describe(r)
    text = "\n".join(output_of_our_processes(r, r.stderr))
    assert "MPI_ABORT" not in r.stderr and "Abort(" not in r.stderr, describe(r)
    return user_error(text, first)


@pytest.mark.mpi
@pytest.mark.parametrize("cls, first", [
    ("RaisesAtStart", "balance policy RaisesAtStart: initial_sizes failed: ValueError: no split for you"),
    ("RaisesAfterStep", "balance policy RaisesAfterStep: after_step failed: RuntimeError: boom at step 1"),
    ("RaisesOnRankOne", "rank 1: balance policy RaisesOnRankOne: after_step failed: KeyError"),
])
def test_a_raising_policy_stops_every_rank_with_its_line(plugins, cls, first):
    r = run_mpi(2, LAUNCHER, [*QUICK, "--balance", f"{plugins}/pol.py:{cls}"], timeout=180, env=NO_WAITING)
    mpi_user_error(r, first)


@pytest.mark.mpi
@pytest.mark.parametrize("cls, when", [("ByRankAtStart", "for the initial split"),
                                       ("ByRankAfterStep", "in after_step(step=2), after step 3")])
def test_splits_that_differ_between_ranks_are_refused(plugins, cls, when):
    r = run_mpi(2, LAUNCHER, [*QUICK, "--balance", f"{plugins}/pol.py:{cls}"], timeout=180, env=NO_WAITING)
    lines = mpi_user_error(r, f"balance policy {cls} returned different splits on different ranks {when}")
    assert len(lines) == 1 and "rank 0: " in lines[0] and "rank 1: " in lines[0], lines
    if cls == "ByRankAtStart":
        assert "model: simplemlp" not in r.stdout                         # refused before work


@pytest.mark.mpi
def test_a_bad_weighting_is_refused_before_work_on_every_rank(plugins):
    r = run_mpi(2, LAUNCHER, [*QUICK, "--gradient_weighting", f"{plugins}/w.py:inf"], timeout=180, env=NO_WAITING)
    lines = mpi_user_error(r, "gradient weighting")
    assert len(lines) == 1 and "expected a list of 2 finite numbers" in lines[0] and r.stdout == "", describe(r)


@pytest.mark.mpi
def test_a_users_policy_gets_its_options_and_rank(plugins):
    r = run_mpi(2, LAUNCHER, [*QUICK, "--balance", f"{plugins}/pol.py:WithOptions", "--balance_options",
                              "shift=3,label=ok"], timeout=180, env=NO_WAITING)
    assert r.returncode == 0 and "split as [11, 5]" in r.stdout, describe(r)
