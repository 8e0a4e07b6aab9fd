"""Gradient checking for layers and models: backward against central finite differences, in float64.

    from pydtnn.testing import check_gradients
    errors = check_gradients(MyLayer(), (3, 8, 8), backend="cpu")
    # {"x": 2.1e-11, "my_layer/scale": 8.0e-12}; AssertionError naming the worst tensor if any > rtol

The scalar checked is L = sum(y * r) for a fixed random r, so every output element's gradient path counts.
The relative error of one coordinate is |analytic - numeric| / max(|analytic| + |numeric|, 1e-4): the
floor keeps coordinates whose true gradient is ~0 from turning round-off into huge ratios.

What a layer cannot hide from `check_gradients`:
- a gradient right only at the initial parameters (a forgotten scale initialised to ones): the parameters
  are redrawn, standard normal, before checking (`randomize_params=False` keeps them);
- a backward that accumulates into its gradient buffers, or leaves one unwritten: the buffers are filled
  with garbage before each of two backward passes, which must then give the same gradients;
- a layer that declares `internal_layout = True` but computes as if NCHW: on a backend whose layout is
  not NCHW (the CPU's NHWC), its forward and backward are compared with the same layer run on an NCHW
  view of that backend (`pydtnn.backends.nchw_view`).
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


def _worst_difference(a, b, scale=0.0):
    """max |a - b| relative to max(max |b|, scale) (0 for equal arrays, inf where only one side is finite).
    `scale`: the size of the gradients around, so that a gradient that is zero in exact arithmetic (a
    convolution's bias before a normalization) compares its round-off with the others' size, not its own."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return np.inf
    if a.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b)
    if np.isnan(diff).any():
        return np.inf if not np.array_equal(np.isnan(a), np.isnan(b)) or np.isnan(a).any() else 0.0
    return float(diff.max() / max(np.abs(b).max(), scale, 1e-300))


# Two backward passes of one layer on one batch agree to rounding: deterministic kernels agree exactly,
# atomics or another cuDNN plan (weight gradients) within a few ulps of the largest gradient element.
# Garbage (1e3 standard normal) left in a buffer shows up as ~1e3 / the gradients' size.
REPEAT_TOL = 1e-9


def _backward_over_garbage(model, x, r, run, seed):
    """Forward, gradient buffers filled with garbage, backward: (dx or None, gradients). Done twice with
    different garbage; an AssertionError names the first tensor whose gradient differs between the two."""
    be = model.backend
    results = []
    for k in range(2):
        run(x)
        garbage = np.random.default_rng((seed, 7, k)).standard_normal(model.grads.shape) * 1e3
        model.grads[...] = be.asarray(garbage)
        dx = model.backward(be.asarray(r))
        results.append((None if dx is None else be.to_numpy(dx).copy(), be.to_numpy(model.grads).copy()))
    (dx1, g1), (dx2, g2) = results
    scale = _finite_max(g1)
    for key, (offset, size) in model.param_offsets.items():
        if _worst_difference(g2[offset:offset + size], g1[offset:offset + size], scale) > REPEAT_TOL:
            raise AssertionError(f"the gradient of {key!r} differs between two backward passes over gradient "
                                 f"buffers filled with different garbage: backward must overwrite every "
                                 f"gradient (`self.dw[...] = ...`), not accumulate into it or leave it unwritten")
    if dx1 is not None and _worst_difference(dx2, dx1) > REPEAT_TOL:
        raise AssertionError("dL/dx differs between two identical forward + backward passes: the layer "
                             "keeps state from one pass into the next")
    return dx1, g1


def _finite_max(a):
    a = np.abs(np.asarray(a, np.float64))
    a = a[np.isfinite(a)]
    return float(a.max()) if a.size else 0.0


