"""Gradient accumulation (--accumulation_steps, `DataParallel(accumulation_steps=K)`): a replica's local batch run
as K micro-batches equals one pass on it, in one process and under mpiexec; BatchNorm sees each micro-batch's
statistics (with --sync_batchnorm those of the replicas' j-th micro-batches together).

Tolerances (float64, eps = 2.2e-16): with and without accumulation the gradient is the same sum of per-row
terms, added in another order and scaled by m_j / b_i (one rounding each): each gradient entry differs by at
most about b * eps relative to the sum of the magnitudes of its terms, b <= 60 rows here, so ~1e-14; a few SGD
steps (learning rate <= 0.1, momentum 0.9) carry that into the weights without growth beyond a small factor.
1e-12 on the weights leaves a margin of ~100 over that bound, and a real mistake (a micro-batch's gradient
counted twice, a weight m_j / b_i left out) moves the weights by 1e-3 or more. BatchNorm's 1/sqrt(var + eps)
divides by the rows' spread, which amplifies the rounding of the statistics: there 1e-10, as the other
BatchNorm equivalence tests of tests/parallel/test_data_parallel.py.
"""
import numpy as np
import pytest

from mpi_helpers import REPO_ROOT, describe, output_of_our_processes, run_mpi
from paths import sibling
from pydtnn import Model
from pydtnn.errors import ConfigError
from pydtnn.layers import FC, Conv2D, Flatten, Input, MaxPool2D
from pydtnn.metrics import get_metric
from pydtnn.optimizers import SGD
from pydtnn.parallel import DataParallel
from pydtnn.parallel.accumulation import AccumulatedGradients, check_steps, micro_batch_bounds, micro_batch_counts
from pydtnn.parallel.comm import BucketedReducer, SerialComm
from pydtnn.parallel.comm.base import DoneRequest
from pydtnn.parallel.emulation import EmulatedCost, SpeedEmulator

LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"


def _convnet():
    m = Model(dtype="float64", seed=3)
    m.add(Input(shape=(2, 6, 6)))
    m.add(Conv2D(nfilters=3, filter_shape=(3, 3), padding=1, activation="relu"))
    m.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    m.add(Flatten())
    m.add(FC(shape=(5,), activation="tanh"))
    m.add(FC(shape=(3,), activation="softmax"))
    return m


def _batches(b, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((b, 2, 6, 6)), rng.integers(0, 3, b)) for _ in range(steps)]


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# --- the micro-batches ------------------------------------------------------------------------------------

@pytest.mark.parametrize("b, n, sizes", [(10, 4, [3, 3, 2, 2]), (20, 4, [5] * 4), (3, 3, [1, 1, 1]), (7, 1, [7])])
def test_micro_batches_are_consecutive_rows_as_equal_as_possible_the_larger_first(b, n, sizes):
    bounds = micro_batch_bounds(b, n)
    assert [hi - lo for lo, hi in bounds] == sizes
    assert np.array_equal(np.concatenate([np.arange(b)[lo:hi] for lo, hi in bounds]), np.arange(b))


def test_a_replica_with_fewer_rows_than_steps_runs_one_row_each_and_none_without_samples():
    assert micro_batch_counts([10, 3, 0], 4) == [4, 3, 0]
    # synchronized BatchNorm: one count for all, the largest, at most the smallest local batch's rows
    assert micro_batch_counts([10, 20, 30], 4, common=True) == [4, 4, 4]
    assert micro_batch_counts([10, 3, 30], 4, common=True) == [3, 3, 3]


@pytest.mark.parametrize("steps", [0, -2, 1.5, True, "2"])
def test_steps_must_be_an_integer_of_at_least_one(steps):
    with pytest.raises(ConfigError, match="--accumulation_steps must be an integer of at least 1"):
        check_steps(steps)
    with pytest.raises(ConfigError, match="--accumulation_steps must be an integer of at least 1"):
        DataParallel(_convnet(), SGD(), global_batch=8, accumulation_steps=steps)


# --- one process: the Python API --------------------------------------------------------------------------

@pytest.mark.parametrize("b, steps", [(16, 4), (10, 4), (3, 4)])
def test_accumulated_steps_equal_one_pass_on_the_batch(b, steps):
    """K micro-batches (equal, unequal, more steps than rows) against one pass on the b rows, float64."""
    plain, accumulated = _convnet(), _convnet()
    one = DataParallel(plain, SGD(learning_rate=0.1, momentum=0.9), global_batch=b)
    many = DataParallel(accumulated, SGD(learning_rate=0.1, momentum=0.9), global_batch=b, accumulation_steps=steps)
    for x, labels in _batches(b, 3):
        loss_one, loss_many = one.train_step(x, labels), many.train_step(x, labels)
        assert loss_many == pytest.approx(loss_one, rel=1e-13)      # the whole batch's loss
    assert _rel(accumulated.params, plain.params) <= 1e-12
    assert _rel(accumulated.params, _convnet().params) > 1e-3       # it trained


