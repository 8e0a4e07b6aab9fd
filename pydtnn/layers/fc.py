"""FC: fully connected layer, y = x @ W + b with W of shape (in_features, out_features).

On sequences (N, T, D) it applies to the last axis, position by position, as `torch.nn.Linear` does
(one GEMM over the N * T rows).
"""
from pydtnn.layers.base import Layer, ParamAttr


class FC(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)
    weights, biases = ParamAttr("weights"), ParamAttr("biases")
    dw, db = ParamAttr("weights", grad=True), ParamAttr("biases", grad=True)

    def __init__(self, shape, activation=None, use_bias=True, weights_initializer="glorot_uniform",
                 biases_initializer="zeros", name=None):
        super().__init__(activation=activation, name=name)
        self.out_features = int(shape[0]) if isinstance(shape, (tuple, list)) else int(shape)
        self.use_bias = use_bias
        self.weights_initializer, self.biases_initializer = weights_initializer, biases_initializer

    def build(self, in_shape):
        if len(in_shape) not in (1, 2):
            raise self.shape_error("FC needs (features,) or (T, features) input; add a Flatten layer before it")
        if self.out_features <= 0:
            raise self.shape_error(f"output size must be positive, got {self.out_features}")
        return tuple(in_shape[:-1]) + (self.out_features,)

    def param_specs(self):
        n_in, n_out = self.in_shape[-1], self.out_features
        specs = {"weights": ((n_in, n_out), self.weights_initializer, n_in, n_out)}
        if self.use_bias:
            specs["biases"] = ((n_out,), self.biases_initializer, n_in, n_out)
        return specs

    def forward(self, x, training=False):
        self.x = x
        # the backend's threads (CPU: one pool, no nested BLAS threads), the bias added in the same pass
        y = self.backend.linear(x.reshape(-1, x.shape[-1]), self.weights, self.biases if self.use_bias else None)
        return y.reshape(x.shape[:-1] + (self.out_features,))

    def backward(self, dy):
        x = self.x
        if x.ndim > 2:                    # (N, T, D): every position is a row of one GEMM
            x, dy_rows = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
        else:
            dy_rows = dy
        self.backend.linear_weight_grads(x, dy_rows, self.dw, self.db if self.use_bias else None)
        return self.backend.matmul(dy_rows, self.weights.T).reshape(dy.shape[:-1] + (x.shape[-1],)) if self.input_grad_needed else None
