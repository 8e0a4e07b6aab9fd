"""Compute-time variability: lognormal jitter and stragglers, as per-step factors on every replica.

- ``--noise SIGMA``: every replica's compute time at every step is multiplied by exp(SIGMA * z), z a
  standard normal (a lognormal factor of median 1).
- ``--stragglers K:FACTOR[:PERIOD]``: K replicas are FACTOR times slower. Without PERIOD, the K slowest
  ones are fixed (chosen at random once) and slow for the whole run. With PERIOD, time is cut into
  windows of PERIOD steps and each window slows a fresh random choice of K replicas (transient
  stragglers, which a static split cannot follow).

`Variability.factors(step)` is one (P,) array per step, drawn from one seeded generator, so a run is
reproducible and two policies simulated with the same seed see the same slowdowns.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pydtnn.errors import ConfigError

__all__ = ["Stragglers", "parse_stragglers", "Variability"]


@dataclass(frozen=True)
class Stragglers:
    count: int
    factor: float
    period: int = 0          # 0: permanent


def parse_stragglers(text: str | None) -> Stragglers | None:
    if text in (None, "", "0"):
        return None
    parts = str(text).split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        count, factor = int(parts[0]), float(parts[1])
        period = int(parts[2]) if len(parts) == 3 else 0
    except ValueError:
        raise ConfigError(f"--stragglers must be K:FACTOR[:PERIOD] (e.g. 8:2.0 or 8:2.0:50), got {text!r}") from None
    if count < 0 or not factor >= 1.0 or period < 0:
        raise ConfigError(f"--stragglers {text}: needs K >= 0, FACTOR >= 1 and PERIOD >= 0")
    return Stragglers(count, factor, period)


class Variability:
    def __init__(self, nreplicas: int, noise: float = 0.0, stragglers: Stragglers | None = None, seed: int = 0):
        if not noise >= 0.0:
            raise ConfigError(f"--noise must be >= 0, got {noise}")
        if stragglers is not None and stragglers.count > nreplicas:
            raise ConfigError(f"--stragglers {stragglers.count}: more stragglers than the {nreplicas} replicas")
        self.P, self.noise, self.stragglers = int(nreplicas), float(noise), stragglers
        self.rng = np.random.default_rng(seed)
        self._slow = np.ones(self.P)
        self._window = -1
        if stragglers is not None and stragglers.period == 0:
            self._pick()

    def _pick(self):
        self._slow = np.ones(self.P)
        if self.stragglers.count:
            self._slow[self.rng.choice(self.P, self.stragglers.count, replace=False)] = self.stragglers.factor

    def factors(self, step: int) -> np.ndarray:
        s = self.stragglers
        if s is not None and s.period and step // s.period != self._window:
            self._window = step // s.period
            self._pick()
        if self.noise:
            return self._slow * np.exp(self.noise * self.rng.standard_normal(self.P))
        return self._slow.copy()