def test_the_steps_metrics_are_those_of_the_whole_local_batch():
    x, labels = _batches(12, 1)[0]
    y = np.eye(3)[labels]
    accuracy = get_metric("categorical_accuracy")
    records = []
    for steps in (1, 5):
        dp = DataParallel(_convnet(), SGD(learning_rate=0.1), global_batch=12, accumulation_steps=steps)
        records.append(dp.step(x, y, 1.0, 1.0, metric_fns=[accuracy]))
    assert records[1].loss == pytest.approx(records[0].loss, rel=1e-13)
    assert records[1].metrics == pytest.approx(records[0].metrics, rel=1e-13)


class _RecordingEmulator:
    """An emulated device that records the rows of every pass it pads (what `SpeedEmulator.pad` is given)."""
    active = calibrated = True
    step = 0

    def __init__(self):
        self.padded = []

    def clock(self):
        return 0.0

    def pad(self, start, samples):
        self.padded.append(samples)
        return 0.0


def test_an_emulated_device_pays_its_fixed_cost_per_micro_batch_and_the_step_counts_them_all():
    emulator = _RecordingEmulator()
    dp = DataParallel(_convnet(), SGD(), global_batch=10, accumulation_steps=4, emulator=emulator)
    dp.train_step(*_batches(10, 1)[0])
    assert emulator.padded == [3, 3, 2, 2]
    # a real emulated cost of 20 ms a pass and nothing per sample: 4 micro-batches are >= 80 ms of compute
    fixed = SpeedEmulator(1.0, cost=EmulatedCost(fixed_s=0.02, per_sample_s=0.0))
    dp = DataParallel(_convnet(), SGD(), global_batch=10, accumulation_steps=4, emulator=fixed)
    x, labels = _batches(10, 1)[0]
    record = dp.step(x, np.eye(3)[labels], 1.0, 1.0)
    assert record.compute_s_per_sample[0] * 10 >= 4 * 0.02


# --- the overlapped reduction's buckets start on the whole sum -----------------------------------------------

class _TwoRanks(SerialComm):
    """Rank 0 of 2 whose bucket reductions record what each bucket held when it started (no partner)."""
    def __init__(self):
        super().__init__()
        self.started = []

    size = property(lambda self: 2)

    def iallreduce_sum_(self, array):
        self.started.append(array.copy())
        return DoneRequest()


def test_with_non_blocking_buckets_each_bucket_starts_holding_every_micro_batchs_gradient():
    """--non_blocking_mpi: the buckets overlap the last micro-batch's backward; each must start on the sum of
    all of them (a bucket started before the earlier micro-batches were added in would reduce a part)."""
    x, labels = _batches(10, 1)[0]
    started = {}
    for steps in (1, 4):
        comm = _TwoRanks()
        dp = DataParallel(_convnet(), SGD(learning_rate=0.1), global_batch=20, sizes=[10, 10], comm=comm,
                          non_blocking=True, accumulation_steps=steps)
        dp.reducer = BucketedReducer(comm, dp.model.grads, bucket_bytes=256)     # many buckets, layer by layer
        dp.train_step(x, labels)
        assert len(comm.started) == dp.reducer.nbuckets > 4
        started[steps] = np.concatenate(comm.started[::-1])       # bucket 0 is the buffer's end
    assert _rel(started[4], started[1]) <= 1e-12


def test_the_hook_adds_the_kept_sum_before_each_part_is_handed_on():
    grads = np.zeros(6)
    acc = AccumulatedGradients()
    acc.start(grads)
    grads[...] = 1.0
    acc.add()
    grads[...] = 2.0
    acc.add()
    seen = []
    hook = acc.ready(lambda lo: seen.append((lo, grads[lo:].copy())))
    grads[...] = 4.0                  # the last micro-batch's backward, from the end: [4:], then [1:]
    hook(4)
    hook(1)
    assert [lo for lo, _ in seen] == [4, 1] and all(np.array_equal(part, np.full(6 - lo, 7.0)) for lo, part in seen)
    acc.finish()
    assert np.array_equal(grads, np.full(6, 7.0))


# --- under mpiexec ------------------------------------------------------------------------------------------

