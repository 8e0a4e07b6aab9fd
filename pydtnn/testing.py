"""Gradient checking for layers and models: backward against central finite differences, in float64.

    from pydtnn.testing import check_gradients
    errors = check_gradients(MyLayer(), (3, 8, 8), backend="cpu")
    # {"x": 2.1e-11, "my_layer/scale": 8.0e-12}; AssertionError naming the worst tensor if any > rtol

The scalar checked is L = sum(y * r) for a fixed random r, so every output element's gradient path counts.
The relative error of one coordinate is |analytic - numeric| / max(|analytic| + |numeric|, 1e-4): the
floor keeps coordinates whose true gradient is ~0 from turning round-off into huge ratios.
"""
from __future__ import annotations

import numpy as np

ERROR_FLOOR = 1e-4


def _relative(analytic, numeric):
    return abs(analytic - numeric) / max(ERROR_FLOOR, abs(analytic) + abs(numeric))


def _central_difference(f, eps, stencil):
    """df/dt at t=0 of f(t): 2-point (error ~eps^2) or 4-point (error ~eps^4) central difference."""
    d1 = f(eps) - f(-eps)
    if stencil == 2:
        return d1 / (2 * eps)
    return (8 * d1 - (f(2 * eps) - f(-2 * eps))) / (12 * eps)


def gradient_errors(model, x, *, n_coords=None, eps=1e-4, seed=0, training=True, reseed=True,
                    stencil=4) -> dict:
    """{"x": e, "layer_name/param": e, ...}: the max relative error of `model.backward` against central
    differences, for the input and for every parameter tensor of the model.

    `n_coords` samples that many coordinates per tensor (None: every coordinate). `stencil` 4 uses the
    4-point central difference (truncation ~eps^4, so a larger eps and less round-off), 2 the 2-point
    one (half the forwards, truncation ~eps^2). `reseed` reseeds the
    backend before each forward, so that random layers (Dropout) draw the same mask every time. The model
    should be float64: in float32 finite differences carry errors of ~1e-3.
    """
    rng = np.random.default_rng(seed)
    be = model.backend
    x = np.array(x, dtype=np.float64)

    def run(xv):
        if reseed:
            be.seed(1234)
        return be.to_numpy(model.forward(xv, training=training))

    r = rng.standard_normal(run(x).shape)

    def loss(xv):
        return float((run(xv) * r).sum())

    def coords(size):
        return range(size) if n_coords is None or n_coords >= size else rng.choice(size, n_coords, replace=False)

    run(x)                                    # the forward whose caches backward uses
    dx = be.to_numpy(model.backward(be.asarray(r)))
    grads = be.to_numpy(model.grads).copy()
    params = model.params

    errors = {}
    worst = 0.0
    for flat in coords(x.size):
        idx = np.unravel_index(int(flat), x.shape)

        def shifted_x(t):
            xt = x.copy()
            xt[idx] += t
            return loss(xt)
        worst = max(worst, _relative(dx[idx], _central_difference(shifted_x, eps, stencil)))
    errors["x"] = worst
    for key, (offset, size) in model.param_offsets.items():
        worst = 0.0
        for k in coords(size):
            i = offset + int(k)
            old = float(params[i])

            def shifted_param(t):
                params[i] = old + t
                return loss(x)
            numeric = _central_difference(shifted_param, eps, stencil)
            params[i] = old
            worst = max(worst, _relative(float(grads[i]), numeric))
        errors[key] = worst
    return errors


def check_gradients(layer, input_shape, *, batch_size=2, backend="cpu", seed=0, rtol=1e-6,
                    eps=1e-4, n_coords=None, training=True, stencil=4) -> dict:
    """Check a layer's backward (dx and every parameter gradient) against finite differences.

    Builds `Input(input_shape)` + `layer` in float64 on `backend` (a name, "cpu" or "gpu", or a float64
    Backend object), feeds a batch of `batch_size` standard-normal samples drawn from `seed`, and
    returns {tensor name: max relative error}
    ("x" for the input, "layer_name/param" for parameters). Raises AssertionError naming the worst tensor
    when any error exceeds `rtol`, or when the layer modified its input or its incoming gradient in place.
    The defaults (4-point differences, eps 1e-4) keep round-off and truncation near 1e-9 for smooth
    layers. For piecewise-linear ones (ReLU, max pooling) a kink or a tie within 2 * eps of the sample
    gives a large error that is not a bug: try another seed.
    Give it a fresh layer instance (a layer belongs to one model). `n_coords`, `eps`, `training`,
    `stencil`: see `gradient_errors`.
    """
    from pydtnn.layers.input import Input
    from pydtnn.model import Model

    model = Model(backend=backend, dtype="float64", seed=seed)
    if model.dtype != np.float64:
        raise ValueError(f"check_gradients needs a float64 backend, got {model.dtype}")
    model.add(Input(shape=input_shape))
    model.add(layer)
    # a stream apart from gradient_errors' (seeded `seed`): r == x would make a degenerate test
    x = np.random.default_rng((seed, 1)).standard_normal((int(batch_size),) + tuple(input_shape))
    errors = gradient_errors(model, x, n_coords=n_coords, eps=eps, seed=seed, training=training, stencil=stencil)
    worst = max(errors, key=lambda k: np.inf if np.isnan(errors[k]) else errors[k])    # NaN is the worst
    if not errors[worst] <= rtol:
        others = ", ".join(f"{k}: {v:.2e}" for k, v in errors.items())
        raise AssertionError(f"check_gradients({layer.type_name} {layer.name!r}): the gradient of {worst!r} "
                             f"disagrees with finite differences, max relative error {errors[worst]:.3e} > "
                             f"rtol {rtol:.1e} (all: {others})")
    _check_inputs_untouched(model, layer, x, training)
    return errors


def _check_inputs_untouched(model, layer, x, training):
    """The layer must not write into the array it is given (blocks share it between paths)."""
    be, xp = model.backend, model.xp
    h = model.layers[0].forward(be.asarray(x), training)           # what the model hands the layer
    seen = be.to_user(h) if layer._needs_boundary(h) else h        # ... in the layout the layer sees
    before = seen.copy()
    be.seed(1234)
    y = layer.forward(seen, training)
    if not bool(xp.array_equal(seen, before)):
        raise AssertionError(f"check_gradients({layer.type_name} {layer.name!r}): forward modified its input x")
    dy = be.asarray(np.random.default_rng(1).standard_normal(tuple(y.shape)))
    dy_before = dy.copy()
    layer.backward(dy)
    if not bool(xp.array_equal(dy, dy_before)):
        raise AssertionError(f"check_gradients({layer.type_name} {layer.name!r}): backward modified its "
                             f"incoming gradient dy")
