"""The sequence and modern layers (issue 21): gradients on every backend, forward against plain NumPy
references, and against PyTorch in float64 where it is installed (`pip install torch==2.13.0`)."""
import math

import numpy as np
import pytest

from pydtnn import Model
from pydtnn.activations import GELU, SiLU, Softmax
from pydtnn.errors import ConfigError, DatasetError, ShapeError
from pydtnn.layers import (FC, ConvTranspose2D, Embedding, GroupNorm, ImageToSequence, Input, LayerNorm,
                           MultiHeadAttention, PositionEmbedding, Upsample2D)
from pydtnn.testing import check_gradients

# (factory, per-sample input shape, check_gradients options). Attention: eps 1e-3, because some of its
# gradients are exactly zero (a key bias shifts a whole row of scores, which softmax ignores) and the
# 4-point difference's round-off on them, ~1e-16 |L| / eps, must stay under rtol * the 1e-4 floor.
GRADIENT_CASES = [
    ("LayerNorm_image", lambda: LayerNorm(), (3, 4, 5), {}),
    ("LayerNorm_sequence", lambda: LayerNorm(), (4, 6), {}),
    ("LayerNorm_features", lambda: LayerNorm(epsilon=1e-3), (6,), {}),
    ("GroupNorm_image", lambda: GroupNorm(2), (4, 3, 5), {}),
    ("GroupNorm_features", lambda: GroupNorm(3), (6,), {}),
    ("GELU", lambda: GELU(), (2, 3, 5), {}),
    ("GELU_tanh", lambda: GELU("tanh"), (4, 3), {}),
    ("SiLU", lambda: SiLU(), (2, 3, 4), {}),
    ("Embedding", lambda: Embedding(7, 3), (5,), {"id_range": 7}),
    ("MultiHeadAttention", lambda: MultiHeadAttention(8, 2), (5, 8), {"eps": 1e-3}),
    ("MultiHeadAttention_causal_dropout", lambda: MultiHeadAttention(8, 2, causal=True, dropout=0.3), (5, 8),
     {"eps": 1e-3}),
    ("ConvTranspose2D_stride2", lambda: ConvTranspose2D(3, 3, stride=2, padding=1, output_padding=1), (2, 4, 5), {}),
    ("ConvTranspose2D_rect", lambda: ConvTranspose2D(2, (2, 3), use_bias=False), (3, 4, 5), {}),
    ("Upsample2D_nearest", lambda: Upsample2D(2), (2, 3, 4), {}),
    ("Upsample2D_bilinear", lambda: Upsample2D((2, 3), "bilinear"), (2, 3, 4), {}),
    ("FC_sequence", lambda: FC(4), (3, 5), {}),
    ("Softmax_sequence", lambda: Softmax(), (3, 5), {}),
    ("PositionEmbedding", lambda: PositionEmbedding(), (3, 5), {}),
    ("ImageToSequence", lambda: ImageToSequence(), (3, 2, 4), {}),
]


@pytest.mark.parametrize("make,shape,options", [c[1:] for c in GRADIENT_CASES], ids=[c[0] for c in GRADIENT_CASES])
def test_gradients(make, shape, options, backend_name):
    errors = check_gradients(make(), shape, backend=backend_name, **options)
    assert errors and max(errors.values()) <= 1e-6


def run_layer(layer, x, backend="cpu", params=None, training=False, ids=False):
    """Input + layer in float64; `params` {name: value} set first. Returns (model, y as NumPy)."""
    model = Model(backend=backend, dtype="float64", seed=0)
    model.add(Input(shape=x.shape[1:], dtype="int64" if ids else None))
    model.add(layer)
    for name, value in (params or {}).items():
        layer.get_param(name)[...] = model.backend.asarray(value)
    return model, model.backend.to_numpy(model.forward(x, training=training))


rng = np.random.default_rng(42)


def randn(*shape):
    return rng.standard_normal(shape)


# ---------------------------------------------------------------------------------- NumPy references

def test_layernorm_matches_numpy(backend_name):
    x, g, b = randn(3, 4, 6), randn(6), randn(6)
    _, y = run_layer(LayerNorm(), x, backend_name, {"gamma": g, "beta": b})
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-5) * g + b, rtol=1e-12, atol=1e-12)
    img, gc, bc = randn(2, 3, 4, 5), randn(3), randn(3)          # images: over (C, H, W), gamma per channel
    _, y = run_layer(LayerNorm(), img, backend_name, {"gamma": gc, "beta": bc})
    mu, var = img.mean((1, 2, 3), keepdims=True), img.var((1, 2, 3), keepdims=True)
    ref = (img - mu) / np.sqrt(var + 1e-5) * gc[None, :, None, None] + bc[None, :, None, None]
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


