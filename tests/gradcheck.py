"""Central finite differences for whole models in float64: dL/dx and dL/dparams for L = sum(y * r)."""
import numpy as np


def numeric_vs_analytic(model, x, *, n_coords=25, eps=1e-5, seed=0, training=True, reseed=True):
    """Returns a list of (what, max relative error) over sampled coordinates of x and of every parameter."""
    rng = np.random.default_rng(seed)
    be = model.backend

    def run(xv):
        if reseed:
            be.seed(1234)             # the same dropout mask for every evaluation
        return be.to_numpy(model.forward(xv, training=training))

    y = run(x)
    r = rng.standard_normal(y.shape)
    loss = lambda xv: float((run(xv) * r).sum())
    run(x)
    dx = be.to_numpy(model.backward(be.asarray(r)))
    grads = be.to_numpy(model.grads).copy()
    params = model.params
    results = []

    def rel(a, n):
        return abs(a - n) / max(1e-4, abs(a) + abs(n))

    # input
    worst = 0.0
    for flat in rng.choice(x.size, size=min(n_coords, x.size), replace=False):
        idx = np.unravel_index(flat, x.shape)
        xp_, xm = x.copy(), x.copy()
        xp_[idx] += eps
        xm[idx] -= eps
        num = (loss(xp_) - loss(xm)) / (2 * eps)
        worst = max(worst, rel(dx[idx], num))
    results.append(("x", worst))
    # parameters, per named tensor
    for key, (offset, size) in model.param_offsets.items():
        worst = 0.0
        for k in rng.choice(size, size=min(n_coords, size), replace=False):
            i = offset + int(k)
            old = float(params[i])
            params[i] = old + eps
            lp = loss(x)
            params[i] = old - eps
            lm = loss(x)
            params[i] = old
            worst = max(worst, rel(grads[i], (lp - lm) / (2 * eps)))
        results.append((key, worst))
    return results


def assert_gradients(model, x, tol=1e-5, **kw):
    results = numeric_vs_analytic(model, x, **kw)
    bad = [(k, e) for k, e in results if not e < tol]
    assert not bad, f"gradient mismatch (max relative error): {bad}"
    assert len(results) >= 1
    return results
