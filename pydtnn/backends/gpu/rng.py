"""The GPU backend's random generator: counter-based, so its whole state is two integers.

`cupy.random.Generator` keeps its state on the device with no public way to read or restore it, so a
checkpoint could not capture it and a resumed run drew different dropout masks. `CounterRNG` draws number
k of a SplitMix64 stream keyed by the seed (kernel `uniform_fill` in `_gpu_kernels`): the state is
(seed, offset), advanced by the count of numbers drawn.

It offers the part of NumPy's Generator protocol that the rest of PyDTNN uses: `random(shape, dtype)` and
`bit_generator.state` (a JSON-able dict, read and assigned by the trainer's checkpoints and the launcher's
speed probe exactly as for the CPU backend's NumPy generator).

Inside a CUDA graph's capture (`drawing_from(base)`) the draws read the key and offset from the device pair
`base` instead of kernel arguments, which a graph would replay unchanged; each replay then writes the state
into `base` first (`set_base`) and advances the offset by the numbers the graph draws.
"""
from __future__ import annotations

import contextlib

import numpy as np

KIND = "pydtnn.CounterRNG/splitmix64"
_MASK64 = (1 << 64) - 1


def splitmix64_mix(z: int) -> int:
    """SplitMix64's output function (the kernel's `splitmix64_mix`), on Python ints."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class CounterRNG:
    """Uniform [0, 1) numbers on the device; `fill(out, key, offset)` launches the kernel."""

    def __init__(self, xp, dtype, fill, seed: int = 0, fill_at=None, set_base=None):
        """`fill(out, key, offset)`; for graphs `fill_at(out, base, delta)` and `set_base(base, key, offset)`
        (kernels `uniform_fill_at`, `rng_base_set`)."""
        self.xp, self.dtype, self._fill = xp, np.dtype(dtype), fill
        self._fill_at, self._set_base = fill_at, set_base
        self.seed_value, self.offset = int(seed) & _MASK64, 0
        self._base = None               # (device pair, offset at the capture's start) while a graph captures

    @property
    def bit_generator(self):
        """NumPy's Generator keeps its state on `bit_generator.state`; so does this one (itself)."""
        return self

    @property
    def state(self) -> dict:
        return {"bit_generator": KIND, "seed": self.seed_value, "offset": self.offset}

    @state.setter
    def state(self, value: dict) -> None:
        self.seed_value, self.offset = check_state(value)

    def random(self, size, dtype=None):
        """Uniform [0, 1) numbers of `size` (a shape) in the backend's dtype (or `dtype`, converted)."""
        shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
        out = self.xp.empty(shape, self.dtype)
        if out.size:
            if self._base is not None:
                base, start = self._base
                self._fill_at(out, base, np.uint64((self.offset - start) & _MASK64))
            else:
                self._fill(out, np.uint64(splitmix64_mix(self.seed_value)), np.uint64(self.offset & _MASK64))
            self.offset += int(out.size)
        return out if dtype is None or np.dtype(dtype) == self.dtype else out.astype(dtype)

    @contextlib.contextmanager
    def drawing_from(self, base):
        """Draws read their state from the device pair `base` for the block (a graph's capture); yields a
        list that holds, after the block, how many numbers the captured work draws. The offset is left as it
        was: a capture runs nothing."""
        start = self.offset
        self._base, drawn = (base, start), []
        try:
            yield drawn
        finally:
            drawn.append(self.offset - start)
            self._base, self.offset = None, start

    def set_base(self, base) -> None:
        """Write the state into the device pair `base` (before a replay), in stream order."""
        self._set_base(base, np.uint64(splitmix64_mix(self.seed_value)), np.uint64(self.offset & _MASK64))

    def load_graph_kernels(self, base) -> None:
        """Before a capture: the kernels its draws use (`uniform_fill_at`, `rng_base_set`) loaded now, as
        loading a module is no work a capture can hold; `base` written and one number drawn from it, thrown
        away (the offset stays)."""
        self.set_base(base)
        with self.drawing_from(base):
            self.random(1)


def check_state(value) -> tuple[int, int]:
    """(seed, offset) of a saved `CounterRNG` state; ValueError if it is not one (needs no device)."""
    if not isinstance(value, dict) or value.get("bit_generator") != KIND:
        kind = value.get("bit_generator") if isinstance(value, dict) else type(value).__name__
        raise ValueError(f"not a GPU generator state ({KIND}), got {kind!r}")
    seed, offset = value.get("seed"), value.get("offset")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (seed, offset)) or offset < 0:
        raise ValueError(f"a GPU generator state needs integer seed and offset >= 0, got {value!r}")
    return seed & _MASK64, offset