def test_groupnorm_matches_numpy(backend_name):
    x, g, b = randn(2, 6, 3, 4), randn(6), randn(6)
    _, y = run_layer(GroupNorm(3), x, backend_name, {"gamma": g, "beta": b})
    xg = x.reshape(2, 3, 2, 3, 4)
    mu, var = xg.mean((2, 3, 4), keepdims=True), xg.var((2, 3, 4), keepdims=True)
    ref = ((xg - mu) / np.sqrt(var + 1e-5)).reshape(x.shape) * g[None, :, None, None] + b[None, :, None, None]
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


def _gelu_tanh_reference(xs):
    """0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), in 60-digit decimal arithmetic (1 + tanh(u) =
    2 e^(2u) / (e^(2u) + 1): no cancellation left at that precision), and the float64 error bound of the layer's
    sigmoid form: z = 2u carries <= 3 eps of relative error (its terms share a sign), which moves sigmoid(z) by
    |z| (1 - s) * 3 eps relative, plus ~8 roundings (exp, the quotient, the products)."""
    import decimal
    pi = decimal.Decimal("3.14159265358979323846264338327950288419716939937510582097494")
    ref, bound = [], []
    with decimal.localcontext(decimal.Context(prec=60)):
        c = (2 / pi).sqrt()
        for v in xs:
            d = decimal.Decimal(float(v))
            z = 2 * c * (d + decimal.Decimal("0.044715") * d * d * d)
            ez = z.exp()
            ref.append(float(d * ez / (ez + 1)))
            bound.append((3 * abs(float(z)) + 8) * np.finfo(np.float64).eps)
    return np.array(ref), np.array(bound)


def test_gelu_tanh_has_no_cancellation(backend_name):
    """Where tanh(u) is near -1 the textbook 1 + tanh(u) cancels (3 of 100 GPU points were off by 7.4e-9); the
    layer's form stays within its error bound of a 60-digit reference at every point of [-12, 12]."""
    x = np.linspace(-12, 12, 2401).reshape(1, -1)
    _, y = run_layer(GELU("tanh"), x, backend_name)
    ref, bound = _gelu_tanh_reference(x[0])
    assert np.all(np.abs(y[0] - ref) <= bound * np.abs(ref) + 1e-300)
    t = np.tanh(math.sqrt(2 / math.pi) * (x[0] + 0.044715 * x[0] ** 3))      # the cancelling form, for contrast
    assert np.max(np.abs(0.5 * x[0] * (1 + t) - ref) / np.maximum(np.abs(ref), 1e-300)) > 1e-6


def test_gelu_and_silu_match_formulas(backend_name):
    x = np.concatenate([np.linspace(-12, 12, 97), [-40.0, 40.0, 0.0]]).reshape(1, -1)
    phi = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x[0]])
    _, y = run_layer(GELU(), x, backend_name)
    # tails included, relative: erfc's exp(-x^2/2) carries ~|x^2/2| ulps of its argument (72 at x = -12)
    np.testing.assert_allclose(y[0], x[0] * phi, rtol=1e-13, atol=1e-300)
    _, y = run_layer(GELU("tanh"), x, backend_name)
    ref, bound = _gelu_tanh_reference(x[0])
    np.testing.assert_array_less(np.abs(y[0] - ref), bound * np.abs(ref) + 1e-300)
    _, y = run_layer(SiLU(), x, backend_name)
    np.testing.assert_allclose(y, x / (1 + np.exp(-x)), rtol=1e-14, atol=1e-300)


def test_activation_shortcuts():
    model = Model(dtype="float64")
    model.add(Input(shape=(3, 4)))
    model.add(FC(5, activation="gelu"))
    model.add(FC(2, activation="silu"))
    assert [type(l).__name__ for l in model.layers] == ["Input", "FC", "GELU", "FC", "SiLU"]
    assert model.output_shape == (3, 2)
    with pytest.raises(ConfigError, match="approximate"):
        GELU("erf")


