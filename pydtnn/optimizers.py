"""Optimizers that update the model's flat parameter buffer in one vectorized pass.

Hyper-parameter names follow upstream PyDTNN: learning_rate, momentum, nesterov, decay (L2 weight decay
added to the gradient; for adamw the decoupled decay of Loshchilov & Hutter), rho, beta1, beta2, epsilon.
`learning_rate` may be changed between steps (LR schedulers do). State (velocities, moments, step count)
is exposed for checkpoints.

Each class's docstring names the published update it follows and the PyTorch call it equals (tested in
float64 against torch.optim where torch is installed, and always against the equations written out).
The defaults are upstream PyDTNN's, which the launcher's flags keep; where they differ from PyTorch's
(Adam, Nadam, AdamW: beta1 0.99 and epsilon 1e-7 against 0.9 and 1e-8) the docstring says so.
"""
import math

import numpy as np

from pydtnn.backends import array_module
from pydtnn.errors import ConfigError


def _check_unit(name, what, value):
    """Decay rates of moving averages: in [0, 1) (1 would never move, > 1 diverges)."""
    if not 0 <= value < 1:
        raise ConfigError(f"{name}: {what} must be in [0, 1), got {value} (--{what})")


def _check_epsilon(name, value):
    if not value > 0:
        raise ConfigError(f"{name}: epsilon must be > 0, got {value} (--epsilon)")


def _fusable(*arrays) -> bool:
    """Flat C-contiguous NumPy arrays of one dtype, float32 or float64: the CPU backend's fused updates apply."""
    a0 = arrays[0]
    return (isinstance(a0, np.ndarray) and a0.dtype in (np.float32, np.float64)
            and all(isinstance(a, np.ndarray) and a.ndim == 1 and a.flags.c_contiguous and a.dtype == a0.dtype
                    for a in arrays))


def _cpu_optim():
    """The CPU backend's fused updates (imported on first use: numba is not needed on the GPU path)."""
    from pydtnn.backends.cpu import optim as fused
    return fused


class Optimizer:
    name = None
    slots = ()                       # names of the per-parameter state buffers

    def __init__(self, learning_rate=0.01, decay=0.0):
        if not learning_rate > 0:
            raise ConfigError(f"{self.name}: learning_rate must be > 0, got {learning_rate} (--learning_rate)")
        if not decay >= 0:
            raise ConfigError(f"{self.name}: decay must be >= 0, got {decay} (--decay)")
        self.learning_rate, self.decay = float(learning_rate), float(decay)
        self.iterations = 0
        self.state = {}

    def _gradient(self, params, grads):
        if self.decay:
            return grads + self.decay * params
        return grads

    def step(self, params, grads):
        """One update of `params` in place from `grads` (flat arrays of one dtype)."""
        if not self.state:
            xp = array_module(params)
            self.state = {s: xp.zeros_like(params) for s in self.slots}
        self.iterations += 1
        self._update(params, self._gradient(params, grads))

    def _update(self, params, g):
        raise NotImplementedError

    def state_dict(self):
        return {"learning_rate": self.learning_rate, "iterations": self.iterations, **self.state}

    def load_state_dict(self, state, xp):
        self.learning_rate = float(state["learning_rate"])
        self.iterations = int(state["iterations"])
        self.state = {s: xp.asarray(state[s]) for s in self.slots if s in state}


class SGD(Optimizer):
    """Stochastic gradient descent with momentum (Polyak 1964; Nesterov's variant as Sutskever et al. 2013
    write it for deep learning):

        g <- g + decay w                     (L2 weight decay, as PyTorch's weight_decay)
        v <- momentum v - lr g;  w <- w + v  (nesterov: w <- w + momentum v - lr g)

    With a constant learning rate this is exactly `torch.optim.SGD(lr, momentum, nesterov=..., dampening=0,
    weight_decay=decay)` (whose buffer is b = momentum b + g, w -= lr b; v = -lr b). When the rate changes
    between steps the two differ: here v keeps the rates it was built with (as Keras and upstream PyDTNN),
    PyTorch applies the new rate to the whole buffer.
    Defaults: learning_rate 0.01, momentum 0.9 (PyTorch: lr 1e-3, momentum 0)."""
    name = "sgd"
    slots = ("velocity",)

    def __init__(self, learning_rate=0.01, momentum=0.9, nesterov=False, decay=0.0):
        super().__init__(learning_rate, decay)
        if not 0 <= momentum < 1:
            raise ConfigError(f"sgd: momentum must be in [0, 1), got {momentum} (--momentum)")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    def _update(self, params, g):
        lr, mu = self.learning_rate, self.momentum
        if mu == 0:
            params -= lr * g
            return
        v = self.state["velocity"]
        if _fusable(params, v, g):
            _cpu_optim().sgd_momentum(params, v, g, params.dtype.type(lr), params.dtype.type(mu), self.nesterov)
            return
        v *= mu
        v -= lr * g
        if self.nesterov:
            params += mu * v - lr * g
        else:
            params += v


