"""PositionEmbedding: a learnable vector per position added to a sequence, y[n, t] = x[n, t] + weights[t],
weights (T, D) (ViT's and GPT's learned absolute positions; initialised N(0, 0.02^2) as theirs).

Attention alone does not know where a token is; this tells it.
"""
from pydtnn.layers.base import Layer, ParamAttr


class PositionEmbedding(Layer):
    internal_layout = True      # (N, T, D): no image axes
    weights, dw = ParamAttr("weights"), ParamAttr("weights", grad=True)

    def __init__(self, weights_initializer="small_normal", name=None):
        super().__init__(name=name)
        self.weights_initializer = weights_initializer

    def build(self, in_shape):
        if len(in_shape) != 2:
            raise self.shape_error("PositionEmbedding needs (T, D) input")
        t, d = in_shape
        self.add_weight("weights", (t, d), self.weights_initializer, fan_in=d, fan_out=d)
        return in_shape

    def forward(self, x, training=False):
        return x + self.weights

    def backward(self, dy):
        dy.sum(axis=0, out=self.dw)
        return dy
