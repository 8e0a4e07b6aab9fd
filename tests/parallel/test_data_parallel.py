"""Data parallelism end to end in real MPI jobs: the invariant, the launcher, speeds and failures."""
import json
import os

import numpy as np
import pytest

import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from mpi_helpers import REPO_ROOT, mpi_command, processes_with, run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi
LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"


def _result(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = [l for l in proc.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)


@pytest.mark.parametrize("non_blocking", ["0", "1"])
def test_invariant_heterogeneous_proportional_equals_serial(non_blocking):
    r = _result(run_mpi(3, "invariant.py", ["proportional", "1,2,3", 60, 4, f"non_blocking={non_blocking}"],
                        timeout=180))
    assert r["sizes"] == [10, 20, 30]
    assert r["rel_diff"] < 1e-10


@pytest.mark.parametrize("non_blocking", ["0", "1"])
def test_invariant_holds_with_clipping_of_the_reduced_gradient(non_blocking):
    # 2 epochs x 4 steps; a threshold below the gradient norms of the early steps, so clipping acts
    r = _result(run_mpi(3, "invariant.py", ["proportional", "1,2,3", 60, 4, f"non_blocking={non_blocking}",
                                             "clip=0.05"], timeout=180))
    assert r["sizes"] == [10, 20, 30]
    assert r["clipped"] > 0 and r["clipped"] == r["clipped_serial"]
    assert r["rel_diff"] < 1e-10


def test_invariant_holds_across_re_splits_of_a_policy():
    """A BalancePolicy that re-splits after every step (2 epochs x 4 steps): proportional weights keep the
    invariant exact whatever the split of each step (float64; the same bound as the fixed splits)."""
    r = _result(run_mpi(3, "invariant.py", ["proportional", "1,2,3", 60, 4, "policy=rotate"], timeout=180))
    assert r["sizes"] == [10, 20, 30] and r["resplits"] == 8
    # rounding only: sums of <= 60 float64 terms per step (eps 1.1e-16 x 60), 8 steps of SGD with momentum on a
    # well-conditioned tiny CNN: ~1e-13 expected; a wrong weight or split would show at 1e-3
    assert r["rel_diff"] < 1e-10, r


def test_the_documented_user_loop_equals_one_process():
    """docs/data_parallel.md's own loop (DataParallel, sizes [10, 20, 30], 20 steps) under mpiexec -n 3 gives the
    weights and per-step losses of one process on the global batch (float64)."""
    r = _result(run_mpi(3, "dp_user_loop.py", timeout=180))
    assert r["sizes"] == [10, 20, 30] and r["steps"] == 20
    # rounding only: per step, sums of <= 60 float64 terms (eps 1.1e-16 x 60) and a 3-term allreduce
    assert r["rel_diff"] < 1e-12 and r["loss_diff"] < 1e-12, r


def test_user_loop_hands_the_policy_compute_without_the_sync_batchnorm_waits():
    """DataParallel.train_step with sync_batchnorm in virtual time: b = 16 and 48, 10 ms a sample; the small
    replica waits 320 ms at the BatchNorm reductions inside its pass, which must count as wait."""
    cost = 0.01
    r = _result(run_mpi(2, "dp_sync_bn_timing.py", timeout=180, env={"VIRTUAL_COST_S": str(cost)}))
    # on the virtual clock a pass is exactly b * cost; everything else is 1e-7 s per clock reading (a few
    # hundred a step: < 1e-4 s against 0.16 s), so 1% bounds it. Counting the wait as compute reads 3x.
    for per_sample in r["seconds_per_sample"]:
        assert per_sample == pytest.approx([cost, cost], rel=0.01), r
    (_, _, _, compute0, wait0), (_, _, _, compute1, _) = r["totals"]
    assert compute0 == pytest.approx(3 * 16 * cost, rel=0.01) and compute1 == pytest.approx(3 * 48 * cost, rel=0.01)
    assert wait0 == pytest.approx(3 * 32 * cost, rel=0.01), r


def test_model_fit_with_a_communicator_equals_one_process():
    """Model.fit(comm=make_comm("auto")) under mpiexec -n 2: equal halves of each global batch of 12, the
    launcher's loop; the weights and the epoch losses of one process on the same batches (float64)."""
    r = _result(run_mpi(2, "fit_with_comm.py", timeout=180))
    assert r["ranks"] == 2 and r["agree"] and r["splits"] == [[2, [6, 6]]] * 8     # 2 epochs of 4 steps
    # rounding only: per step, sums of <= 12 float64 terms (eps 1.1e-16 x 12) and a 2-term allreduce, 8 steps
    assert r["rel_diff"] < 1e-12 and r["loss_diff"] < 1e-12, r


def test_uniform_weighting_breaks_the_invariant():
    r = _result(run_mpi(3, "invariant.py", ["uniform", "1,2,3", 60, 4], timeout=180))
    assert r["sizes"] == [10, 20, 30]
    assert r["rel_diff"] > 1e-4


def test_invariant_two_ranks_odd_split():
    r = _result(run_mpi(2, "invariant.py", ["proportional", "1,3.7", 37, 3], timeout=180))
    assert sum(r["sizes"]) == 37 and r["sizes"][0] < r["sizes"][1]
    assert r["rel_diff"] < 1e-10


@pytest.mark.parametrize("non_blocking", ["0", "1"])
def test_invariant_with_synchronized_batchnorm(non_blocking):
    """BatchNorm after convolutions, inside a residual block and after an FC; 3 replicas of speeds 1:2:3:
    weights AND running statistics equal one process's on the global batch."""
    r = _result(run_mpi(3, "invariant.py", ["proportional", "1,2,3", 60, 4, f"non_blocking={non_blocking}",
                                             "model=bn", "sync=1"], timeout=180))
    assert r["sizes"] == [10, 20, 30]
    assert r["rel_diff"] < 1e-10 and r["stats_rel_diff"] < 1e-10, r


def test_invariant_for_a_vision_transformer():
    """LayerNorm (per-sample statistics: nothing to synchronize), attention, GELU and residuals: 3 replicas
    of speeds 1:2:3 equal one process on the global batch."""
    r = _result(run_mpi(3, "invariant.py", ["proportional", "1,2,3", 60, 4, "model=vit"], timeout=180))
    assert r["sizes"] == [10, 20, 30]
    assert r["rel_diff"] < 1e-10, r


def test_local_batchnorm_breaks_the_invariant():
    r = _result(run_mpi(3, "invariant.py", ["proportional", "1,2,3", 60, 4, "model=bn", "sync=0"], timeout=180))
    assert r["rel_diff"] > 1e-6 and r["stats_rel_diff"] > 1e-6, r


def test_glue_standin_synchronized_batchnorm_in_a_mixed_gpu_cpu_job():
    """Rank 0 on the GPU backend over the host stand-in (tests/gpu_standin: glue, not a GPU), ranks 1-2 on
    the CPU: the synchronized statistics cross backends through host buffers."""
    import gpu_standin
    env = {k: v for k, v in gpu_standin.subprocess_env(PYDTNN_STANDIN_DEVICES=1).items()
           if k in ("PYTHONPATH", "PYDTNN_GPU_STANDIN", "PYDTNN_STANDIN_DEVICES")}
    r = _result(run_mpi(3, "invariant.py", ["proportional", "1,2,3", 60, 4, "model=bn", "sync=1",
                                             "devices=gpu,cpu,cpu"], timeout=180, env=env))
    assert r["rel_diff"] < 1e-10 and r["stats_rel_diff"] < 1e-10, r


BN_MODEL = """
from pydtnn.layers import FC, AdditionBlock, BatchNormalization, Conv2D, Flatten, Input, MaxPool2D, Relu


def create_model(model):
    model.add(Input(shape=(3, 8, 8)))
    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1))
    model.add(BatchNormalization())
    model.add(Relu())
    model.add(AdditionBlock([Conv2D(nfilters=4, filter_shape=(3, 3), padding=1), BatchNormalization(), Relu()], []))
    model.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    model.add(Flatten())
    model.add(FC(shape=(8,)))
    model.add(BatchNormalization())
    model.add(Relu())
    model.add(FC(shape=(10,), activation="softmax"))
    return model
"""


def test_launcher_sync_batchnorm_three_heterogeneous_replicas_equal_one_process(tmp_path):
    model = tmp_path / "bnnet.py"
    model.write_text(BN_MODEL)
    common = ["--model", str(model), "--dataset", "synthetic", "--synthetic_samples", "180", "--dtype", "float64",
              "--num_epochs", "2", "--seed", "3", "--learning_rate", "0.05", "--learning_rate_scaling", "false",
              "--lr_schedulers", "", "--progress_bar", "false"]
    runs = {"seq": (1, ["--batch_size", "60"])}
    for sync in ("true", "false"):
        runs[sync] = (3, ["--parallel", "data", "--global_batch_size", "60", "--balance", "static",
                          "--replica_speeds", "1,2,3", "--sync_batchnorm", sync])
    weights = {}
    for name, (n, extra) in runs.items():
        weights[name] = tmp_path / f"{name}.npz"
        r = run_mpi(n, LAUNCHER, common + extra + ["--save_weights_and_bias_filename", weights[name]], timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    seq, synced, local = (np.load(weights[k]) for k in ("seq", "true", "false"))
    stats = [k for k in seq.files if k.endswith(("/mean", "/var"))]
    assert len(stats) == 6, seq.files
    for k in seq.files:
        assert np.allclose(seq[k], synced[k], rtol=1e-10, atol=1e-12), k
    assert max(float(np.max(np.abs(seq[k] - local[k]))) for k in stats) > 1e-6


COMMON = ["--model", "simplecnn", "--dataset", "synthetic", "--synthetic_samples", "300", "--dtype", "float64",
          "--num_epochs", "2", "--seed", "3", "--learning_rate", "0.05", "--learning_rate_scaling", "false",
          "--lr_schedulers", "", "--progress_bar", "false"]


def test_launcher_sequential_equals_three_heterogeneous_replicas(tmp_path):
    seq, par = tmp_path / "seq.npz", tmp_path / "par.npz"
    r1 = run_mpi(1, LAUNCHER, COMMON + ["--batch_size", "60", "--save_weights_and_bias_filename", seq], timeout=300)
    assert r1.returncode == 0, r1.stdout + r1.stderr
    r3 = run_mpi(3, LAUNCHER, COMMON + ["--parallel", "data", "--global_batch_size", "60", "--balance", "static",
                                         "--replica_speeds", "1,2,3", "--save_weights_and_bias_filename", par],
                 timeout=300)
    assert r3.returncode == 0, r3.stdout + r3.stderr
    assert "split as [10, 20, 30]" in r3.stdout
    a, b = np.load(seq), np.load(par)
    assert sorted(a.files) == sorted(b.files) and len(a.files) >= 4
    for k in a.files:
        assert np.allclose(a[k], b[k], rtol=1e-10, atol=1e-12), k
    assert not np.array_equal(a[a.files[0]], np.zeros_like(a[a.files[0]]))


def test_rank_killed_mid_training_ends_the_job(tmp_path):
    token = f"killtoken{os.getpid()}"
    cmd = mpi_command(3, LAUNCHER, ["--parallel", "data", "--synthetic_samples", "768", "--num_epochs", "200",
                                    "--batch_size", "16", "--progress_bar", "false",
                                    "--history_file", str(tmp_path / f"{token}.csv")])
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / f"{token}.csv").exists() and time.monotonic() < deadline:
            time.sleep(0.2)                      # training is under way once epoch 1 is written
        ranks = [p for p in processes_with(token) if p != proc.pid and "mpiexec" not in
                 open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[0].decode()]
        assert len(ranks) >= 3, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        t0 = time.monotonic()
        proc.wait(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert elapsed < 30, elapsed


# The README's 3-rank example (its flags, on a small model and synthetic data, in float64): default flags,
# learning-rate scaling included, so P heterogeneous replicas equal one process on the same global batch.
README_EXAMPLE = ["--parallel", "data", "--global_batch_size", "96", "--balance", "static", "--replica_speeds",
                  "1,2,3", "--num_epochs", "2", "--learning_rate", "0.1", "--validation_split", "0.1"]
SMALL = ["--model", "simplecnn", "--dataset", "synthetic", "--synthetic_samples", "240", "--dtype", "float64",
         "--seed", "5", "--progress_bar", "false"]


def test_readme_example_with_default_flags_equals_one_process_on_the_global_batch(tmp_path):
    readme = open(REPO_ROOT / "README.md").read()
    for flags in ("--parallel data --global_batch_size 96 --balance static", "--replica_speeds 1,2,3",
                  "--learning_rate 0.1 --validation_split 0.1"):
        assert flags in readme, flags                      # the example still reads so
    seq, par = tmp_path / "seq.npz", tmp_path / "par.npz"
    r1 = run_mpi(1, LAUNCHER, SMALL + ["--batch_size", "96", "--num_epochs", "2", "--learning_rate", "0.1",
                                       "--validation_split", "0.1", "--save_weights_and_bias_filename", seq],
                 timeout=300)
    assert r1.returncode == 0, r1.stdout + r1.stderr
    r3 = run_mpi(3, LAUNCHER, SMALL + README_EXAMPLE + ["--save_weights_and_bias_filename", par], timeout=300)
    assert r3.returncode == 0, r3.stdout + r3.stderr
    assert "split as [16, 32, 48]" in r3.stdout
    assert "learning rate in force" not in r3.stdout             # the flag's rate, as printed with the flags
    a, b = np.load(seq), np.load(par)
    assert sorted(a.files) == sorted(b.files) and len(a.files) >= 4
    for k in a.files:
        assert np.allclose(a[k], b[k], rtol=1e-10, atol=1e-12), k


def test_linear_scaling_applies_when_the_global_batch_grows_with_the_replicas_and_says_so():
    r = run_mpi(3, LAUNCHER, SMALL + ["--parallel", "data", "--batch_size", "16", "--num_epochs", "1",
                                      "--learning_rate", "0.1", "--lr_schedulers", ""], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("learning rate in force")]
    assert line == ["learning rate in force: 0.3 (--learning_rate 0.1 x 3 replicas: linear scaling, as the global "
                    "batch is --batch_size 16 x 3; --learning_rate_scaling false keeps 0.1)"], r.stdout


def test_glue_standin_cuda_graphs_three_gpu_replicas_equal_one_process(tmp_path):
    """--cuda_graphs on three heterogeneous GPU replicas over the host stand-in (tests/gpu_standin: glue, not a
    GPU; it replays a captured graph as a device would): each replica's forward and backward replay one
    graph, the gradients are reduced through MPI after it, and the run still equals one process on the
    global batch."""
    import gpu_standin
    env = {k: v for k, v in gpu_standin.subprocess_env(PYDTNN_STANDIN_DEVICES=3).items()
           if k in ("PYTHONPATH", "PYDTNN_GPU_STANDIN", "PYDTNN_STANDIN_DEVICES")}
    seq, par = tmp_path / "seq.npz", tmp_path / "par.npz"
    r1 = run_mpi(1, LAUNCHER, COMMON + ["--batch_size", "60", "--save_weights_and_bias_filename", seq], timeout=300)
    assert r1.returncode == 0, r1.stdout + r1.stderr
    r3 = run_mpi(3, LAUNCHER, COMMON + ["--parallel", "data", "--global_batch_size", "60", "--balance", "static",
                                         "--replica_speeds", "1,2,3", "--enable_gpu", "true", "--cuda_graphs", "true",
                                         "--save_weights_and_bias_filename", par], timeout=300, env=env)
    assert r3.returncode == 0, r3.stdout + r3.stderr
    # 2 epochs of 5 steps: 2 eager, the 3rd captured, 8 replays (rank 0's count, said by rank 0)
    assert "CUDA graphs: 8 step(s) replayed, 1 capture(s)" in r3.stdout, r3.stdout
    a, b = np.load(seq), np.load(par)
    assert sorted(a.files) == sorted(b.files) and len(a.files) >= 4
    for k in a.files:
        assert np.allclose(a[k], b[k], rtol=1e-10, atol=1e-12), k
