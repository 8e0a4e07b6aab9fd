"""BatchNormalization over channels (images) or features (flat input).

Training normalizes with the local batch statistics and updates the running ones:
running = momentum * running + (1 - momentum) * batch, with the unbiased batch variance (as PyTorch and
Keras do). Inference uses the running statistics.

With `sync` set (a `pydtnn.parallel.sync_batchnorm.BatchNormSync`, what the trainer does under
--sync_batchnorm), training uses the statistics of the global batch over all replicas, counts included,
and every replica updates the same running statistics from them.
"""
from pydtnn.layers.base import Layer, ParamAttr


class BatchNormalization(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)
    gamma, beta = ParamAttr("gamma"), ParamAttr("beta")
    dgamma, dbeta = ParamAttr("gamma", grad=True), ParamAttr("beta", grad=True)

    sync = None                 # a BatchNormSync: global-batch statistics in training (data parallelism)
    fused_relu = None           # the Relu after this layer, run in the same pass (pydtnn/execution/relu_fusion.py)
    _relu_y = None              # that Relu's output, from the last forward
    # the batch moments of the next training forward's last channels, handed on by a dense chain
    # (pydtnn/execution/concat_chain.py) and used once
    known_moments = None

    def __init__(self, momentum=0.9, epsilon=1e-5, gamma_initializer="ones", beta_initializer="zeros", name=None):
        super().__init__(name=name)
        self.momentum, self.epsilon = float(momentum), float(epsilon)
        self.gamma_initializer, self.beta_initializer = gamma_initializer, beta_initializer

    def build(self, in_shape):
        if len(in_shape) not in (1, 3):
            raise self.shape_error("BatchNormalization needs (C, H, W) or (features,) input")
        return in_shape

    def param_specs(self):
        c = self.in_shape[0]
        return {"gamma": ((c,), self.gamma_initializer, c, c), "beta": ((c,), self.beta_initializer, c, c)}

    def after_initialize(self, rng):
        c = self.in_shape[0]
        self.mean = self.xp.zeros((c,), dtype=self.backend.dtype)
        self.var = self.xp.ones((c,), dtype=self.backend.dtype)

    def state_arrays(self):
        return {"mean": self.mean, "var": self.var}

    def forward(self, x, training=False):
        relu = self.fused_relu
        fused = {"relu": True} if relu is not None else {}
        if not training:
            self.ctx, self.x = None, x      # kept so that a frozen (inference-mode) BN can back-propagate
            y = self.backend.batchnorm_forward_infer(x, self.gamma, self.beta, self.mean, self.var, self.epsilon,
                                                     **fused)
            return self._hand_to_relu(y)
        sync, known, self.known_moments = self.sync, self.known_moments, None
        if sync is None:
            if known is not None:
                fused["known"] = known
            y, mean, var, self.ctx = self.backend.batchnorm_forward_train(x, self.gamma, self.beta, self.epsilon,
                                                                          **fused)
            n = x.size // x.shape[self.backend.channel_axis if x.ndim == 4 else 1]
        else:       # centred on the running mean, which every replica holds alike
            y, mean, var, self.ctx = self.backend.batchnorm_forward_train(
                x, self.gamma, self.beta, self.epsilon, sync=sync, center=self.mean, **fused)
            n = sync.count
        m = self.momentum
        self.mean *= m
        self.mean += (1 - m) * mean
        self.var *= m
        self.var += (1 - m) * var * (n / max(n - 1, 1))
        return self._hand_to_relu(y)

    def batch_moments(self):
        """(mean, biased variance), float64, of the last training forward's batch, where the backend keeps
        them (`reuses_bn_moments`) and the statistics were this replica's own; else None."""
        if self.ctx is None or self.sync is not None or not getattr(self.backend, "reuses_bn_moments", False):
            return None
        return self.backend.batchnorm_moments(self.ctx)

    def _hand_to_relu(self, y):
        """With a fused Relu, y already is relu(bn(x)): the Relu's forward will return it as it is."""
        self._relu_y = y if self.fused_relu is not None else None
        if self._relu_y is not None:
            self.fused_relu.fused_input = y
        return y

    backward_adds = True

    def backward(self, dy, addend=None):
        """dy: the gradient after the fused Relu when the forward ran fused (that Relu passed it on).
        Returns dx, or dx + addend (another path's gradient of the same input, in the same pass)."""
        relu_y = self._relu_y
        if self.ctx is None:
            dx = self._backward_frozen(dy if relu_y is None else self.backend.relu_backward(dy, relu_y))
            return dx if addend is None else dx + addend
        fused = {} if relu_y is None else {"relu_y": relu_y}
        if addend is not None:
            fused["addend"] = addend
        dx, dgamma, dbeta = self.backend.batchnorm_backward(dy, self.ctx, sync=self.sync, **fused)
        self.dgamma[...] = dgamma
        self.dbeta[...] = dbeta
        return dx

    def _backward_frozen(self, dy):
        """Backward through y = gamma (x - mean) / sqrt(var + eps) + beta with fixed running statistics."""
        axis = self.backend.channel_axis if dy.ndim == 4 else 1
        shape = [1] * dy.ndim
        shape[axis] = -1
        inv_std = 1 / self.xp.sqrt(self.var + self.epsilon)
        x_hat = (self.x - self.mean.reshape(shape)) * inv_std.reshape(shape)
        others = tuple(a for a in range(dy.ndim) if a != axis)
        self.dgamma[...] = (dy * x_hat).sum(axis=others)
        self.dbeta[...] = dy.sum(axis=others)
        return dy * (self.gamma * inv_std).reshape(shape)
