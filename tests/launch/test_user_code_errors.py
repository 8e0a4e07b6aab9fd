"""A user's own code that raises (a dataset or model file, a --balance plug-in in the launcher and the
simulator) is one `pydtnn: error:` line and at most the user's own frames, status 2: sequential and under
mpiexec, where every rank meets the same error and rank 0 alone prints it."""
import subprocess
import sys

import pytest

from mpi_helpers import REPO_ROOT, describe, output_of_our_processes, run_mpi  # noqa: E402
from pydtnn.plugins import USER_FRAMES

LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"
FAST = ["--model", "simplemlp", "--synthetic_samples", "64", "--batch_size", "16", "--num_epochs", "1",
        "--steps_per_epoch", "2", "--progress_bar", "false", "--lr_schedulers", ""]

FILES = {
    "data.py": ("import numpy as np\n\n\ndef create_dataset(seed):\n    return parse(seed)\n\n\n"
                "def parse(seed):\n    raise ValueError('my.csv row 7: 3 fields, expected 4')\n"),
    "data_at_import.py": "import numpy as np\n\nTABLE = {}['missing']\n\n\ndef create_dataset(seed):\n    pass\n",
    "model.py": ("from pydtnn.layers import FC, Input\n\n\ndef create_model(model):\n"
                 "    model.add(Input(shape=(1, 28, 28)))\n    model.add(FC(10, units_typo=3))\n"),
    "layer.py": ("from pydtnn.layers import FC, Flatten, Input, Layer\n\n\nclass Halves(Layer):\n"
                 "    def build(self, in_shape):\n        return in_shape\n\n"
                 "    def forward(self, x, training=False):\n        return x / self.divisor\n\n\n"
                 "def create_model(model):\n    model.add(Input(shape=(1, 28, 28)))\n    model.add(Flatten())\n"
                 "    model.add(Halves())\n    model.add(FC(10, activation='softmax'))\n"),
    "policy.py": ("from pydtnn.parallel.balance import BalancePolicy\n\n\n"
                  "class AtStart(BalancePolicy):\n    def initial_sizes(self, global_batch, nreplicas, caps):\n"
                  "        return [global_batch / 0] * nreplicas\n\n\n"
                  "class AfterStep(BalancePolicy):\n    def after_step(self, step, seconds_per_sample):\n"
                  "        return self.table[step]\n"),
}
# (the flags, the first line's start, the file and line of the last frame shown)
CASES = {
    "dataset raises": (["--dataset", "{d}/data.py"], "dataset file {d}/data.py: create_dataset failed: ValueError: my.csv",
                       "data.py", 9),
    "dataset raises at import": (["--dataset", "{d}/data_at_import.py"],
                                 "dataset file {d}/data_at_import.py failed to load: KeyError: 'missing'",
                                 "data_at_import.py", 3),
    "model raises": (["--model", "{d}/model.py", "--dataset", "mnist", "--use_synthetic_data", "true"],
                     "model file {d}/model.py: create_model failed: TypeError", "model.py", 6),
    "a layer raises in training": (["--model", "{d}/layer.py", "--dataset", "mnist", "--use_synthetic_data", "true"],
                                   "your code raised: AttributeError: 'Halves' object has no attribute 'divisor'",
                                   "layer.py", 9),
    "policy raises at start": (["--parallel", "data", "--balance", "{d}/policy.py:AtStart"],
                               "balance policy AtStart: initial_sizes failed: ZeroDivisionError", "policy.py", 6),
    "policy raises after a step": (["--parallel", "data", "--balance", "{d}/policy.py:AfterStep"],
                                   "balance policy AfterStep: after_step failed: AttributeError", "policy.py", 11),
}


AFTER_THE_BANNER = ("policy raises after a step", "a layer raises in training")


