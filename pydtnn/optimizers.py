"""Optimizers that update the model's flat parameter buffer in one vectorized pass.

Hyper-parameter names follow upstream PyDTNN: learning_rate, momentum, nesterov, decay (L2 weight decay
added to the gradient; for adamw the decoupled decay of Loshchilov & Hutter), rho, beta1, beta2, epsilon. `learning_rate` may be changed between steps (LR
schedulers do). State (velocities, moments, step count) is exposed for checkpoints.
"""
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
    """Flat C-contiguous NumPy arrays of one dtype: the CPU backend's fused updates apply."""
    a0 = arrays[0]
    return all(isinstance(a, np.ndarray) and a.ndim == 1 and a.flags.c_contiguous and a.dtype == a0.dtype
               for a in arrays)


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
    """v = momentum v - lr g;  w += v  (Nesterov: w += momentum v - lr g)."""
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
            from pydtnn.backends._cpu_optim import sgd_momentum
            sgd_momentum(params, v, g, params.dtype.type(lr), params.dtype.type(mu), self.nesterov)
            return
        v *= mu
        v -= lr * g
        if self.nesterov:
            params += mu * v - lr * g
        else:
            params += v


class RMSProp(Optimizer):
    """c = rho c + (1 - rho) g^2;  w -= lr g / (sqrt(c) + epsilon)."""
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
        c *= self.rho
        c += (1 - self.rho) * g * g
        params -= self.learning_rate * g / (xp.sqrt(c) + self.epsilon)


class Adam(Optimizer):
    """Bias-corrected moments m, v;  w -= lr m_hat / (sqrt(v_hat) + epsilon)."""
    name = "adam"
    slots = ("m", "v")

    def __init__(self, learning_rate=0.001, beta1=0.99, beta2=0.999, epsilon=1e-7, decay=0.0):
        super().__init__(learning_rate, decay)
        _check_unit(self.name, "beta1", beta1)
        _check_unit(self.name, "beta2", beta2)
        _check_epsilon(self.name, epsilon)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def _moments(self, g):
        m, v = self.state["m"], self.state["v"]
        m *= self.beta1
        m += (1 - self.beta1) * g
        v *= self.beta2
        v += (1 - self.beta2) * g * g
        t = self.iterations
        return m / (1 - self.beta1 ** t), v / (1 - self.beta2 ** t)

    def _update(self, params, g):
        xp = array_module(params)
        m_hat, v_hat = self._moments(g)
        params -= self.learning_rate * m_hat / (xp.sqrt(v_hat) + self.epsilon)


class Nadam(Adam):
    """Adam with Nesterov momentum (Dozat 2016): the step uses beta1 m_hat + (1 - beta1) g / (1 - beta1^t)."""
    name = "nadam"

    def _update(self, params, g):
        xp = array_module(params)
        m_hat, v_hat = self._moments(g)
        t = self.iterations
        nesterov_m = self.beta1 * m_hat + (1 - self.beta1) * g / (1 - self.beta1 ** t)
        params -= self.learning_rate * nesterov_m / (xp.sqrt(v_hat) + self.epsilon)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019, as PyTorch's AdamW):
    w -= lr (m_hat / (sqrt(v_hat) + epsilon) + decay w). The decay is not added to the gradient, so
    it does not enter the moments; `decay` is the coefficient (PyTorch's weight_decay)."""
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