COMMON = ["--model", "simplecnn", "--dataset", "synthetic", "--synthetic_samples", "300", "--dtype", "float64",
          "--num_epochs", "2", "--seed", "3", "--learning_rate", "0.05", "--learning_rate_scaling", "false",
          "--lr_schedulers", "", "--progress_bar", "false"]


def _one_process_weights(tmp_path):
    """COMMON's run in one process on the global batch of 60, without accumulation: the reference weights."""
    seq = tmp_path / "seq.npz"
    r = run_mpi(1, LAUNCHER, COMMON + ["--batch_size", "60", "--save_weights_and_bias_filename", seq], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return seq


def _assert_same_weights(path_a, path_b):
    """Every array of two weights files within 1e-12 of the first's largest magnitude (float64: the bound in
    this module's docstring)."""
    a, b = np.load(path_a), np.load(path_b)
    assert sorted(a.files) == sorted(b.files) and len(a.files) >= 4
    for k in a.files:
        assert float(np.max(np.abs(a[k] - b[k]))) <= 1e-12 * max(1.0, float(np.max(np.abs(a[k])))), k


@pytest.mark.mpi
def test_launcher_accumulation_on_three_heterogeneous_replicas_equals_one_process(tmp_path):
    """--accumulation_steps 4 on 3 replicas of 10, 20 and 30 samples (micro-batches 3+3+2+2, 4 x 5, 8+8+7+7),
    blocking and overlapped, equals one process on the global batch of 60 without accumulation."""
    seq = _one_process_weights(tmp_path)
    for non_blocking in ("false", "true"):
        par = tmp_path / f"par_{non_blocking}.npz"
        r = run_mpi(3, LAUNCHER, COMMON + ["--parallel", "data", "--global_batch_size", "60", "--balance", "static",
                                           "--replica_speeds", "1,2,3", "--accumulation_steps", "4",
                                           "--non_blocking_mpi", non_blocking,
                                           "--save_weights_and_bias_filename", par], timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert ("gradient accumulation: --accumulation_steps 4, one reduction and one update per step; "
                "micro-batches 10 = 3+3+2+2; 20 = 4 x 5; 30 = 8+8+7+7") in r.stdout, r.stdout
        _assert_same_weights(seq, par)


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["local", "sync"])
def test_batchnorm_with_accumulation_normalizes_each_micro_batch(mode):
    """local: BatchNorm normalizes each micro-batch by its own statistics: one process with 3 micro-batches
    of 4 rows equals 3 replicas of 4 rows each without accumulation (each normalizes its own rows).
    sync: with --sync_batchnorm, micro-batch j of the step is every replica's j-th micro-batch together (2, 4
    and 6 rows in 2 micro-batches: 1+2+3 rows, twice): one process on those rows, in that order, with 2
    micro-batches of 6 equals it, weights and running statistics."""
    r = run_mpi(3, "accumulation_batchnorm.py", [mode], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("diff ")][-1].split()
    params, stats, moved = float(line[1]), float(line[2]), float(line[3])
    assert params <= 1e-10, line
    if mode == "sync":
        assert stats <= 1e-10, line
    assert moved > 1e-4, line        # the statistics of the micro-batches are not those of the whole batch


@pytest.mark.mpi
def test_glue_standin_cuda_graphs_replay_every_micro_batch_and_equal_one_process(tmp_path):
    """--cuda_graphs with --accumulation_steps 2 on three heterogeneous GPU replicas over the host stand-in
    (tests/gpu_standin: glue, not a GPU): every micro-batch of 5, 10 and 15 rows replays its replica's one
    graph, the earlier micro-batch's gradients added after the replay, and the run equals one process."""
    import gpu_standin
    env = {k: v for k, v in gpu_standin.subprocess_env(PYDTNN_STANDIN_DEVICES=3).items()
           if k in ("PYTHONPATH", "PYDTNN_GPU_STANDIN", "PYDTNN_STANDIN_DEVICES")}
    seq, par = _one_process_weights(tmp_path), tmp_path / "par.npz"
    r = run_mpi(3, LAUNCHER, COMMON + ["--parallel", "data", "--global_batch_size", "60", "--balance", "static",
                                       "--replica_speeds", "1,2,3", "--enable_gpu", "true", "--cuda_graphs", "true",
                                       "--accumulation_steps", "2", "--save_weights_and_bias_filename", par],
                timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    # 2 epochs of 5 steps of 2 micro-batches: 2 eager passes, the 3rd captured, 18 replays (rank 0's count)
    assert "CUDA graphs: 18 micro-batch pass(es) replayed, 1 capture(s)" in r.stdout, r.stdout
    _assert_same_weights(seq, par)


# --- resume --------------------------------------------------------------------------------------------------

def test_resume_inherits_the_accumulation_and_is_bit_exact(tmp_path):
    """A checkpoint keeps --accumulation_steps with the run's flags: resumed without it, the run accumulates as
    before and ends on the uninterrupted run's weights, bit for bit."""
    launch = sibling("launch", "test_cli").launch
    common = ["--model", "simplecnn", "--dataset", "synthetic", "--synthetic_samples", "128", "--batch_size", "32",
              "--dtype", "float64", "--seed", "3", "--num_epochs", "2", "--lr_schedulers", "model_checkpoint",
              "--model_checkpoint_save_freq", "1", "--progress_bar", "false"]
    full, resumed = tmp_path / "full.npz", tmp_path / "resumed.npz"
    r = launch(*common, "--accumulation_steps", "3", "--checkpoint_dir", tmp_path / "a",
               "--save_weights_and_bias_filename", full)
    assert r.returncode == 0, r.stderr
    assert "micro-batches 32 = 11+11+10" in r.stdout, r.stdout
    r = launch(*common, "--checkpoint_dir", tmp_path / "c", "--resume", tmp_path / "a" / "epoch_0001.npz",
               "--save_weights_and_bias_filename", resumed)
    assert r.returncode == 0, r.stderr
    assert "gradient accumulation: --accumulation_steps 3" in r.stdout, r.stdout        # the checkpoint's
    a, b = np.load(full), np.load(resumed)
    assert sorted(a.files) == sorted(b.files) and len(a.files) >= 4
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k


# --- memory caps: the most rows of one pass ----------------------------------------------------------------

def test_a_memory_cap_below_the_batch_trains_it_as_micro_batches_to_the_same_weights(tmp_path):
    """--max_local_batch 24 under a batch of 64 (once refused: caps that hold fewer samples than the batch):
    3 micro-batches of 22, 21 and 21 rows, the same weights as the batch at once (float64, 1e-12)."""
    launch = sibling("launch", "test_cli").launch
    common = ["--model", "simplecnn", "--dataset", "synthetic", "--synthetic_samples", "128", "--batch_size", "64",
              "--dtype", "float64", "--seed", "3", "--num_epochs", "1", "--lr_schedulers", "", "--progress_bar",
              "false"]
    weights = {}
    for caps in ([], ["--max_local_batch", "24"]):
        weights[bool(caps)] = tmp_path / f"w{len(caps)}.npz"
        r = launch(*common, *caps, "--save_weights_and_bias_filename", weights[bool(caps)])
        assert r.returncode == 0, r.stderr
    assert "memory caps 24 samples a pass, one reduction and one update per step; micro-batches 64 = 22+21+21" \
        in r.stdout, r.stdout
    _assert_same_weights(weights[False], weights[True])


def test_sync_batchnorm_refuses_a_split_whose_micro_batches_exceed_a_cap():
    """With --sync_batchnorm every replica runs the same number of micro-batches, at most the smallest local
    batch's rows: a replica that would need more to keep its cap is refused in one line."""
    assert micro_batch_counts([30, 30], 1, [10, None], common=True) == [3, 3]
    with pytest.raises(ConfigError, match=r"at most 2 in the split \[2, 30\].*replica 1's 30 samples in 2 "
                                          r"micro-batches exceed its memory cap of 10"):
        micro_batch_counts([2, 30], 1, [None, 10], common=True)


@pytest.mark.mpi
def test_under_mpiexec_a_synchronized_split_over_a_cap_is_one_line_before_the_banner():
    """The split [4, 56] with --sync_batchnorm: at most 4 micro-batches each (replica 0's rows), so replica 1's
    56 would be passes of 14 over its cap of 10: refused on every rank, status 2, before anything is printed."""
    r = run_mpi(2, LAUNCHER, ["--model", "simplecnn", "--synthetic_samples", "120", "--parallel", "data",
                              "--global_batch_size", "60", "--balance", "static", "--replica_speeds", "1,14",
                              "--max_local_batch", "100,10", "--sync_batchnorm", "true", "--num_epochs", "1",
                              "--progress_bar", "false"], timeout=120)
    lines = output_of_our_processes(r)
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1, describe(r)
    assert lines[0].startswith("pydtnn: error: --sync_batchnorm: every replica runs the same number of "
                               "micro-batches, at most 4 in the split [4, 56]") and "cap of 10" in lines[0], lines