def test_embedding_is_a_table_lookup(backend_name):
    ids = np.array([[0, 3, 3, 6], [1, 1, 2, 0]])
    table = randn(7, 3)
    model, y = run_layer(Embedding(7, 3), ids, backend_name, {"weights": table}, ids=True)
    np.testing.assert_array_equal(y, table[ids])
    dy = randn(2, 4, 3)
    model.forward(ids, training=True)
    model.backward(model.backend.asarray(dy))
    expected = np.zeros((7, 3))
    for (n, t), i in np.ndenumerate(ids):
        expected[i] += dy[n, t]
    np.testing.assert_allclose(model.backend.to_numpy(model.layers[1].dw), expected, rtol=1e-14)
    with pytest.raises(DatasetError, match=r"token id 7 is outside \[0, 7\)"):
        model.forward(np.array([[0, 7, 1, 2]]))
    with pytest.raises(ShapeError, match="integer token ids"):
        model.forward(np.zeros((1, 4)))


def attention_reference(x, w_in, b_in, w_out, b_out, heads, causal):
    """Per sample and head, written out: softmax(q k^T / sqrt(hd)) v, then the output projection."""
    n, t, d = x.shape
    hd = d // heads
    q, k, v = np.split(x @ w_in.T + b_in, 3, axis=-1)
    out = np.zeros_like(x)
    for i in range(n):
        for h in range(heads):
            sl = slice(h * hd, (h + 1) * hd)
            s = q[i, :, sl] @ k[i, :, sl].T / math.sqrt(hd)
            if causal:
                s = np.where(np.tril(np.ones((t, t))) > 0, s, -np.inf)
            a = np.exp(s - s.max(-1, keepdims=True))
            out[i, :, sl] = (a / a.sum(-1, keepdims=True)) @ v[i, :, sl]
    return out @ w_out.T + b_out


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_numpy(causal, backend_name):
    d, heads = 8, 4
    x = randn(2, 5, d)
    params = {"in_proj_weight": randn(3 * d, d) * 0.5, "in_proj_bias": randn(3 * d),
              "out_proj_weight": randn(d, d), "out_proj_bias": randn(d)}
    model, y = run_layer(MultiHeadAttention(d, heads, causal=causal), x, backend_name, params)
    np.testing.assert_allclose(y, attention_reference(x, *params.values(), heads, causal), rtol=1e-11, atol=1e-12)
    assert {k.split("/")[1]: v.shape for k, v in model.state_arrays().items()} == \
        {"in_proj_weight": (24, 8), "in_proj_bias": (24,), "out_proj_weight": (8, 8), "out_proj_bias": (8,)}


def test_attention_softmax_is_stable():
    """Scores of 1e4 (which overflow a naive exp) still give a proper distribution."""
    model, y = run_layer(MultiHeadAttention(4, 1), randn(1, 3, 4) * 1e3,
                         params={"in_proj_weight": np.tile(np.eye(4), (3, 1)), "out_proj_weight": np.eye(4)})
    assert np.isfinite(y).all()


def conv_transpose_reference(x, w, b, stride, padding, output_padding):
    """Scatter form: each input pixel adds w[c] (a k x k patch) into the output at stride s."""
    n, c, h, wd = x.shape
    _, k, kh, kw = w.shape
    (sh, sw), (ph, pw), (oh, ow) = stride, padding, output_padding
    full = np.zeros((n, k, (h - 1) * sh + kh + oh, (wd - 1) * sw + kw + ow))
    for i in range(h):
        for j in range(wd):
            full[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw] += np.einsum("nc,ckab->nkab", x[:, :, i, j], w)
    ho, wo = full.shape[2] - 2 * ph, full.shape[3] - 2 * pw
    return full[:, :, ph:ph + ho, pw:pw + wo] + b[None, :, None, None]


@pytest.mark.parametrize("kw", [dict(stride=2, padding=1, output_padding=1), dict(stride=(1, 2), padding=0),
                                dict(stride=3, padding=(1, 0), output_padding=(2, 1))])
def test_conv_transpose_matches_numpy(kw, backend_name):
    x, w, b = randn(2, 3, 4, 5), randn(3, 2, 3, 3), randn(2)
    layer = ConvTranspose2D(2, 3, **kw)
    _, y = run_layer(layer, x, backend_name, {"weights": w, "biases": b})
    pairs = {k: (v, v) if isinstance(v, int) else v for k, v in {"output_padding": 0, **kw}.items()}
    ref = conv_transpose_reference(x, w, b, pairs["stride"], pairs.get("padding", (0, 0)), pairs["output_padding"])
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
    with pytest.raises(ShapeError, match="output_padding"):
        run_layer(ConvTranspose2D(2, 3, stride=2, output_padding=2), x)


