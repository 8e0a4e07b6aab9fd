"""`pydtnn-simulate run --devices`: each replica's device kind, counted.

    --devices gpu                   every replica a GPU
    --devices gpu,cpu,cpu,...       one kind per replica (as many as --replicas)
    --devices gpu:16,cpu:48         KIND:COUNT: 16 GPUs then 48 CPUs; with --replicas 1024 the 64 repeat 16 times
                                    (a pattern whose count divides --replicas: a node's devices, node after node)

What a replica's kind does: the policy is told it (fpm's GPU shape buckets), and with `--cost_model` it
picks the file's t_i(b) of that kind (`pydtnn.sim.cost_file`).
"""
from __future__ import annotations

from dataclasses import dataclass

from pydtnn.errors import ConfigError

__all__ = ["KINDS", "DeviceSpec", "parse_devices"]

KINDS = ("cpu", "gpu")


@dataclass(frozen=True)
class DeviceSpec:
    pattern: tuple                    # the kinds of one pattern, in order
    text: str                         # as given

    def kinds(self, replicas: int) -> list:
        """One kind per replica: the pattern repeated."""
        return list(self.pattern) * (replicas // len(self.pattern))

    def describe(self, replicas: int) -> str:
        counts = {k: self.pattern.count(k) * (replicas // len(self.pattern)) for k in dict.fromkeys(self.pattern)}
        told = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        times = replicas // len(self.pattern)
        return f"{told} (--devices {self.text}{f', repeated {times} times' if times > 1 else ''})"


def parse_devices(text: str, replicas: int) -> DeviceSpec:
    """--devices for `replicas` replicas; a malformed or uncounted one is one ConfigError line."""
    items = [x.strip() for x in str(text).split(",")]
    pattern = []
    for item in items:
        kind, sep, count = item.partition(":")
        kind = kind.strip().lower()
        if kind not in KINDS:
            raise ConfigError(f"--devices {text}: {item!r} is not a device kind ({' or '.join(KINDS)}, optionally "
                              f"KIND:COUNT, e.g. gpu:16,cpu:48)")
        n = 1
        if sep:
            if not count.strip().isdigit() or int(count) < 1:
                raise ConfigError(f"--devices {text}: the count of {item!r} must be a whole number >= 1")
            n = int(count)
            if n > replicas:
                raise ConfigError(f"--devices {text}: {item!r} counts more replicas than --replicas {replicas}")
        pattern.extend([kind] * n)
        if len(pattern) > replicas:
            raise ConfigError(f"--devices {text}: more than --replicas {replicas} devices")
    if replicas % len(pattern):                    # (one bare kind divides any count: every replica)
        raise ConfigError(f"--devices {text} gives {len(pattern)} devices, which neither is nor divides --replicas "
                          f"{replicas} (KIND:COUNT,... summing to {replicas}, or to a divisor of it that repeats: a "
                          f"node's devices)")
    return DeviceSpec(tuple(pattern), str(text))
