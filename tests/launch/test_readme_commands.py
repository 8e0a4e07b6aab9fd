"""The commands of the README, and those a docs page says were run, run here as written, and the numbers next to
them hold. Only the data may be swapped (a folder of a user's machine for synthetic data of the same shape, a
user's own files for small ones), and a few flags appended (float64, fewer steps, an output file): each test
declares both. A command that is not run here is in ACCOUNTED_FOR with the reason (what runs it instead, or why
no test can), and a new command on a page fails `test_every_documented_command_is_accounted_for` until it is."""
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from mpi_helpers import describe, output_of_our_processes, printed_split, run_mpi
from paths import REPO_DIR as REPO  # noqa: E402

LAUNCHER = os.path.join(REPO, "scripts", "pydtnn_benchmark.py")
PAGES = ["README.md"] + sorted(f"docs/{n}" for n in os.listdir(os.path.join(REPO, "docs")) if n.endswith(".md"))


def _read(page):
    return open(os.path.join(REPO, page)).read()


def commands(page):
    """The shell commands of a page's fenced blocks (```bash and unlabelled ones), continuation lines joined,
    comments and blank lines left out, that run this project or Python: python, mpiexec, pydtnn-*."""
    found = []
    for block in re.findall(r"^```(?:bash|sh|)\n(.*?)^```", _read(page), re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if re.search(r"(^|&& |\s)(python3?|mpiexec|pydtnn-[a-z]+) ", line + " "):
                found.append(re.sub(r"\s+", " ", line))
    return found


def the_command(page, start):
    """The one command of `page` that starts with `start`."""
    found = [c for c in commands(page) if c.startswith(start)]
    assert len(found) == 1, (page, start, found)
    return found[0]


def launcher_args(command, swaps=()):
    """(ranks or None for a plain `python`, the launcher's arguments) of a command of the launcher, with each
    declared swap (a run of words -> another) made exactly once, so that a command that changes fails here."""
    words = shlex.split(command)
    if words[0] == "mpiexec":
        assert words[1] == "-n" and words[3:7] == ["python", "-m", "mpi4py", "scripts/pydtnn_benchmark.py"], words
        ranks, args = int(words[2]), words[7:]
    else:
        assert words[:2] == ["python", "scripts/pydtnn_benchmark.py"], words
        ranks, args = None, words[2:]
    for old, new in swaps:
        at = [i for i in range(len(args)) if args[i:i + len(old)] == list(old)]
        assert len(at) == 1, (old, args)
        args[at[0]:at[0] + len(old)] = list(new)
    return ranks, args


def run_launcher(ranks, args, timeout=300, cwd=REPO, env=None):
    if ranks is None:
        child_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
        r = subprocess.run([sys.executable, LAUNCHER, *args], capture_output=True, text=True, timeout=timeout,
                           cwd=cwd, env=child_env)
        r.args = [sys.executable, LAUNCHER, *args]
        return r
    return run_mpi(ranks, LAUNCHER, args, timeout=timeout, env=env)


def epoch_logs(stdout):
    """{name: value} of every epoch line, in order."""
    return [dict((k, float(v)) for k, v in re.findall(r"(\w+)=([0-9.]+)", line))
            for line in stdout.splitlines() if re.match(r"epoch \d+: ", line)]


def max_relative_differences(a, b):
    """Per array of two weights files: max |a - b| over max |b| (the scale of that array)."""
    assert sorted(a.files) == sorted(b.files) and len(b.files) > 50
    return {k: float(np.max(np.abs(a[k] - b[k])) / max(float(np.max(np.abs(b[k]))), 1e-300)) for k in b.files}


# ------------------------------------------------------------------- README: three heterogeneous replicas

README_EXAMPLE = the_command("README.md", "mpiexec -n 3 ")
# Declared: CIFAR-10 from a user's folder -> synthetic data of its shape; then float64, 320 samples (288 to
# train after --validation_split 0.1: 3 steps of 96), one epoch, no progress bar, the weights written.
SYNTHETIC_CIFAR = ((("--dataset_train_path", "~/data/cifar10"), ("--use_synthetic_data", "true")),)
DECLARED = ["--dtype", "float64", "--synthetic_samples", "320", "--num_epochs", "1", "--progress_bar", "false"]
PARALLEL_ONLY = (("--parallel", "data"), ("--global_batch_size", "96"), ("--balance", "static"),
                 ("--replica_speeds", "1,2,3"), ("--sync_batchnorm", "true"))
# Error analysis of the tolerance: float64 (u = 2^-53 = 1.1e-16) sums in another order (the replicas' partial
# sums, reduced) differ by about sqrt(n) u relative; the largest sums here are BatchNorm's and the weight
# gradients' over b x 32 x 32 <= 98,304 terms: 3.5e-14. A step chains about 60 of them (21 convolutions
# forward and backward, 21 BatchNorm layers both ways, the FC): 2e-12; 3 steps: 6e-12; 1e-10 leaves a factor
# of 15 for what the updates (learning rate 0.1) amplify. Measured: 2.8e-14. Without synchronized BatchNorm
# the replicas normalize over 16, 32 and 48 samples: 0.88 (a BatchNorm beta).
TOLERANCE = 1e-10


def test_the_readme_example_equals_one_process_on_the_global_batch(tmp_path):
    """The README's 3-replica ResNet-20 command as written (data swapped and flags appended as declared) gives
    the weights and running statistics of one process on the batch of 96, to TOLERANCE; the same command
    without `--sync_batchnorm true` does not (the README says: by more than 1%)."""
    assert the_command("docs/running.md", "mpiexec -n 3 ") == README_EXAMPLE     # the page runs the same one
    assert "the weights after 3 steps agree to 1e-10, and differ by more than 1% without" in " ".join(
        _read("README.md").split())
    ranks, args = launcher_args(README_EXAMPLE, SYNTHETIC_CIFAR)
    assert ranks == 3 and "resnet20_cifar10" in args and args[args.index("--sync_batchnorm") + 1] == "true"
    weights = {name: tmp_path / f"{name}.npz" for name in ("readme", "local", "one")}
    r = run_launcher(3, args + DECLARED + ["--save_weights_and_bias_filename", str(weights["readme"])])
    assert r.returncode == 0, describe(r)
    assert printed_split(r.stdout) == [16, 32, 48]
    assert "learning rate in force" not in r.stdout          # the flag's 0.1, as the README says
    _, local = launcher_args(README_EXAMPLE, SYNTHETIC_CIFAR + ((("--sync_batchnorm", "true"), ()),))
    r = run_launcher(3, local + DECLARED + ["--save_weights_and_bias_filename", str(weights["local"])])
    assert r.returncode == 0, describe(r)
    _, one = launcher_args(README_EXAMPLE, SYNTHETIC_CIFAR + tuple((flag, ()) for flag in PARALLEL_ONLY))
    r = run_launcher(None, one + ["--batch_size", "96"] + DECLARED +
                     ["--save_weights_and_bias_filename", str(weights["one"])])
    assert r.returncode == 0, describe(r)
    readme, without, reference = (np.load(weights[k]) for k in ("readme", "local", "one"))
    assert sum(k.endswith(("/mean", "/var")) for k in reference.files) == 2 * 21      # 21 BatchNorm layers
    synced = max_relative_differences(readme, reference)
    assert max(synced.values()) <= TOLERANCE, sorted(synced.items(), key=lambda kv: -kv[1])[:5]
    assert max(max_relative_differences(without, reference).values()) > 1e-2


def test_the_readme_example_without_its_data_names_the_ways_out_in_one_line(tmp_path):
    """As written, on a machine without ~/data/cifar10 (HOME is an empty folder, as a shell expands ~), under
    mpiexec -n 3: one line on stderr, exit 2, naming --download true and --use_synthetic_data true."""
    readme = " ".join(_read("README.md").split())
    assert ("leave `--dataset_train_path` out and add `--download true` to fetch it (into `~/.cache/pydtnn`), or "
            "add `--use_synthetic_data true`") in readme
    ranks, args = launcher_args(README_EXAMPLE)
    args = [a.replace("~", str(tmp_path), 1) if a.startswith("~/") else a for a in args]
    r = run_launcher(ranks, args, timeout=120)
    lines = output_of_our_processes(r)
    assert r.returncode == 2 and len(lines) == 1, describe(r)
    assert lines[0] == (f"pydtnn: error: {tmp_path}/data/cifar10: cifar10 dataset folder not found: correct "
                        f"--dataset_train_path (train_path=), or leave it out and fetch the files into the cache "
                        f"with --download true (download=True), or train on synthetic data shaped like cifar10 "
                        f"with --use_synthetic_data true"), lines


def test_the_download_goes_where_the_readme_says(monkeypatch):
    from pydtnn.datasets import default_cache_dir
    monkeypatch.delenv("PYDTNN_CACHE", raising=False)
    monkeypatch.setenv("HOME", "/nonexistent-home")
    assert default_cache_dir() == "/nonexistent-home/.cache/pydtnn"


# ------------------------------------------------------------------- README: the first run

def test_the_readme_first_run_trains_simplecnn_on_learnable_synthetic_data():
    """`python scripts/pydtnn_benchmark.py` (the README's first command, after its install, which CI runs) as
    written from the repository: simplecnn on synthetic data, and it learns: 10 classes make chance 0.1, and
    one epoch reaches 0.97 here; 0.5 is far from both, so no rounding of another CPU moves it across."""
    setup = the_command("README.md", "python3 -m venv .venv && ")
    run = setup.split(" && ")[-1]
    assert run == "python scripts/pydtnn_benchmark.py"
    assert "run a first training on the offline default (simplecnn on learnable synthetic data)" in " ".join(
        _read("README.md").split())
    ranks, args = launcher_args(run)
    r = run_launcher(ranks, args)
    assert r.returncode == 0, describe(r)
    assert "simplecnn" in r.stdout and "synthetic" in r.stdout, r.stdout
    logs = epoch_logs(r.stdout)
    assert len(logs) == 1 and logs[0]["categorical_accuracy"] > 0.5, r.stdout


# ------------------------------------------------------------------- docs/datasets.md: your own data

MY_MODEL = """from pydtnn.layers import FC, Input


def create_model(model):
    model.add(Input(shape=(512,)))
    model.add(FC(shape=(10,), activation="softmax"))
"""


def test_the_datasets_page_command_runs_a_users_model_and_data_file(tmp_path):
    """docs/datasets.md's command, 4 ranks, with the page's own my_data.py as written (its features.npy and
    labels.npy made small: 600 samples of 512 features) and a one-layer my_model.py, both declared here."""
    page = _read("docs/datasets.md")
    my_data = re.search(r"```python\n(# my_data\.py:.*?)```", page, re.S).group(1)
    (tmp_path / "my_data.py").write_text(my_data)
    (tmp_path / "my_model.py").write_text(MY_MODEL)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 600)
    np.save(tmp_path / "features.npy", (rng.standard_normal((600, 512)) + y[:, None]).astype(np.float32))
    np.save(tmp_path / "labels.npy", y.astype(np.int64))
    command = the_command("docs/datasets.md", "mpiexec -n 4 ")
    ranks, args = launcher_args(command, ((("my_model.py",), (str(tmp_path / "my_model.py"),)),
                                          (("my_data.py",), (str(tmp_path / "my_data.py"),))))
    r = run_launcher(ranks, args + ["--progress_bar", "false"], timeout=300)
    assert r.returncode == 0, describe(r)
    assert printed_split(r.stdout) == [64, 64, 64, 64]
    logs = epoch_logs(r.stdout)
    assert len(logs) == 1 and "val_categorical_accuracy" in logs[0], r.stdout


