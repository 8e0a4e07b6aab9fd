"""DataParallel's contract without MPI (the mpiexec -n 3 user loop is in test_data_parallel.py)."""
import numpy as np
import pytest

from pydtnn import Model
from pydtnn.errors import ConfigError, ShapeError
from pydtnn.layers import FC, Input
from pydtnn.optimizers import SGD
from pydtnn.parallel import DataParallel
from pydtnn.parallel.comm import SerialComm


class RankOf3(SerialComm):
    """Rank `rank` of 3 for the split arithmetic (construction only broadcasts, a no-op here)."""
    def __init__(self, rank):
        super().__init__()
        self._rank = rank

    rank = property(lambda self: self._rank)
    size = property(lambda self: 3)


def _model():
    m = Model(dtype="float64", seed=0)
    m.add(Input(shape=(2,)))
    m.add(FC(shape=(3,), activation="softmax"))
    return m


@pytest.mark.parametrize("rank, rows", [(0, (0, 10)), (1, (10, 30)), (2, (30, 60))])
def test_local_slice_gives_each_rank_its_contiguous_rows(rank, rows):
    dp = DataParallel(_model(), SGD(), global_batch=60, comm=RankOf3(rank), sizes=[10, 20, 30])
    x, y = np.arange(120.0).reshape(60, 2), np.arange(60)
    xl, yl = dp.local_slice(x, y)
    assert dp.sizes == [10, 20, 30] and np.array_equal(yl, np.arange(*rows)) and np.array_equal(xl, x[rows[0]:rows[1]])


def test_defaults_split_equally_and_mistakes_are_one_line():
    assert DataParallel(_model(), SGD(), global_batch=61, comm=RankOf3(0)).sizes == [21, 20, 20]
    assert DataParallel(_model(), SGD(), global_batch=60, comm=RankOf3(0), policy="static").policy.wants_costs
    with pytest.raises(ConfigError, match="local batch sizes returned the split \\[10, 20\\]"):
        DataParallel(_model(), SGD(), global_batch=30, comm=RankOf3(0), sizes=[10, 20])
    dp = DataParallel(_model(), SGD(), global_batch=8)
    with pytest.raises(ShapeError, match="global batch of 8 rows"):
        dp.local_slice(np.zeros((7, 2)), np.zeros(7))
    with pytest.raises(ShapeError, match="holds 8 samples"):
        dp.train_step(np.zeros((7, 2)), np.zeros(7, int))


def test_one_process_step_is_plain_sgd_on_the_batch():
    rng = np.random.default_rng(1)
    x, labels = rng.standard_normal((8, 2)), rng.integers(0, 3, 8)
    a, b = _model(), _model()
    dp = DataParallel(a, SGD(learning_rate=0.5, momentum=0.0), global_batch=8)
    loss = dp.train_step(*dp.local_slice(x, labels))
    value, _ = b.compute_gradients(x, np.eye(3)[labels], "categorical_cross_entropy")
    expected = b.params - 0.5 * b.grads
    assert loss == value and np.array_equal(a.params, expected)


def test_step_record_packs_into_one_array_whose_sum_is_what_the_ranks_agree_on():
    from pydtnn.parallel.step_record import StepRecord
    a = StepRecord.of_replica(0, 2, np.array([0.5, 0.25]), 0.01, 0.002, signal=True)
    b = StepRecord.of_replica(1, 2, np.array([1.0, 0.5]), 0.03, 0.004, data_error=True, output_failed=True)
    packed = a.pack() + b.pack()                    # what the SUM-allreduce does
    assert packed.dtype == np.float64 and packed.shape == (2 + 2 * 2 + 4,)
    agreed = StepRecord.unpack(packed, nmetrics=1, nreplicas=2)
    assert agreed.loss == 1.5 and list(agreed.metrics) == [0.75] and list(agreed.means) == [1.5, 0.75]
    assert list(agreed.compute_s_per_sample) == [0.01, 0.03] and list(agreed.wait_s) == [0.002, 0.004]
    assert (agreed.data_error, agreed.signal, agreed.checkpoint_due, agreed.output_failed) == (True, True, False, True)