def gradient_errors(model, x, *, n_coords=None, eps=1e-4, seed=0, training=True, reseed=True,
                    stencil=4) -> dict:
    """{"x": e, "layer_name/param": e, ...}: the max relative error of `model.backward` against central
    differences, for the input and for every parameter tensor of the model.

    Backward runs twice, each time over gradient buffers filled with garbage; an AssertionError names the
    tensor whose gradient differs between the two (a backward that accumulates, or writes nothing). An
    integer input (token ids) has no gradient: then there is no "x" entry.
    `n_coords` samples that many coordinates per tensor (None: every coordinate). `stencil` 4 uses the
    4-point central difference (truncation ~eps^4, so a larger eps and less round-off), 2 the 2-point
    one (half the forwards, truncation ~eps^2). `reseed` reseeds the
    backend before each forward, so that random layers (Dropout) draw the same mask every time. The model
    should be float64: in float32 finite differences carry errors of ~1e-3.
    """
    rng = np.random.default_rng(seed)
    be = model.backend
    x = np.asarray(x)
    ids = np.issubdtype(x.dtype, np.integer)
    x = x.copy() if ids else np.array(x, dtype=np.float64)

    def run(xv):
        if reseed:
            be.seed(1234)
        return be.to_numpy(model.forward(xv, training=training))

    r = rng.standard_normal(run(x).shape)

    def loss(xv):
        return float((run(xv) * r).sum())

    def coords(size):
        return range(size) if n_coords is None or n_coords >= size else rng.choice(size, n_coords, replace=False)

    dx, grads = _backward_over_garbage(model, x, r, run, seed)
    params = model.params

    errors = {}
    if not ids:
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
                    eps=1e-4, n_coords=None, training=True, stencil=4, randomize_params=True,
                    id_range=None) -> dict:
    """Check a layer's backward (dx and every parameter gradient) against finite differences.

    Builds `Input(input_shape)` + `layer` in float64 on `backend` (a name, "cpu" or "gpu", or a float64
    Backend object), feeds a batch of `batch_size` standard-normal samples drawn from `seed`, and
    returns {tensor name: max relative error}
    ("x" for the input, "layer_name/param" for parameters). Raises AssertionError naming the worst tensor
    when any error exceeds `rtol`, or when the layer modified its input or its incoming gradient in place,
    or when its backward accumulates into (or does not write) a gradient, or when it declares
    `internal_layout = True` and its results in the backend's layout differ from those in NCHW.

    `randomize_params` (default): every parameter is redrawn standard normal first, away from its
    initializer's value (ones, zeros), where a wrong backward can look right; False checks at the values
    the layer was initialised with. `id_range=K`: the input is integer ids in [0, K) (Embedding) instead,
    with no "x" entry. The defaults (4-point differences, eps 1e-4) keep round-off and truncation near
    1e-9 for smooth layers. For piecewise-linear ones (ReLU, max pooling) a kink or a tie within 2 * eps
    of the sample gives a large error that is not a bug: try another seed.
    Give it a fresh layer instance (a layer belongs to one model). `n_coords`, `eps`, `training`,
    `stencil`: see `gradient_errors`.
    """
    import copy
    twin_layer = copy.deepcopy(layer)        # the same fresh layer for the NCHW comparison
    model = _one_layer_model(layer, input_shape, backend, seed, id_range)
    if model.dtype != np.float64:
        raise ValueError(f"check_gradients needs a float64 backend, got {model.dtype}")
    if randomize_params:
        values = np.random.default_rng((seed, 2)).standard_normal(model.params.shape)
        model.params[...] = model.backend.asarray(values)
    # a stream apart from gradient_errors' (seeded `seed`): r == x would make a degenerate test
    data = np.random.default_rng((seed, 1))
    shape = (int(batch_size),) + tuple(input_shape)
    x = data.integers(0, id_range, shape) if id_range else data.standard_normal(shape)
    where = f"check_gradients({layer.type_name} {layer.name!r})"
    try:
        errors = gradient_errors(model, x, n_coords=n_coords, eps=eps, seed=seed, training=training,
                                 stencil=stencil)
    except AssertionError as e:
        raise AssertionError(f"{where}: {e}") from None
    worst = max(errors, key=lambda k: np.inf if np.isnan(errors[k]) else errors[k])    # NaN is the worst
    if not errors[worst] <= rtol:
        others = ", ".join(f"{k}: {v:.2e}" for k, v in errors.items())
        raise AssertionError(f"{where}: the gradient of {worst!r} disagrees with finite differences, max "
                             f"relative error {errors[worst]:.3e} > rtol {rtol:.1e} (all: {others})")
    _check_inputs_untouched(model, layer, x, training)
    if model.backend.layout != "NCHW":
        _check_layouts(model, twin_layer, input_shape, seed, id_range, x, training, where)
    return errors


def _one_layer_model(layer, input_shape, backend, seed, id_range):
    from pydtnn.layers.input import Input
    from pydtnn.model import Model

    model = Model(backend=backend, dtype="float64", seed=seed)
    model.add(Input(shape=input_shape, dtype="int64" if id_range else None))
    model.add(layer)
    return model


def _check_layouts(model, twin_layer, input_shape, seed, id_range, x, training, where):
    """The layer on the backend's own layout and on an NCHW view of the same backend: same numbers."""
    from pydtnn.backends.nchw_view import NCHWView

    be = model.backend
    twin = _one_layer_model(twin_layer, input_shape, NCHWView(be), seed, id_range)
    twin.params[...] = model.params
    for layer, twin_layer_ in zip(model.all_layers(), twin.all_layers()):
        for (name, value), twin_value in zip(layer.state_arrays().items(), twin_layer_.state_arrays().values()):
            twin_value[...] = value
    r = np.random.default_rng((seed, 3)).standard_normal((len(x),) + tuple(model.output_shape))
    outputs = []
    for m in (model, twin):
        be.seed(1234)
        y = be.to_numpy(m.forward(x, training=training)).copy()
        dx = m.backward(be.asarray(r))
        outputs.append((y, None if dx is None else be.to_numpy(dx).copy(), be.to_numpy(m.grads).copy()))
    (y, dx, g), (ty, tdx, tg) = outputs
    what = f"declares internal_layout = True but its {{}} on the {be.layout} layout of the {be.name} backend " \
           f"differs from the same computation in NCHW (max relative difference {{:.1e}}): use " \
           f"self.channel_axis (the backend's channel axis) instead of assuming axis 1"
    if _worst_difference(y, ty) > REPEAT_TOL:
        raise AssertionError(f"{where}: " + what.format("forward", _worst_difference(y, ty)))
    if dx is not None and _worst_difference(dx, tdx) > REPEAT_TOL:
        raise AssertionError(f"{where}: " + what.format("input gradient", _worst_difference(dx, tdx)))
    scale = _finite_max(tg)
    for key, (offset, size) in model.param_offsets.items():
        d = _worst_difference(g[offset:offset + size], tg[offset:offset + size], scale)
        if d > REPEAT_TOL:
            raise AssertionError(f"{where}: " + what.format(f"gradient of {key!r}", d))


def _check_inputs_untouched(model, layer, x, training):
    """The layer must not write into the array it is given (blocks share it between paths)."""
    be, xp = model.backend, model.xp
    h = model.layers[0].forward(x, training)                       # what the model hands the layer
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