# ------------------------------------------------------------------- docs/layers_and_models.md: the ViT

# Held-out accuracy (%) after epochs 1, 2, 4 and 6 of the page's command with --seed 0 (the default, as written)
# to 6, measured on an Intel Xeon (AVX-512) 2-core VM on 2026-12-07 (seed 0 gave the same on the page's
# earlier machine). Another CPU sums in float32 in another order (BLAS kernels, SIMD width): at worst its
# trajectory leaves seed 0's and is another draw of the same training, so the tolerance is the seeds' mean
# +- 3 standard deviations.
VIT_SEEDS = {1: [93.75, 92.75, 92.35, 92.25, 93.75, 93.85, 93.20],
             2: [94.40, 94.40, 95.30, 94.90, 95.00, 95.45, 95.50],
             4: [97.10, 96.55, 95.75, 96.15, 96.40, 95.90, 96.10],
             6: [96.65, 96.20, 96.50, 96.50, 96.60, 95.95, 96.25]}
VIT_PAGE = {1: 93.8, 2: 94.4, 4: 97.1, 6: 96.7}        # what the page says seed 0 gave


def _within_seed_spread(epoch, accuracy):
    values = np.array(VIT_SEEDS[epoch])
    mean, sd = values.mean(), values.std(ddof=1)
    return abs(accuracy - mean) <= 3 * sd


