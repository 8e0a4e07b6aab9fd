"""cuDNN convolutions for the GPU backend, over CuPy device pointers (NCHW, C-contiguous tensors).

`ConvRunner.run(op, x, w, y, spec)` with op in "fprop" (x, w -> y), "dgrad" (dy in `y`, w -> dx in `x`) and
"wgrad" (x, dy in `y` -> dw in `w`). Two implementations of one call:
- `frontend.FrontendConv` (primary): the cuDNN Frontend Python graph API;
- `legacy.LegacyConv`: the cuDNN 9 legacy C API through ctypes: where the frontend is missing, declines a
  geometry (float64, an unusual convolution...), and always for "fp32_strict" (`precision`).
Which one: the `impl` argument ("frontend" | "legacy" | "auto") when given, else $PYDTNN_GPU_CONV, else
"auto" (the frontend, the legacy API per geometry where the frontend cannot serve it).

Each convolution (op, shapes, spec) gets one record, built on its first call: its descriptors or graph and
its plans; later calls find it with one dictionary lookup and run it. With autotuning (`autotune`) a
record holds two plans, the heuristic's and the measured best; `guard` runs whole steps with each set and
keeps the faster one. Determinism (`deterministic=True`, for bit-exact reruns) allows only plans that give
the same bits every run, and turns autotuning off: two processes could pin different plans.

All records share one workspace buffer (CuPy's memory pool, grown on demand, reused; an outgrown buffer that
a CUDA graph captured lives on with the graph: `Workspace`) and run on CuPy's current stream.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from pydtnn.backends.gpu.cudnn import autotune
from pydtnn.backends.gpu.cudnn.library import find_libcudnn, load_libcudnn  # noqa: F401  (the locator's names)
from pydtnn.backends.gpu.cudnn.precision import check as check_precision
from pydtnn.backends.gpu.cudnn.precision import strict
from pydtnn.errors import ConfigError

IMPLS = ("auto", "frontend", "legacy")
LOG = logging.getLogger("pydtnn.gpu")


class Workspace:
    """One device scratch buffer from CuPy's memory pool, grown on demand and reused by every call (all
    calls run in order on one stream, so sharing is safe).

    A CUDA graph bakes in the buffer's address: a capture holds the buffer it used (`buf`, one of
    `GPUBackend.workspaces()`; `graphs.CapturedCall`). So growing RETIRES the buffer rather than freeing it:
    the workspace lets go of it, and CuPy's pool takes it back only when the last graph that holds it is
    dropped (at once where none does)."""

    def __init__(self, cupy):
        self.cp = cupy
        self.buf = cupy.empty(1 << 20, dtype=cupy.uint8)
        self._ptr = self.buf.data.ptr

    def ptr(self, nbytes: int) -> int:
        if nbytes > self.nbytes:
            self.retire()                   # first: where no graph holds it, its memory serves the new one
            self.buf = self.cp.empty(int(nbytes), dtype=self.cp.uint8)
            self._ptr = self.buf.data.ptr
        return self._ptr

    def retire(self) -> None:
        """Let go of the buffer (to the graphs that captured it, if any: they keep it alive as long as they
        live); the next `ptr` allocates a new one."""
        self.buf = self._ptr = None

    @property
    def nbytes(self) -> int:
        return 0 if self.buf is None else self.buf.nbytes


def _device_name(cupy) -> str:
    try:
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props.get("name", b"gpu")
        return (name.decode(errors="replace") if isinstance(name, bytes) else str(name)) + f"#{dev.id}"
    except Exception:  # noqa: BLE001 - the name only keys the plan cache
        return "gpu"


class ConvRunner:
    """Frontend first, legacy API where the frontend is missing or declines a geometry (see the module
    docstring). `report()` says which implementation serves which convolution."""

    def __init__(self, cupy, dtype, precision="fp32", impl=None, autotune_on=False, deterministic=False):
        if impl is None:                         # an explicit argument beats the environment
            impl = os.environ.get("PYDTNN_GPU_CONV") or "auto"
        if impl not in IMPLS:
            raise ConfigError(f"GPU convolution implementation must be one of {', '.join(IMPLS)}, got {impl!r}")
        check_precision(precision)
        if impl == "frontend" and strict(precision, np.dtype(dtype) == np.float32):
            raise ConfigError("precision fp32_strict runs on cuDNN's legacy API (its algorithms are named, the "
                              "frontend's engines are not): use conv_impl 'legacy' or 'auto'")
        self.cp, self.dtype, self.precision, self.impl = cupy, dtype, precision, impl
        self.deterministic = bool(deterministic)
        self.autotune = bool(autotune_on) and not self.deterministic
        self.workspace = Workspace(cupy)
        self.frontend = self.legacy = None
        self.fallbacks = {}          # key (or "frontend") -> why the legacy API serves it
        self.calls = {}              # (op, x.shape, w.shape, y.shape, spec) -> the convolution's record
        self.served = {}             # same key -> "frontend" | "legacy"
        self.tuned = True            # which plan of each record is in force (`guard`)
        self._device = _device_name(cupy)
        if strict(precision, np.dtype(dtype) == np.float32):
            self.fallbacks["frontend"] = "precision fp32_strict: the legacy API's named algorithms"
        elif impl in ("auto", "frontend"):
            try:
                from pydtnn.backends.gpu.cudnn.frontend import FrontendConv
                self.frontend = FrontendConv(cupy, dtype, precision, self.autotune, self.workspace, self.deterministic)
            except (ImportError, RuntimeError, OSError) as e:
                # ImportError: not installed; RuntimeError / OSError: installed, but its loader finds no
                # usable libcudnn ("Unable to find symbol cudnnCreate" from create_handle)
                why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                if impl == "frontend":
                    raise ConfigError(f"the cuDNN frontend cannot start ({why}): pip install "
                                      "nvidia-cudnn-frontend and nvidia-cudnn-cu13 (or -cu12)") from None
                self.fallbacks["frontend"] = f"cannot start: {why}"

    def _legacy(self, why=None):
        if self.legacy is None:
            try:
                from pydtnn.backends.gpu.cudnn.legacy import LegacyConv
                self.legacy = LegacyConv(self.cp, self.dtype, self.precision, self.autotune, self.workspace,
                                         self.deterministic)
            except ConfigError as e:
                if why is None:
                    raise
                raise ConfigError(f"{e} (the cuDNN frontend could not serve a convolution either: {why})") from None
        return self.legacy

    def _cache_key(self, impl, key) -> str:
        op, xs, ws, ys, spec = key
        version = impl.version
        return "|".join(map(str, (self._device, f"cudnn{version}", impl.name, np.dtype(self.dtype).name,
                                  self.precision, op, xs, ws, ys, spec.kernel, spec.stride, spec.padding,
                                  spec.dilation, spec.groups)))

    def run(self, op, x, w, y, spec):
        key = (op, x.shape, w.shape, y.shape, spec)
        call = self.calls.get(key)
        if call is None:
            call = self._build(key, x, w, y, spec)
        call.run(x, w, y)

    def _build(self, key, x, w, y, spec):
        op = key[0]
        why = self.fallbacks.get("frontend")
        if self.frontend is not None:
            try:
                self.frontend.set_stream()
                call = self.frontend.build(op, x, w, y, spec, self._cache_key(self.frontend, key))
                return self._keep(key, call, "frontend")
            except Exception as e:  # noqa: BLE001 - any decline of the frontend: fall back, say why
                if self.impl == "frontend":
                    raise
                why = self.fallbacks[key] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                if sum(1 for k in self.fallbacks if k != "frontend") == 1:
                    LOG.warning("pydtnn: note: the cuDNN frontend cannot serve a %s convolution (%s): the legacy "
                                "cuDNN API serves it (this note is printed once; GPUBackend.conv_report() lists "
                                "every fall-back)", op, why)
        legacy = self._legacy(why)
        legacy.set_stream()
        return self._keep(key, legacy.build(op, x, w, y, spec, self._cache_key(legacy, key)), "legacy")

    def _keep(self, key, call, how):
        call.use("tuned" if self.tuned else "heuristic")
        self.calls[key] = call
        self.served[key] = how
        return call

    # --- the step-level guard ------------------------------------------------------------------------------
    def use(self, tuned: bool) -> None:
        """Run every convolution with its tuned plan (True) or the heuristic's (False)."""
        self.tuned = bool(tuned)
        for call in self.calls.values():
            call.use("tuned" if self.tuned else "heuristic")

    def differs(self) -> bool:
        """Whether any convolution's tuned plan differs from its heuristic's."""
        return any(c.plans["tuned"] != c.plans["heuristic"] for c in self.calls.values())

    def guard(self, step, rounds: int = 3) -> dict:
        """Time whole `step()` calls with the tuned plans and with the heuristic's, alternated over `rounds`
        rounds (medians of event-timed steps), and keep the faster set. Returns {"tuned": ms, "heuristic": ms,
        "kept": "tuned" | "heuristic"}; nothing to compare (no autotuning, or no plan changed): {}."""
        if not self.autotune or not self.differs():
            return {}
        times = {"tuned": [], "heuristic": []}
        for _ in range(rounds):
            for which in ("heuristic", "tuned"):
                self.use(which == "tuned")
                start, stop = self.cp.cuda.Event(), self.cp.cuda.Event()
                start.record()
                step()
                stop.record()
                stop.synchronize()
                times[which].append(self.cp.cuda.get_elapsed_time(start, stop))
        ms = {k: autotune.median(v) for k, v in times.items()}
        kept = "tuned" if ms["tuned"] <= ms["heuristic"] else "heuristic"
        self.use(kept == "tuned")
        return {**ms, "kept": kept}

    def report(self) -> dict:
        counts = {"frontend": 0, "legacy": 0}
        for how in self.served.values():
            counts[how] += 1
        return {"impl": self.impl, "precision": self.precision, "autotune": self.autotune,
                "deterministic": self.deterministic, "plans": "tuned" if self.tuned else "heuristic",
                "served": counts, "tuned_differs": sum(c.plans["tuned"] != c.plans["heuristic"]
                                                       for c in self.calls.values()),
                "plans_passed_over": dict(self.frontend.passed_over) if self.frontend else {},
                "fallbacks": {str(k): v for k, v in self.fallbacks.items()}}