class RMSProp(Optimizer):
    """RMSProp (Hinton, Neural Networks for Machine Learning, lecture 6e, 2012):

        c <- rho c + (1 - rho) g^2;  w <- w - lr g / (sqrt(c) + epsilon)

    exactly `torch.optim.RMSprop(lr, alpha=rho, eps=epsilon, weight_decay=decay)` (momentum 0, not centered).
    Defaults differ from PyTorch's: rho 0.9 (PyTorch alpha 0.99), epsilon 1e-7 (PyTorch 1e-8);
    learning_rate 0.01 is the same."""
    name = "rmsprop"
    slots = ("cache",)

    def __init__(self, learning_rate=0.01, rho=0.9, epsilon=1e-7, decay=0.0):
        super().__init__(learning_rate, decay)
        _check_unit(self.name, "rho", rho)
        _check_epsilon(self.name, epsilon)
        self.rho, self.epsilon = float(rho), float(epsilon)

    def _update(self, params, g):
        xp = array_module(params)
        c = self.state["cache"]
        if _fusable(params, c, g):
            _cpu_optim().rmsprop(params, c, g, self.rho, self.learning_rate, self.epsilon)
            return
        c *= self.rho
        c += (1 - self.rho) * g * g
        params -= self.learning_rate * g / (xp.sqrt(c) + self.epsilon)


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015, Algorithm 1, with epsilon added to sqrt(v_hat) as PyTorch and Keras do):

        m <- beta1 m + (1 - beta1) g;  v <- beta2 v + (1 - beta2) g^2
        w <- w - lr (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)

    with `decay` added to the gradient (L2), exactly `torch.optim.Adam(lr, betas=(beta1, beta2), eps=epsilon,
    weight_decay=decay)`.
    DEFAULTS DIFFER FROM PYTORCH'S: beta1 = 0.99 and epsilon = 1e-7 are upstream PyDTNN's (and the
    launcher's --beta1 / --epsilon); PyTorch and the paper use beta1 = 0.9, epsilon = 1e-8. Pass
    `beta1=0.9, epsilon=1e-8` to reproduce a PyTorch run."""
    name = "adam"
    slots = ("m", "v")

    def __init__(self, learning_rate=0.001, beta1=0.99, beta2=0.999, epsilon=1e-7, decay=0.0):
        super().__init__(learning_rate, decay)
        _check_unit(self.name, "beta1", beta1)
        _check_unit(self.name, "beta2", beta2)
        _check_epsilon(self.name, epsilon)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def _raw_moments(self, g):
        m, v = self.state["m"], self.state["v"]
        m *= self.beta1
        m += (1 - self.beta1) * g
        v *= self.beta2
        v += (1 - self.beta2) * g * g
        return m, v

    def _moments(self, g):
        m, v = self._raw_moments(g)
        t = self.iterations
        return m / (1 - self.beta1 ** t), v / (1 - self.beta2 ** t)

    def _update(self, params, g):
        if self._fused(params, g):
            return
        xp = array_module(params)
        m_hat, v_hat = self._moments(g)
        params -= self.learning_rate * m_hat / (xp.sqrt(v_hat) + self.epsilon)

    def _fused(self, params, g, decoupled=False) -> bool:
        """The CPU backend's one-pass update (NumPy's numbers, bit for bit), where the arrays allow it."""
        m, v = self.state["m"], self.state["v"]
        if not _fusable(params, m, v, g):
            return False
        _cpu_optim().adam(params, m, v, g, self.beta1, self.beta2, self.iterations, self.learning_rate,
                          self.epsilon, self.decay if decoupled else 0.0, decoupled)
        return True


class Nadam(Adam):
    """NAdam (Dozat 2016, "Incorporating Nesterov momentum into Adam"), as `torch.optim.NAdam` and Keras
    implement it, with Dozat's momentum schedule mu_t = beta1 (1 - 0.5 * 0.96^(t momentum_decay)):

        m <- beta1 m + (1 - beta1) g;  v <- beta2 v + (1 - beta2) g^2
        w <- w - lr [mu_{t+1} m / (1 - prod_{i<=t+1} mu_i) + (1 - mu_t) g / (1 - prod_{i<=t} mu_i)]
                  / (sqrt(v / (1 - beta2^t)) + epsilon)

    momentum_decay = 4e-3 is PyTorch's default and the paper's 0.96^(t/250) (0 gives the constant
    mu = beta1 / 2, not beta1, in both). The product of the mu_i is state (saved in checkpoints). With `decay`
    added to the gradient (L2), exactly `torch.optim.NAdam(lr, betas, eps, weight_decay=decay,
    momentum_decay)`; PyTorch keeps that product in float32 unless torch's default dtype is float64.
    DEFAULTS DIFFER FROM PYTORCH'S: learning_rate 0.001, beta1 0.99, epsilon 1e-7 (upstream's and the
    launcher's); PyTorch uses lr 2e-3, beta1 0.9, eps 1e-8."""
    name = "nadam"

    def __init__(self, learning_rate=0.001, beta1=0.99, beta2=0.999, epsilon=1e-7, decay=0.0,
                 momentum_decay=4e-3):
        super().__init__(learning_rate, beta1, beta2, epsilon, decay)
        if not (math.isfinite(momentum_decay) and momentum_decay >= 0):
            raise ConfigError(f"nadam: momentum_decay must be a finite number >= 0, got {momentum_decay}")
        self.momentum_decay = float(momentum_decay)
        self.mu_product = 1.0          # prod_{i<=t} mu_i

    def _mu(self, t):
        return self.beta1 * (1.0 - 0.5 * 0.96 ** (t * self.momentum_decay))

    def _update(self, params, g):
        xp = array_module(params)
        t = self.iterations
        mu, mu_next = self._mu(t), self._mu(t + 1)
        self.mu_product *= mu
        kg = self.learning_rate * (1 - mu) / (1 - self.mu_product)
        km = self.learning_rate * mu_next / (1 - self.mu_product * mu_next)
        m, v = self.state["m"], self.state["v"]
        if _fusable(params, m, v, g):
            _cpu_optim().nadam(params, m, v, g, self.beta1, self.beta2, t, self.epsilon, kg, km)
            return
        m, v = self._raw_moments(g)
        denom = xp.sqrt(v / (1 - self.beta2 ** t)) + self.epsilon
        params -= kg * g / denom
        params -= km * m / denom

    def state_dict(self):
        return dict(super().state_dict(), mu_product=self.mu_product)

    def load_state_dict(self, state, xp):
        super().load_state_dict(state, xp)
        saved = state.get("mu_product")
        if saved is None:                  # a checkpoint from before the schedule: recompute it
            saved = math.prod(self._mu(t) for t in range(1, self.iterations + 1))
        if isinstance(saved, bool) or not isinstance(saved, (int, float)) or not 0 < saved <= 1:
            raise ConfigError(f"nadam: saved state mu_product must be a number in (0, 1], got {saved!r}")
        self.mu_product = float(saved)


