"""Heterogeneity-correct synchronized BatchNorm (--sync_batchnorm).

The backend level runs here, in one process: replicas of unequal local batches run one after the other,
and a stand-in communicator gives each of them the sum of what all of them contributed (first pass:
record every replica's contribution; second pass: reduce). The result must be what one call on the
concatenated batch gives. The real multi-process invariant is in tests/parallel/test_data_parallel.py.
"""
import numpy as np
import pytest

from pydtnn.backends import get_backend
from pydtnn.parallel.sync_batchnorm import BatchNormSync


class Recording:
    """allreduce_sum_ keeps a copy of what it is given and returns it unchanged (a replica's share)."""
    def __init__(self):
        self.seen = []

    def allreduce_sum_(self, buf):
        self.seen.append(buf.copy())
        return buf


class Summing:
    """allreduce_sum_ returns the sum of every replica's share, recorded beforehand."""
    def __init__(self, total):
        self.total = total

    def allreduce_sum_(self, buf):
        assert buf.shape == self.total.shape and buf.dtype == np.float64
        buf[...] = self.total
        return buf


def _backend(name):
    return get_backend(name, "float64") if isinstance(name, str) else name


def _reduced(fn, nreplicas):
    """Run fn(r, sync) for every replica twice: once to record its share, once with the global sums."""
    shares = []
    for r in range(nreplicas):
        rec = Recording()
        fn(r, BatchNormSync(rec))
        assert len(rec.seen) == 1, "one reduction per call"
        shares.append(rec.seen[0])
    total = np.sum(shares, axis=0)
    return [fn(r, BatchNormSync(Summing(total))) for r in range(nreplicas)]


@pytest.mark.parametrize("shape", [(17, 3, 5, 4), (23, 7)], ids=["4d", "2d"])
def test_synced_batchnorm_of_unequal_shares_equals_the_whole_batch(backend_name, shape):
    be = _backend(backend_name)
    rng = np.random.default_rng(3)
    x = rng.normal(2.5, 1.7, shape)            # an offset: the shift to the shared centre is exercised
    dy = rng.normal(size=shape)
    c = shape[1]
    gamma, beta = rng.normal(size=c), rng.normal(size=c)
    center = rng.normal(2.0, 0.5, size=c)      # what the running mean would be: the same on every replica
    to_internal = be.to_internal if len(shape) == 4 else be.asarray
    to_user = (lambda a: be.to_numpy(be.to_user(a))) if len(shape) == 4 else be.to_numpy
    g, b = be.asarray(gamma), be.asarray(beta)
    y_ref, mean_ref, var_ref, ctx = be.batchnorm_forward_train(to_internal(x), g, b, 1e-5)
    dx_ref, dg_ref, db_ref = be.batchnorm_backward(to_internal(dy), ctx)
    cuts = [0, 1, 5, shape[0]]                 # local batches of 1, 4 and the rest
    parts = [slice(a, z) for a, z in zip(cuts[:-1], cuts[1:])]
    fwd = _reduced(lambda r, s: be.batchnorm_forward_train(to_internal(x[parts[r]]), g, b, 1e-5, sync=s,
                                                           center=be.asarray(center)), len(parts))
    bwd = _reduced(lambda r, s: be.batchnorm_backward(to_internal(dy[parts[r]]), fwd[r][3], sync=s), len(parts))
    y = np.concatenate([to_user(f[0]) for f in fwd])
    dx = np.concatenate([to_user(d[0]) for d in bwd])
    tol = 1e-12
    np.testing.assert_allclose(y, to_user(y_ref), rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, to_user(dx_ref), rtol=tol, atol=tol)
    for f in fwd:                                # every replica has the global statistics
        np.testing.assert_allclose(be.to_numpy(f[1]), be.to_numpy(mean_ref), rtol=tol, atol=tol)
        np.testing.assert_allclose(be.to_numpy(f[2]), be.to_numpy(var_ref), rtol=tol, atol=tol)
    # dgamma / dbeta are each replica's own share: the gradient reduction adds them up
    np.testing.assert_allclose(sum(be.to_numpy(d[1]) for d in bwd), be.to_numpy(dg_ref), rtol=tol, atol=tol)
    np.testing.assert_allclose(sum(be.to_numpy(d[2]) for d in bwd), be.to_numpy(db_ref), rtol=tol, atol=tol)
    # and a replica alone (local statistics) is NOT the whole batch: the test can fail
    y_local = to_user(be.batchnorm_forward_train(to_internal(x[parts[0]]), g, b, 1e-5)[0])
    assert np.max(np.abs(y_local - to_user(y_ref)[parts[0]])) > 1e-3


def test_layer_updates_running_statistics_with_the_global_count():
    """The unbiased variance uses the global count M (M / (M - 1)), not the local one."""
    from pydtnn import Model
    from pydtnn.layers import BatchNormalization, Input
    rng = np.random.default_rng(1)
    x = rng.normal(1.0, 2.0, (12, 5))
    whole = Model(backend="cpu", dtype="float64", seed=0)
    whole.add(Input(shape=(5,)))
    bn_whole = whole.add(BatchNormalization(momentum=0.5))
    whole.forward(x, training=True)
    halves = []
    for part in (slice(0, 2), slice(2, 12)):
        m = Model(backend="cpu", dtype="float64", seed=0)
        m.add(Input(shape=(5,)))
        halves.append((m, m.add(BatchNormalization(momentum=0.5)), part))
    shares = []
    for m, bn, part in halves:
        rec = Recording()
        bn.sync = BatchNormSync(rec)
        bn.mean[...] = 0
        m.forward(x[part], training=True)
        shares.append(rec.seen[0])
        bn.mean[...], bn.var[...] = 0, 1           # undo the first pass
    for m, bn, part in halves:
        bn.sync = BatchNormSync(Summing(np.sum(shares, axis=0)))
        m.forward(x[part], training=True)
        np.testing.assert_allclose(bn.mean, bn_whole.mean, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(bn.var, bn_whole.var, rtol=1e-13)
        assert bn.sync.count == 12