@pytest.fixture
def user_dir(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def _check(lines, case, d, status, rc, what):
    flags, first, file, line = CASES[case]
    errors = [i for i, l in enumerate(lines) if l.startswith("pydtnn: error")]
    assert rc == status and len(errors) == 1, what
    head, frames = lines[errors[0]], lines[errors[0] + 1:]
    assert head.startswith("pydtnn: error: " + first.format(d=d)), what
    assert 2 <= len(frames) <= 2 * USER_FRAMES, what
    assert all(f.startswith(("  File ", "    ")) for f in frames), what
    assert frames[-2].startswith(f'  File "{d / file}", line {line}, in '), what
    assert not any("Traceback" in l or "pydtnn/" in l for l in lines), what


def _flags(case, d):
    return [a.format(d=d) for a in CASES[case][0]]


def _launch(args, cwd):
    return subprocess.run([sys.executable, str(LAUNCHER), *FAST, *args], capture_output=True, text=True,
                          timeout=300, cwd=str(cwd))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_users_code_that_raises_is_one_line_and_its_frames(user_dir, case):
    r = _launch(_flags(case, user_dir), user_dir)
    # an error before any work prints nothing before it; one inside training follows the banner's lines
    lines = r.stderr.splitlines()
    _check(lines, case, user_dir, 2, r.returncode, r.stderr)
    if case not in AFTER_THE_BANNER:
        assert r.stdout == "", r.stdout


@pytest.mark.parametrize("policy, line", [("AtStart", 6), ("AfterStep", 11)])
def test_the_simulator_runs_a_raising_policy_into_the_same_line(user_dir, policy, line):
    r = subprocess.run([sys.executable, "-m", "pydtnn.sim", "run", "--model", "simplemlp", "--global_batch_size",
                        "64", "--replicas", "4", "--balance", f"policy.py:{policy}", "--steps", "3"],
                       capture_output=True, text=True, timeout=300, cwd=str(user_dir))
    # stdout: only the simulator's first lines (what it models), never a result
    assert r.returncode == 2 and "simulated " not in r.stdout, r.stderr
    first, *frames = r.stderr.splitlines()
    assert first.startswith(f"pydtnn: error: balance policy {policy}: "), r.stderr
    assert frames[-2].startswith(f'  File "{user_dir / "policy.py"}", line {line}, in '), r.stderr
    assert len(frames) <= 2 * USER_FRAMES and "Traceback" not in r.stderr, r.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("case", ["dataset raises", "model raises", "policy raises after a step",
                                  "a layer raises in training"])
def test_under_mpiexec_every_rank_stops_with_one_line_and_the_frames(user_dir, case):
    r = run_mpi(2, LAUNCHER, [*FAST, "--parallel", "data", *_flags(case, user_dir)], timeout=240)
    # stderr alone: the banner's own rules of dashes (on stdout) are no part of Open MPI's notice
    lines = output_of_our_processes(r, r.stderr)
    _check(lines, case, user_dir, 2, r.returncode, describe(r))
    if case not in AFTER_THE_BANNER:
        assert r.stdout == "", describe(r)


def test_only_the_users_own_code_makes_a_user_error(tmp_path):
    """The innermost frame that is not the standard library or a package decides: the user's file (also when
    it called numpy, which raised) is the user's mistake; this project's code is a bug of ours."""
    from pydtnn.plugins import raised_by_users_code
    (tmp_path / "mine.py").write_text("import numpy as np\n\n\ndef load():\n    return np.load('/no/such.npy')\n\n\n"
                                      "def call(f):\n    return f()\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("mine_for_test", tmp_path / "mine.py")
    mine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mine)
    with pytest.raises(FileNotFoundError) as e:
        mine.load()
    assert raised_by_users_code(e.value)
    from pydtnn.parallel.sharding import steps_in_epoch
    with pytest.raises(Exception) as e:
        mine.call(lambda: steps_in_epoch(-1, 4))            # raised by this project's code, called by the user's
    assert not raised_by_users_code(e.value)


def test_a_compiled_library_frame_is_not_the_users_code():
    """mpi4py's Cython frames name source files that are not on disk (src/mpi4py/MPI.src/...): an MPI error
    raised there, under this project's call, is no user's mistake (it was reported as one)."""
    import functools
    from pydtnn.parallel.comm import SerialComm, raise_together
    from pydtnn.plugins import raised_by_users_code
    compiled = compile("raise RuntimeError('Other MPI error')", "src/mpi4py/MPI.src/Comm.pyx", "exec")
    with pytest.raises(RuntimeError) as e:            # exec is a builtin: no frame between ours and the "pyx"
        raise_together(SerialComm(), functools.partial(exec, compiled, {}), "elsewhere")
    assert not raised_by_users_code(e.value)