def test_the_vit_command_of_the_layers_page_gives_its_accuracies_and_the_serial_run_its_losses():
    """docs/layers_and_models.md's ViT command on the repository's MNIST, as written (2 ranks, 2 epochs): the
    held-out accuracies the page gives, within the seeds' spread; the serial run the page describes (no
    mpiexec, --threads_per_replica 1; 6 epochs) gives the same losses (within 0.001: float32 sums of the
    gradient in another order) and the page's accuracies after epochs 4 and 6."""
    page = " ".join(_read("docs/layers_and_models.md").split())
    for epoch, text in ((1, "gave 93.8% held-out accuracy after the first epoch"), (2, "and 94.4% after the second"),
                        (4, "(97.1% after the fourth)"), (6, "6 epochs reach 96.7%")):
        assert text in page, text
        assert VIT_SEEDS[epoch][0] == pytest.approx(VIT_PAGE[epoch], abs=0.051)   # the page's numbers, seed 0's
        assert _within_seed_spread(epoch, VIT_PAGE[epoch])
    assert ("seeds 1 to 6 gave 92.3-93.9% after the first epoch, 94.4-95.5% after the second and 96.0-96.6% after "
            "the sixth") in page
    assert [min(VIT_SEEDS[e][1:]) for e in (1, 2, 6)] == [92.25, 94.40, 95.95]      # the page's ranges, rounded
    assert [max(VIT_SEEDS[e][1:]) for e in (1, 2, 6)] == [93.85, 95.50, 96.60]
    command = the_command("docs/layers_and_models.md", "mpiexec -n 2 ")
    ranks, args = launcher_args(command)
    r = run_launcher(ranks, args + ["--progress_bar", "false"], timeout=300)
    assert r.returncode == 0, describe(r)
    parallel = epoch_logs(r.stdout)
    assert len(parallel) == 2, r.stdout
    for epoch, logs in zip((1, 2), parallel):
        assert _within_seed_spread(epoch, 100 * logs["val_categorical_accuracy"]), (epoch, logs)
    _, serial_args = launcher_args(command, ((("--parallel", "data"), ()), (("--num_epochs", "2"), ())))
    r = run_launcher(None, serial_args + ["--threads_per_replica", "1", "--num_epochs", "6", "--progress_bar",
                                          "false"], timeout=400)
    assert r.returncode == 0, describe(r)
    serial = epoch_logs(r.stdout)
    assert len(serial) == 6, r.stdout
    for a, b in zip(parallel, serial):
        assert abs(a["loss"] - b["loss"]) <= 1e-3 and abs(a["val_loss"] - b["val_loss"]) <= 1e-3, (a, b)
    for epoch in (4, 6):
        assert _within_seed_spread(epoch, 100 * serial[epoch - 1]["val_categorical_accuracy"]), serial[epoch - 1]


