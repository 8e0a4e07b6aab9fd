"""BatchNormalization over channels (images) or features (flat input).

Training normalizes with the local batch statistics and updates the running ones:
running = momentum * running + (1 - momentum) * batch, with the unbiased batch variance (as PyTorch and
Keras do). Inference uses the running statistics.

With `sync` set (a `pydtnn.parallel.sync_batchnorm.BatchNormSync`, what the trainer does under
--sync_batchnorm), training uses the statistics of the global batch over all replicas, counts included,
and every replica updates the same running statistics from them.

What the execution plan pairs it with when the model is packed (pydtnn/execution/), handed to forward and
backward as keywords, only adds options to the same kernels: relu= where the Relu after this layer runs in
its passes, known= where a dense chain hands on the batch moments of the input's last channels.
"""
from pydtnn.layers.base import Layer, ParamAttr


class BatchNormalization(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)
    gamma, beta = ParamAttr("gamma"), ParamAttr("beta")
    dgamma, dbeta = ParamAttr("gamma", grad=True), ParamAttr("beta", grad=True)

    sync = None                 # a BatchNormSync: global-batch statistics in training (data parallelism)

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

    # --- declarations for the execution passes (pydtnn/execution/) ---------------------------------------
    def fuses_next_relu(self):
        """A Relu right after this layer runs in its passes where the backend's kernels take relu=."""
        return bool(getattr(self.backend, "fuses_relu", False))

    def takes_known_moments(self):
        """In a dense chain, a training forward sums only the channels in front of the moments handed on."""
        return True

    def forward(self, x, training=False, *, relu=None, moments=None):
        """relu: the FusedRelu of the Relu after this layer, which runs in its passes; moments: the DenseChain
        that hands on the batch moments of x's last channels (both from the model's execution plan)."""
        options = self._kernel_options(training, relu is not None, moments)
        if training:
            # the running statistics are updated by the kernels (on the GPU, inside the finalize kernel)
            y, _, _, self.ctx = self.backend.batchnorm_forward_train(
                x, self.gamma, self.beta, self.epsilon, running=(self.mean, self.var, self.momentum), **options)
        else:
            self.ctx, self.x = None, x      # kept so that a frozen (inference-mode) BN can back-propagate
            y = self.backend.batchnorm_forward_infer(x, self.gamma, self.beta, self.mean, self.var, self.epsilon,
                                                     **options)
        return y if relu is None else relu.hand_on(y)     # y is relu(bn(x)) there

    def _kernel_options(self, training, relu, moments):
        """The batchnorm kernels' options: relu= where the Relu after this layer runs inside it; in training,
        sync= and center= (the running mean, which every replica holds alike) under --sync_batchnorm, else
        known= where a dense chain (`moments`) handed on the moments of x's last channels."""
        options = {"relu": True} if relu else {}
        if not training:
            return options
        known = None if moments is None else moments.take_moments(self)
        if self.sync is not None:
            options.update(sync=self.sync, center=self.mean)
        elif known is not None:
            options["known"] = known
        return options

    def batch_moments(self):
        """(mean, biased variance), float64, of the last training forward's batch, where the backend keeps
        them (`reuses_bn_moments`) and the statistics were this replica's own; else None."""
        if self.ctx is None or self.sync is not None or not getattr(self.backend, "reuses_bn_moments", False):
            return None
        return self.backend.batchnorm_moments(self.ctx)

    backward_adds = True

    def backward(self, dy, addend=None, *, relu=None):
        """dy: the gradient after the fused Relu when `relu` (its FusedRelu) is given (that Relu passed it on).
        Returns dx, or dx + addend (another path's gradient of the same input, in the same pass)."""
        relu_y = None if relu is None else relu.y
        if self.ctx is None:
            dx = self._backward_frozen(dy if relu_y is None else self.backend.relu_backward(dy, relu_y))
            return dx if addend is None else dx + addend
        options = {} if relu_y is None else {"relu_y": relu_y}
        if addend is not None:
            options["addend"] = addend
        dx, _, _ = self.backend.batchnorm_backward(dy, self.ctx, sync=self.sync, out=(self.dgamma, self.dbeta),
                                                   **options)
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