def bilinear_reference(x, s):
    """align_corners=False, per output pixel."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, h * s, w * s))

    def src(i, size):
        p = max((i + 0.5) / s - 0.5, 0.0)
        lo = min(int(math.floor(p)), size - 1)
        return lo, min(lo + 1, size - 1), p - lo
    for i in range(h * s):
        i0, i1, fi = src(i, h)
        for j in range(w * s):
            j0, j1, fj = src(j, w)
            out[:, :, i, j] = ((1 - fi) * (1 - fj) * x[:, :, i0, j0] + (1 - fi) * fj * x[:, :, i0, j1]
                               + fi * (1 - fj) * x[:, :, i1, j0] + fi * fj * x[:, :, i1, j1])
    return out


def test_upsample_matches_numpy(backend_name):
    x = randn(2, 3, 4, 5)
    _, y = run_layer(Upsample2D(2), x, backend_name)
    np.testing.assert_array_equal(y, x.repeat(2, axis=2).repeat(2, axis=3))
    _, y = run_layer(Upsample2D(3, "bilinear"), x, backend_name)
    np.testing.assert_allclose(y, bilinear_reference(x, 3), rtol=1e-13, atol=1e-14)


def test_fc_on_sequences_applies_per_position(backend_name):
    x = randn(2, 3, 4)
    model, y = run_layer(FC(5), x, backend_name)
    w, b = (model.backend.to_numpy(a) for a in (model.layers[1].weights, model.layers[1].biases))
    np.testing.assert_allclose(y, x @ w + b, rtol=1e-13)
    assert model.output_shape == (3, 5)


def test_image_to_sequence_orders_tokens_as_torch_flatten_transpose(backend_name):
    x = randn(2, 3, 2, 4)
    _, y = run_layer(ImageToSequence(), x, backend_name)
    np.testing.assert_array_equal(y, x.reshape(2, 3, 8).transpose(0, 2, 1))
    x = randn(2, 5, 3)
    model, y = run_layer(PositionEmbedding(), x, backend_name)
    np.testing.assert_allclose(y, x + model.backend.to_numpy(model.layers[1].weights), rtol=1e-15)


def test_input_shapes():
    for shape in [(5,), (3, 4), (1, 2, 3)]:
        model = Model()
        model.add(Input(shape=shape))
        assert model.input_shape == shape
    with pytest.raises(ShapeError, match=r"integer ids must have shape \(T,\)"):
        Model().add(Input(shape=(3, 4), dtype="int64"))
    with pytest.raises(ConfigError, match="dtype"):
        Input(shape=(3,), dtype="float16")


# -------------------------------------------------------------------------------------- PyTorch oracle

def torch_or_skip():
    return pytest.importorskip("torch", reason="PyTorch oracle: pip install torch==2.13.0")


def oracle(layer, x, module, mapping, ids=False, rtol=1e-12, atol=1e-12):
    """The torch module's parameters, randomized, copied into ours ({our name: torch name}); then the same
    input gives the same outputs, dL/dx and parameter gradients, for L = sum(y * r)."""
    torch = torch_or_skip()
    module = module.double()
    gen = torch.Generator().manual_seed(0)
    named = dict(module.named_parameters())
    params = {}
    for ours, theirs in mapping.items():
        with torch.no_grad():
            named[theirs].copy_(torch.randn(named[theirs].shape, generator=gen, dtype=torch.float64))
        params[ours] = named[theirs].detach().numpy().copy()
    model, y = run_layer(layer, x, params=params, training=True, ids=ids)
    r = np.random.default_rng(7).standard_normal(y.shape)
    dx = model.backward(r)
    tx = torch.tensor(x, dtype=torch.int64 if ids else torch.float64, requires_grad=not ids)
    ty = module(tx)
    (ty * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=rtol, atol=atol)
    if not ids:
        np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=rtol, atol=atol)
    for ours, theirs in mapping.items():
        np.testing.assert_allclose(layer.get_grad(ours), named[theirs].grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=ours)


@pytest.mark.oracle
def test_torch_layernorm():
    torch = torch_or_skip()
    oracle(LayerNorm(), randn(2, 5, 6), torch.nn.LayerNorm(6), {"gamma": "weight", "beta": "bias"})
    oracle(LayerNorm(), randn(2, 3, 4, 5), torch.nn.GroupNorm(1, 3), {"gamma": "weight", "beta": "bias"})


@pytest.mark.oracle
def test_torch_groupnorm():
    torch = torch_or_skip()
    oracle(GroupNorm(2), randn(2, 6, 3, 4), torch.nn.GroupNorm(2, 6), {"gamma": "weight", "beta": "bias"})


@pytest.mark.oracle
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_torch_gelu(approximate):
    torch = torch_or_skip()
    oracle(GELU(approximate), randn(3, 4, 5) * 4, torch.nn.GELU(approximate=approximate), {})


@pytest.mark.oracle
def test_torch_silu():
    torch = torch_or_skip()
    oracle(SiLU(), randn(3, 4, 5) * 4, torch.nn.SiLU(), {})


@pytest.mark.oracle
def test_torch_embedding():
    torch = torch_or_skip()
    ids = np.random.default_rng(0).integers(0, 9, (3, 6))
    oracle(Embedding(9, 4), ids, torch.nn.Embedding(9, 4), {"weights": "weight"}, ids=True)


class TorchSelfAttention:
    """torch.nn.MultiheadAttention(batch_first=True) as self-attention, with the causal mask when asked."""

    def __new__(cls, d, heads, causal):
        import torch

        class SelfAttention(torch.nn.MultiheadAttention):
            def forward(self, x):
                t = x.shape[1]
                mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1) if causal else None
                return super().forward(x, x, x, attn_mask=mask, need_weights=False)[0]
        return SelfAttention(d, heads, batch_first=True)


@pytest.mark.oracle
@pytest.mark.parametrize("causal", [False, True])
def test_torch_attention(causal):
    torch_or_skip()
    d, heads = 8, 2
    mapping = {k: k for k in ("in_proj_weight", "in_proj_bias")}
    mapping.update({"out_proj_weight": "out_proj.weight", "out_proj_bias": "out_proj.bias"})
    oracle(MultiHeadAttention(d, heads, causal=causal), randn(2, 5, d) * 0.5, TorchSelfAttention(d, heads, causal),
           mapping, rtol=1e-10, atol=1e-11)


@pytest.mark.oracle
@pytest.mark.parametrize("kw", [dict(stride=2, padding=1, output_padding=1), dict(stride=(1, 2), padding=(0, 1))])
def test_torch_conv_transpose(kw):
    torch = torch_or_skip()
    oracle(ConvTranspose2D(4, (3, 2), **kw), randn(2, 3, 4, 5), torch.nn.ConvTranspose2d(3, 4, (3, 2), **kw),
           {"weights": "weight", "biases": "bias"}, rtol=1e-11, atol=1e-11)


@pytest.mark.oracle
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_torch_upsample(mode):
    torch = torch_or_skip()
    kwargs = {"align_corners": False} if mode == "bilinear" else {}
    oracle(Upsample2D((2, 3), mode), randn(2, 3, 4, 5), torch.nn.Upsample(scale_factor=(2, 3), mode=mode, **kwargs), {})


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("causal", [False, True])
def test_backend_softmax_kernels(dtype, causal, backend_name):
    """The fused row softmax (the CPU's numba kernel; elsewhere the array-module default) against NumPy,
    scores of +-1e4 included, and its backward against the formula."""
    from pydtnn.backends import Backend, get_backend
    be = get_backend(backend_name, dtype) if isinstance(backend_name, str) else backend_name
    s = np.random.default_rng(0).standard_normal((2, 3, 5, 5)) * 3
    s[0, 0, 2] = [1e4, -1e4, 0, 1e4, 2]
    ref = np.where(np.tril(np.ones((5, 5))) > 0, s, -np.inf) if causal else s
    ref = np.exp(ref - ref.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    y = be.softmax(be.asarray(s.copy()), causal=causal)       # in place: on a copy
    tol = 1e-6 if dtype == "float32" else 1e-14
    np.testing.assert_allclose(be.to_numpy(y), ref, rtol=tol, atol=tol)
    g = np.random.default_rng(1).standard_normal(s.shape)
    dz = be.softmax_backward(y, be.asarray(g.copy()))
    np.testing.assert_allclose(be.to_numpy(dz), ref * (g - (g * ref).sum(-1, keepdims=True)), rtol=tol * 10,
                               atol=tol * 10)
    base = Backend.softmax(be, be.asarray(s.copy()), causal=causal)        # the device-independent default agrees
    np.testing.assert_allclose(be.to_numpy(base), ref, rtol=tol, atol=tol)
