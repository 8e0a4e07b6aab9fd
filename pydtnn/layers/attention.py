"""MultiHeadAttention: self-attention on (N, T, D), as `torch.nn.MultiheadAttention(D, heads,
dropout=p, batch_first=True)` called with query = key = value = x (and `attn_mask` the causal mask when
`causal=True`: position i attends to positions j <= i).

Parameters, named and shaped as PyTorch's so that weights port directly: `in_proj_weight` (3D, D) and
`in_proj_bias` (3D,) (the q, k, v projections stacked), `out_proj_weight` (D, D), `out_proj_bias` (D,).

Work: one GEMM for q, k, v over all N * T positions; then `backend.attention_forward` on the (N T, 3D)
projection: the scores q k^T / sqrt(hd) of every (sample, head), the softmax over the last axis (stable,
the causal mask in the same pass), the weighted values (batched matmuls by default; the CPU backend does
a pair's work in one pass, see `_cpu_attention`); one GEMM for the output projection. Backward mirrors it
(`backend.attention_backward`: the same five products). Dropout (training only) drops attention weights,
as PyTorch does, with a mask from the backend's generator.
"""
from pydtnn.errors import ConfigError
from pydtnn.layers.base import Layer, ParamAttr


class MultiHeadAttention(Layer):
    internal_layout = True      # (N, T, D): no image axes
    in_proj_weight, in_proj_bias = ParamAttr("in_proj_weight"), ParamAttr("in_proj_bias")
    out_proj_weight, out_proj_bias = ParamAttr("out_proj_weight"), ParamAttr("out_proj_bias")
    d_in_proj_weight, d_in_proj_bias = ParamAttr("in_proj_weight", grad=True), ParamAttr("in_proj_bias", grad=True)
    d_out_proj_weight = ParamAttr("out_proj_weight", grad=True)
    d_out_proj_bias = ParamAttr("out_proj_bias", grad=True)

    def __init__(self, embed_dim, num_heads, causal=False, dropout=0.0, name=None):
        super().__init__(name=name)
        for what, v in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"MultiHeadAttention {what} must be a positive int, got {v!r}")
        if embed_dim % num_heads:
            raise ConfigError(f"MultiHeadAttention: num_heads {num_heads} must divide embed_dim {embed_dim}")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"MultiHeadAttention dropout must be in [0, 1), got {dropout}")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.causal, self.dropout = bool(causal), float(dropout)

    def build(self, in_shape):
        if len(in_shape) != 2 or in_shape[1] != self.embed_dim:
            raise self.shape_error(f"MultiHeadAttention needs (T, {self.embed_dim}) input")
        d = self.embed_dim
        # PyTorch: xavier_uniform on the stacked projections, zero biases
        self.add_weight("in_proj_weight", (3 * d, d), "glorot_uniform", fan_in=d, fan_out=3 * d)
        self.add_weight("in_proj_bias", (3 * d,), "zeros")
        self.add_weight("out_proj_weight", (d, d), "glorot_uniform", fan_in=d, fan_out=d)
        self.add_weight("out_proj_bias", (d,), "zeros")
        return in_shape

    def forward(self, x, training=False):
        n, t, d = x.shape
        self.x = x
        self.qkv = self.backend.linear(x.reshape(n * t, d), self.in_proj_weight.T, self.in_proj_bias)  # (N T, 3D)
        self.mask = None
        if training and self.dropout:
            keep = 1.0 - self.dropout
            draws = self.backend.rng.random((n * self.num_heads, t, t), dtype=self.backend.dtype)   # per (sample, head)
            self.mask = (draws < keep).astype(x.dtype).reshape(n, self.num_heads, t, t)
            self.mask *= x.dtype.type(1 / keep)
        self.context, self.attn = self.backend.attention_forward(self.qkv, n, t, self.num_heads, self.causal,
                                                                 self.mask)
        y = self.backend.linear(self.context, self.out_proj_weight.T, self.out_proj_bias)
        return y.reshape(n, t, d)

    def backward(self, dy):
        mm = self.backend.matmul
        n, t, d = dy.shape
        dy2 = dy.reshape(n * t, d)
        self.backend.linear_weight_grads(self.context, dy2, self.d_out_proj_weight, self.d_out_proj_bias, out_in=True)
        dqkv = self.backend.attention_backward(mm(dy2, self.out_proj_weight), self.qkv, self.attn, self.mask,
                                               n, t, self.num_heads)
        x2 = self.x.reshape(n * t, d)
        self.backend.linear_weight_grads(x2, dqkv, self.d_in_proj_weight, self.d_in_proj_bias, out_in=True)
        if not self.input_grad_needed:
            return None
        return mm(dqkv, self.in_proj_weight).reshape(n, t, d)
