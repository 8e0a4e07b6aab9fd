"""Embedding: integer ids (N, T) -> their rows of a learnable table, (N, T, embedding_dim), as
`torch.nn.Embedding` (weights (num_embeddings, embedding_dim), initialised standard normal).

The model's input is ids: `Input(shape=(T,), dtype="int64")`, or, as Keras's Embedding takes them, integer-valued
floats (an `Input(shape=(T,))` of the model's float type casts the ids to it): cast to int64 here, and a value
that is not an integer (2.5, NaN) is one line. Float ids are exact only up to 2**24 (float32), so a larger
table needs int64 ids. Ids have no gradient; the table's is a scatter-add of the incoming gradient rows
(`backend.scatter_add_rows`).

An id outside the table is one line (`check_ids`): forward reads the ids' range, except inside a CUDA graph's
capture, which cannot read the device; training with graphs checks each batch's ids on the host instead.
"""
import numpy as np

from pydtnn.errors import ConfigError, DatasetError
from pydtnn.layers.base import Layer, ParamAttr


class Embedding(Layer):
    internal_layout = True      # (N, T) -> (N, T, D): no image axes
    differentiable_input = False
    weights, dw = ParamAttr("weights"), ParamAttr("weights", grad=True)

    def __init__(self, num_embeddings, embedding_dim, weights_initializer="standard_normal", name=None):
        super().__init__(name=name)
        for what, v in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"Embedding {what} must be a positive int, got {v!r}")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weights_initializer = weights_initializer

    def build(self, in_shape):
        if len(in_shape) != 1:
            raise self.shape_error("Embedding needs integer ids (T,): Input(shape=(T,), dtype='int64')")
        v, d = self.num_embeddings, self.embedding_dim
        self.add_weight("weights", (v, d), self.weights_initializer, fan_in=d, fan_out=d)
        return (in_shape[0], d)

    def forward(self, x, training=False):
        if x.dtype.kind == "f":
            x = self._float_ids(x)
        elif x.dtype.kind not in "iu":
            raise self.shape_error(f"expects integer token ids, got {x.dtype} (declare "
                                   f"Input(shape=(T,), dtype='int64'))")
        if not self.backend.capturing:      # a check reads the ids to the host, which a CUDA graph cannot hold
            self.check_ids(x)
        self.ids = x
        return self.xp.take(self.weights, x, axis=0)

    def check_ids(self, ids):
        """Ids (the host's or the device's) this table has rows for, or one line (DatasetError). Forward checks
        them, except while a CUDA graph captures it: where steps replay graphs, the training loop checks each
        batch's ids on the host before they go to the device (`pydtnn.training.step`)."""
        if ids.size == 0:
            return
        if ids.dtype.kind == "f":
            self._check_integers(ids)
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.num_embeddings:
            raise DatasetError(f"layer {self.name} (Embedding): token id {lo if lo < 0 else hi} is outside "
                               f"[0, {self.num_embeddings})")

    def _float_ids(self, x):
        """Integer-valued float ids as int64; one line for a table whose ids this float type cannot hold
        exactly (a value that is no integer: `check_ids`)."""
        exact = 2 ** (np.finfo(x.dtype).nmant + 1)
        if self.num_embeddings > exact:
            raise self.shape_error(f"{x.dtype} ids are exact only up to {exact}, and the table has "
                                   f"{self.num_embeddings} rows: declare Input(shape=(T,), dtype='int64')")
        if not self.backend.capturing:
            self._check_integers(x)
        return x.astype(self.xp.int64)

    def _check_integers(self, x):
        xp = np if isinstance(x, np.ndarray) else self.xp
        bad = xp.logical_not(xp.isfinite(x) & (x == xp.floor(x)))
        if bool(bad.any()):
            value = float(x[bad].reshape(-1)[0])
            raise DatasetError(f"layer {self.name} (Embedding): token ids must be integers, got {value!r}")

    def backward(self, dy):
        self.dw[...] = 0
        self.backend.scatter_add_rows(self.dw, self.ids.reshape(-1), dy.reshape(-1, self.embedding_dim))
        return None