class AdamW(Adam):
    """AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019, Algorithm 2 with the schedule
    multiplier eta_t = lr, as `torch.optim.AdamW`):

        w <- w - lr (m_hat / (sqrt(v_hat) + epsilon) + decay w)

    The decay is not added to the gradient, so it does not enter the moments; `decay` is PyTorch's
    weight_decay. Exactly `torch.optim.AdamW(lr, betas, eps, weight_decay=decay)`.
    DEFAULTS DIFFER FROM PYTORCH'S: beta1 0.99, epsilon 1e-7 and decay 0 (PyTorch: 0.9, 1e-8 and
    weight_decay 0.01)."""
    name = "adamw"

    def __init__(self, learning_rate=0.001, beta1=0.99, beta2=0.999, epsilon=1e-7, decay=0.0):
        super().__init__(learning_rate, beta1, beta2, epsilon, decay)
        # lr * decay >= 1 would flip (or zero) every weight's sign in one step
        if not self.learning_rate * self.decay < 1:
            raise ConfigError(f"adamw: learning_rate x decay must be in [0, 1), got "
                              f"{self.learning_rate} x {self.decay} (--learning_rate, --decay)")

    def _gradient(self, params, grads):
        return grads                  # decoupled: the decay is applied in _update, outside the moments

    def _update(self, params, g):
        if self._fused(params, g, decoupled=True):
            return
        xp = array_module(params)
        m_hat, v_hat = self._moments(g)
        step = m_hat / (xp.sqrt(v_hat) + self.epsilon)
        if self.decay:
            step += self.decay * params       # the weights before this step, as PyTorch
        params -= self.learning_rate * step


OPTIMIZERS = {cls.name: cls for cls in (SGD, RMSProp, Adam, Nadam, AdamW)}


def get_optimizer(name, **hyper):
    """An optimizer by upstream name; hyper-parameters it does not take are ignored (as the CLI passes all)."""
    import inspect
    try:
        cls = OPTIMIZERS[name]
    except KeyError:
        raise ConfigError(f"unknown optimizer {name!r}: choose one of {', '.join(OPTIMIZERS)}") from None
    accepted = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in hyper.items() if k in accepted})
