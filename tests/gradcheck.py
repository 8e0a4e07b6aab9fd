"""The project's gradient tests on whole models: a thin wrapper of the public pydtnn.testing checker."""
from pydtnn.testing import gradient_errors


def numeric_vs_analytic(model, x, *, n_coords=25, eps=1e-5, seed=0, training=True, reseed=True):
    """Returns a list of (what, max relative error) over sampled coordinates of x and of every parameter."""
    return list(gradient_errors(model, x, n_coords=n_coords, eps=eps, seed=seed, training=training,
                                reseed=reseed, stencil=2).items())     # the 2-point differences these tests were tuned on


def assert_gradients(model, x, tol=1e-5, **kw):
    results = numeric_vs_analytic(model, x, **kw)
    bad = [(k, e) for k, e in results if not e < tol]
    assert not bad, f"gradient mismatch (max relative error): {bad}"
    assert len(results) >= 1
    return results