# ------------------------------------------------------------------- every command, accounted for

# (page, the command's start) -> what runs it, or why no test does. A test of this file is named by its
# function, which must exist; anything else is a reason.
ACCOUNTED_FOR = {
    ("README.md", "python3 -m venv .venv && "): "test_the_readme_first_run_trains_simplecnn_on_learnable_synthetic_"
                                                "data (its run); CI runs the whole line (test_readme.py checks)",
    ("README.md", "python -m pytest -q"): "CI runs it (tests/launch/test_readme.py checks .ci/run)",
    ("README.md", "python3 -m venv .venv-openmpi && "): "CI runs it (tests/launch/test_readme.py checks .ci/run)",
    ("README.md", "mpiexec -n 3 "): "test_the_readme_example_equals_one_process_on_the_global_batch",
    ("docs/running.md", "mpiexec -n 3 "): "test_the_readme_example_equals_one_process_on_the_global_batch",
    ("docs/running.md", "python3 -m venv ~/pydtnn-env"): "a cluster's setup: its module system and its MPI",
    ("docs/datasets.md", "mpiexec -n 4 "): "test_the_datasets_page_command_runs_a_users_model_and_data_file",
    ("docs/layers_and_models.md", "mpiexec -n 2 "):
        "test_the_vit_command_of_the_layers_page_gives_its_accuracies_and_the_serial_run_its_losses",
    ("docs/performance.md", "python scripts/bench/"): "benchmarks of minutes: the page gives dated measurements",
    ("docs/performance-history.md", "python scripts/bench/"): "benchmarks of minutes, each pass dated as measured",
    ("docs/performance-history.md", "NUMBA_CPU_NAME="): "a benchmark of minutes, dated as measured",
    ("docs/simulation.md", "pydtnn-simulate "): "the simulator's synopsis; its subcommands run in tests/sim",
    ("docs/simulation.md", "mpiexec -n 3 "): "tests/sim/test_sim_devices.py runs it (the shipped example's run)",
    ("docs/simulation.md", "python scripts/experiments/compression_sweep.py"):
        "tests/sim/test_compression_sweep_doc.py runs it and checks the page's table and sentence",
}


def test_every_documented_command_is_accounted_for():
    """Every command of the README and the docs pages is run by a test of this file or has its reason."""
    here = sys.modules[__name__]
    missing, unused = [], set(ACCOUNTED_FOR)
    for page in PAGES:
        for command in commands(page):
            keys = [k for k in ACCOUNTED_FOR if k[0] == page and command.startswith(k[1])]
            if not keys:
                missing.append(f"{page}: {command}")
            unused -= set(keys)
    assert not missing and not unused, (missing, unused)
    tests = [v for v in ACCOUNTED_FOR.values() if v.startswith("test_")]
    assert all(callable(getattr(here, t.split(" ")[0], None)) for t in tests), tests
    assert len(commands("README.md")) == 4 and commands("docs/running.md")[0] == README_EXAMPLE
