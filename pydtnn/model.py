"""Model: an ordered list of layers (blocks nest more), one flat parameter buffer and one flat gradient buffer.

    model = Model(backend="cpu", dtype="float32", seed=0)
    model.add(Input(shape=(1, 28, 28)))
    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1, activation="relu"))
    ...
    y = model.forward(x, training=True)
    dx = model.backward(dy)

Parameters live in `model.params` and gradients in `model.grads`, each ONE contiguous array; every layer's
weights and gradients are views into them, laid out in forward order. Optimizers update the flat buffers
in one pass, and communicators reduce the gradient buffer in one call (or in reverse-order buckets).
"""
from __future__ import annotations

import contextlib
import re

import numpy as np

from pydtnn.activations import expand_activations
from pydtnn.backends import Backend, get_backend
from pydtnn.errors import CheckpointError, ConfigError, ShapeError
from pydtnn.execution import ExecutionPlan, plan
from pydtnn.layers.base import Layer
from pydtnn.layers.input import Input
from pydtnn.losses import get_loss
from pydtnn.metrics import get_metric
from pydtnn.targets import targets_for_outputs
from pydtnn.weights import load_weights, save_weights


class Model:
    layer_timer = None          # a pydtnn.observe.layer_timer.LayerTimer while tracing or profiling layers
    execution: ExecutionPlan | None = None     # what pydtnn.execution paired when the model was packed

    def __init__(self, backend="cpu", dtype="float32", seed=0):
        self.backend = backend if isinstance(backend, Backend) else get_backend(backend, dtype, seed)
        self.dtype = self.backend.dtype
        self.xp = self.backend.xp
        self.seed = int(seed)
        self.init_rng = np.random.default_rng(self.seed)   # host RNG: same initial weights on every backend
        self.layers: list[Layer] = []
        self._name_counts: dict[str, int] = {}
        self._params = self._grads = None

    # --- building -----------------------------------------------------------------------------------
    def _name(self, layer):
        base = re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", layer.type_name).lower()
        count = self._name_counts.get(base, 0)
        self._name_counts[base] = count + 1
        return base if count == 0 else f"{base}_{count}"

    def add(self, layer: Layer) -> Layer:
        """Append a layer (and its activation shortcut), inferring its shapes and drawing its weights."""
        if not isinstance(layer, Layer):
            raise ConfigError(f"Model.add expects a layer, got {type(layer).__name__}")
        if not self.layers and not isinstance(layer, Input):
            raise ShapeError(f"the first layer must be Input(shape=...), got {layer.type_name}")
        if self.layers and isinstance(layer, Input):
            raise ShapeError("Input can only be the first layer")
        for new in expand_activations([layer]):
            in_shape = self.layers[-1].shape if self.layers else ()
            new.initialize(in_shape, self.backend, self.init_rng, self._name)
            self.layers.append(new)
        self._params = self._grads = None         # repacked on next use
        return layer

    def all_layers(self):
        """Every layer, nested ones included, in forward (= flat buffer) order."""
        for layer in self.layers:
            yield layer
            yield from layer.sublayers()

    def _pack(self):
        """Move every parameter into one flat buffer and every gradient into another (views per layer)."""
        owners = [(layer, name) for layer in self.all_layers() for name in layer.param_names()]
        total = sum(int(layer.get_param(name).size) for layer, name in owners)
        xp = self.xp
        self._params = xp.empty(total, dtype=self.dtype)
        self._grads = xp.zeros(total, dtype=self.dtype)
        offset = 0
        self.param_offsets = {}
        for layer, name in owners:
            shape = layer.get_param(name).shape
            size = int(np.prod(shape))
            layer.bind_flat(name, self._params[offset:offset + size].reshape(shape),
                            self._grads[offset:offset + size].reshape(shape))
            self.param_offsets[f"{layer.name}/{name}"] = (offset, size)
            offset += size
        self.execution = plan(self.layers)  # fused Relus, dense chains, handed sums: from what the layers declare
        # top-level layer i owns params from _starts[i]; after its backward grads[_starts[i]:] are final
        self._starts, offset = [], 0
        for layer in self.layers:
            self._starts.append(offset)
            offset += layer.nparams

    @property
    def params(self):
        if self._params is None:
            self._pack()
        return self._params

    @property
    def grads(self):
        if self._grads is None:
            self._pack()
        return self._grads

    @property
    def nparams(self) -> int:
        return sum(layer.nparams for layer in self.layers)

    @property
    def input_shape(self):
        return self.layers[0].shape

    @property
    def output_shape(self):
        return self.layers[-1].shape

    # --- computation --------------------------------------------------------------------------------
    def forward(self, x, training=False, upto=None):
        """Run the layers (all, or the first `upto`) on x (N, *input_shape); 4-D outputs come back NCHW."""
        if self._params is None:
            self._pack()
        if not self.layers:
            raise ShapeError("the model has no layers")
        timer, execution = self.layer_timer, self.execution
        for layer in self.layers[:upto]:
            call = execution.call(layer, "forward")         # forward_internal, given the layer's partners
            if timer is None:
                x = call(x, training)                       # NCHW conversion only around a user layer
            else:
                x = timer.run(layer, "forward", call, x, training)
        return self.backend.to_user(x) if x.ndim == 4 else x

    def backward(self, dy, on_grads_ready=None, start=None, need_dx=True):
        """Back-propagate dy (dL/d output) through the layers, filling `grads`; returns dL/dx (NCHW), or None
        when the model's input takes no gradient: integer ids (an Embedding first, whatever the Input's dtype),
        as PyTorch and Keras have no gradient for integer inputs.

        `start` skips the layers from that index on (used when the loss already fused the last one);
        `on_grads_ready(lo)` is called after each layer with parameters: grads[lo:] are then final.
        `need_dx=False` (training) lets the first layer skip its input gradient, and returns None.
        """
        if dy.ndim == 4:
            dy = self.backend.to_internal(dy)
        stop = len(self.layers) if start is None else start
        if len(self.layers) > 1:
            self.layers[1].input_grad_needed = need_dx
        timer, execution = self.layer_timer, self.execution
        passing = execution.backward_pass() if execution is not None else contextlib.nullcontext()
        with passing:                   # blocks may hand a sum to the block before them (pydtnn.execution)
            for i in range(stop - 1, -1 if need_dx else 0, -1):
                if i == 0 and dy is None:
                    break               # the layer after Input takes ids (differentiable_input False): no dL/dx
                layer = self.layers[i]
                # backward_internal, given the layer's partners (unpacked: none)
                call = execution.call(layer, "backward") if execution is not None else layer.backward_internal
                dy = call(dy) if timer is None else timer.run(layer, "backward", call, dy)
                if on_grads_ready is not None and self.layers[i].nparams:
                    on_grads_ready(self._starts[i])
        return dy if need_dx else None

    def compute_gradients(self, x, y, loss, loss_scale=1.0, on_grads_ready=None):
        """Forward in training mode, loss, backward. Fills `grads` with loss_scale * d(mean loss)/d params.

        Returns (loss value, predictions). When the model ends in the activation the loss fuses with
        (Softmax + categorical cross-entropy), the loss is computed from the logits.
        """
        loss = get_loss(loss)
        fused = loss.fuses_with is not None and isinstance(self.layers[-1], loss.fuses_with)
        stop = len(self.layers) - 1 if fused else len(self.layers)
        out = self.forward(x, training=True, upto=stop)
        y = self.backend.asarray(y)

        def evaluate_loss(out):
            if fused:
                return loss.from_logits(out, y)
            value, dy = loss(out, y)
            return value, out, dy
        timer = self.layer_timer
        value, y_pred, dy = (evaluate_loss(out) if timer is None else      # a fused softmax is named with it
                             timer.span(f"{self.layers[-1].name} + loss" if fused else "loss", "forward",
                                        evaluate_loss, out))
        if loss_scale != 1.0:
            dy *= dy.dtype.type(loss_scale)
        self.backward(dy, on_grads_ready=on_grads_ready, start=stop, need_dx=False)
        return value, y_pred

    # --- state ----------------------------------------------------------------------------------------
    def state_arrays(self) -> dict:
        """Every parameter and running statistic as host arrays, keyed "layer_name/param" (stable, NCHW)."""
        self.params  # noqa: B018  (packs if needed)
        out = {}
        for layer in self.all_layers():
            for name in layer.param_names():
                out[f"{layer.name}/{name}"] = self.backend.to_numpy(layer.get_param(name))
            for name, value in layer.state_arrays().items():
                out[f"{layer.name}/{name}"] = self.backend.to_numpy(value)
        return out

    def load_state_arrays(self, arrays: dict, source="weights"):
        """Copy arrays produced by `state_arrays` (possibly of another backend) back in; checks every key."""
        expected = self.state_arrays()
        missing = sorted(set(expected) - set(arrays))
        extra = sorted(set(arrays) - set(expected))
        if missing or extra:
            detail = f"missing {missing[:3]}" if missing else f"unexpected {extra[:3]}"
            raise CheckpointError(f"{source} does not match this model: {detail}")
        for layer in self.all_layers():
            targets = {n: layer.get_param(n) for n in layer.param_names()}
            targets.update(layer.state_arrays())
            for name, target in targets.items():
                key = f"{layer.name}/{name}"
                value = np.asarray(arrays[key])
                if value.shape != tuple(target.shape):
                    raise CheckpointError(f"{source}: {key} has shape {value.shape}, the model expects "
                                          f"{tuple(target.shape)}")
                target[...] = self.backend.asarray(value)

    def predict(self, x, batch_size=256):
        """Inference-mode outputs for host array x (N, *input_shape), batch by batch, as one host array."""
        x = np.asarray(x)
        if int(batch_size) < 1:
            raise ConfigError(f"predict: batch_size must be at least 1, got {batch_size}")
        if len(x) == 0:
            raise ShapeError("predict needs at least one sample")
        outs = [self.backend.to_numpy(self.forward(x[start:start + batch_size], training=False))
                for start in range(0, len(x), int(batch_size))]
        return np.concatenate(outs)

    def save(self, path):
        """Write the weights and running statistics to an NPZ file (the launcher's weights file format)."""
        save_weights(path, self)

    def load(self, path):
        """Read weights written by `save` or by the launcher (`--save_weights_and_bias_filename`)."""
        load_weights(path, self)

    # --- reporting ----------------------------------------------------------------------------------
    def summary(self) -> str:
        """A table of layer, output shape, weight shapes and parameter count, with totals."""
        rows = [("Layer", "Type", "Output shape", "Weights", "Params")]

        def walk(layers, indent):
            for layer in layers:
                rows.append(("  " * indent + layer.name, layer.type_name, str(layer.shape),
                             layer.weight_shape_str(), f"{layer.nparams:,}"))
                for p, path in enumerate(getattr(layer, "paths", [])):
                    rows.append(("  " * (indent + 1) + f"path {p}" + (" (identity)" if not path else ""),
                                 "", "", "", ""))
                    walk(path, indent + 2)
                walk(getattr(layer, "children", []), indent + 1)      # a Composite's sublayers
        walk(self.layers, 0)
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        line = "-" * (sum(widths) + 8)
        fmt = lambda r: "  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        body = [fmt(rows[0]), line] + [fmt(r) for r in rows[1:]] + [line]
        body.append(f"Total parameters: {self.nparams:,}  ({self.nparams * self.dtype.itemsize / 2**20:.2f} MiB "
                    f"as {self.dtype.name}, backend {self.backend.name})")
        return "\n".join(body)

    # --- training: the launcher's loop (pydtnn.training.loop.Trainer) on arrays ------------------------------
    def fit(self, x, y=None, *, epochs=1, batch_size=64, optimizer=None, loss="categorical_cross_entropy",
            metrics=("categorical_accuracy",), validation_data=None, shuffle=True, verbose=False,
            callbacks=(), clip_grad_norm=0.0, comm=None):
        """Train with the launcher's training loop (`pydtnn.training.loop.Trainer`) on host arrays x (N, ...) and y
        (one-hot (N, K), integer labels, or float targets), or on a `pydtnn.datasets.Dataset` given as x (its
        `val` split is the validation data). Returns a Keras-like history dict of lists: loss, each metric,
        and their val_ versions with `validation_data` or a Dataset's val split.

        `callbacks` are `pydtnn.callbacks.Callback` objects (or any object with some of its hooks; the
        `pydtnn.schedulers` are ones); the `trainer` they get is the Trainer (`model`, `optimizer`,
        `steps_per_epoch`, `stop_training`, `log`, `save_checkpoint`). `clip_grad_norm` > 0 clips the
        gradient to that global L2 norm before each step. Memory-mapped arrays are read a batch at a time.
        `comm` (a pydtnn communicator, e.g. `pydtnn.parallel.comm.make_comm("auto")` under mpiexec): train data
        parallel, every rank calling fit with the same arrays; batch_size is the global batch, split equally,
        gradients weighted by each replica's share (for another split or a policy: `pydtnn.parallel.DataParallel`).
        """
        # the model's only upward import: the loop builds on the model, so the model reaches it lazily
        from pydtnn.training.fit import fit
        return fit(self, x, y, epochs=epochs, batch_size=batch_size, optimizer=optimizer, loss=loss, metrics=metrics,
                   validation_data=validation_data, shuffle=shuffle, verbose=verbose, callbacks=callbacks,
                   clip_grad_norm=clip_grad_norm, comm=comm)

    def evaluate(self, x, y, *, batch_size=256, loss="categorical_cross_entropy", metrics=("categorical_accuracy",)):
        """Loss and metrics (inference mode) over host arrays, averaged over samples."""
        loss = get_loss(loss)
        metric_fns = {m: get_metric(m) for m in metrics}
        y = self._one_hot(y)
        totals = {k: 0.0 for k in ["loss", *metric_fns]}
        for start in range(0, len(x), batch_size):
            xb, yb = x[start:start + batch_size], self.backend.asarray(y[start:start + batch_size])
            y_pred = self.forward(xb, training=False)
            values = self.backend.read_scalars([loss(y_pred, yb)[0]] + [f(y_pred, yb) for f in metric_fns.values()])
            for k, v in zip(totals, values):
                totals[k] += float(v) * len(xb)
        return {k: v / len(x) for k, v in totals.items()}

    def _one_hot(self, y):
        return targets_for_outputs(y, self.output_shape, self.dtype)

