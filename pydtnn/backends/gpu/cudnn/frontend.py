"""Convolutions through the cuDNN Frontend's Python graph API (`nvidia-cudnn-frontend`, `cudnn.pygraph`).

A graph is built once per convolution (op, shapes, spec) -- dtype and precision are fixed per backend -- and
kept in a `ConvCall` record with its plans; building (heuristics, plan compilation) is slow, running is not.
Strides are given in ELEMENTS (CuPy's `strides` are bytes).

Plans are built one index at a time, each inside a try: in Frontend 1.32 only NotImplementedError,
cudnnGraphNotSupportedError and ImportError count as a plan declining in `build_plans()`, and a plan that
raises anything else (a deselected plan raises RuntimeError too) would take the whole graph down with it.
The heuristic's plan is the first that builds; with autotuning, up to `autotune.MAX_CANDIDATES` plans that
build are timed (`autotune`). The first plan that fails (other than deselected or declining) is logged once
per runner (logger "pydtnn.gpu"); `passed_over` counts every plan passed over, by reason.
"""
from __future__ import annotations

import logging

import numpy as np

from pydtnn.backends.gpu.cudnn import autotune
from pydtnn.backends.gpu.cudnn.precision import NO_TF32_NOTES, no_tf32

LOG = logging.getLogger("pydtnn.gpu")
_AUTOTUNE_WS_LIMIT = 1 << 30          # plans needing more workspace are not timed


def strides(shape):
    """C-contiguous strides in elements."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= int(d)
    return out[::-1]


class ConvCall:
    """One convolution's graph and plans: `run(x, w, y)` executes the plan in force (the tuned one, or the
    heuristic's while a guard measures it); built once, nothing looked up per call but this object."""
    __slots__ = ("graph", "X", "W", "Y", "plans", "active", "handle", "ws", "set_stream")

    def __init__(self, graph, X, W, Y, plans, handle, workspace, set_stream):
        self.graph, self.X, self.W, self.Y, self.handle, self.ws = graph, X, W, Y, handle, workspace
        self.set_stream = set_stream
        self.plans = plans          # {"heuristic": (index, workspace bytes), "tuned": (index, bytes)}
        self.active = None if plans is None else plans["tuned"]

    def use(self, which: str) -> None:
        self.active = self.plans[which]

    def run(self, x, w, y):
        self.set_stream()
        index, nbytes = self.active
        self.graph.execute_plan_at_index({self.X: x.data.ptr, self.W: w.data.ptr, self.Y: y.data.ptr},
                                         self.ws.ptr(nbytes), index=index, handle=self.handle)


class FrontendConv:
    name = "frontend"

    def __init__(self, cupy, dtype, precision, autotune_on, workspace, deterministic=False):
        import cudnn     # ImportError when nvidia-cudnn-frontend is missing: the caller falls back
        self.cudnn, self.cp, self.ws = cudnn, cupy, workspace
        self.dt = cudnn.data_type.DOUBLE if np.dtype(dtype) == np.float64 else cudnn.data_type.FLOAT
        self.no_tf32 = no_tf32(precision, np.dtype(dtype) == np.float32)
        self.autotune, self.deterministic = autotune_on, deterministic
        self.handle = cudnn.create_handle()
        self.passed_over = {"deselected": 0, "declined": 0, "failed": 0}
        self._logged = False
        self._stream = None
        try:
            self.version = str(cudnn.backend_version())
        except Exception:  # noqa: BLE001 - an older frontend: the version only keys the plan cache
            self.version = "unknown"

    def set_stream(self):
        s = self.cp.cuda.get_current_stream().ptr
        if s != self._stream:
            self.cudnn.set_stream(handle=self.handle, stream=s)
            self._stream = s

    def deselected_notes(self) -> list:
        """The numerical notes this runner's precision and determinism rule out."""
        names = list(NO_TF32_NOTES if self.no_tf32 else ()) + (["NONDETERMINISTIC"] if self.deterministic else [])
        return [getattr(self.cudnn.numerical_note, n) for n in names]

    def build(self, op, x, w, y, spec, cache_key):
        """The ConvCall of this convolution (graph built, plans chosen); `cache_key` names it in the plan cache."""
        c, dt = self.cudnn, self.dt
        g = c.pygraph(io_data_type=dt, intermediate_data_type=dt, compute_data_type=dt, handle=self.handle)

        def tensor(name, shape):
            return g.tensor(name=name, dim=list(shape), stride=strides(shape), data_type=dt)

        kw = dict(padding=list(spec.padding), stride=list(spec.stride), dilation=list(spec.dilation),
                  compute_data_type=dt)
        if op == "fprop":
            X, W = tensor("X", x.shape), tensor("W", w.shape)
            Y = g.conv_fprop(image=X, weight=W, **kw)
            out = (Y, y.shape)
        elif op == "dgrad":
            Y, W = tensor("DY", y.shape), tensor("W", w.shape)
            X = g.conv_dgrad(loss=Y, filter=W, **kw)
            out = (X, x.shape)
        else:
            X, Y = tensor("X", x.shape), tensor("DY", y.shape)
            W = g.conv_wgrad(image=X, loss=Y, **kw)
            out = (W, w.shape)
        out[0].set_output(True).set_dim(list(out[1])).set_stride(strides(out[1])).set_data_type(dt)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([c.heur_mode.A, c.heur_mode.FALLBACK])
        notes = self.deselected_notes()
        if notes:
            g.deselect_numeric_notes(notes)
        g.check_support()
        call = ConvCall(g, X, W, Y, None, self.handle, self.ws, self.set_stream)
        call.plans = self._plans(op, g, call, x, w, y, cache_key)
        call.use("tuned")
        return call

    def _passed_over(self, e) -> str:
        """Why a plan is not a candidate: "deselected" (by our numerical-note filter: the backend raises
        RuntimeError "Deselecting execution plan", the Python layer ValueError "excluded by"), "declined" (the
        frontend's decline types: the engine does not serve this graph) or "failed" (anything else)."""
        text = str(e)
        if "Deselect" in text or "excluded by" in text:
            return "deselected"
        declines = (NotImplementedError, ImportError, getattr(self.cudnn, "cudnnGraphNotSupportedError", ()))
        # "Skipping plan since shared memory / workspace violation": the backend's own limits, a decline too
        return "declined" if isinstance(e, declines) or "Skipping plan" in text else "failed"

    def _name(self, g, i) -> str:
        try:
            return str(g.get_plan_name_at_index(i))
        except Exception:  # noqa: BLE001 - a frontend without plan names: the index stands for it
            return f"#{i}"

    def _candidates(self, g, limit):
        """(index, workspace bytes) of the plans that build, in the heuristic's order, at most `limit`."""
        out, failed = [], []
        for i in range(int(g.get_execution_plan_count())):
            try:
                g.build_plan_at_index(i)
                need = int(g.get_workspace_size_plan_at_index(i))
            except Exception as e:  # noqa: BLE001 - a deselected, declining or failing plan: the next one
                why = self._passed_over(e)
                self.passed_over[why] += 1
                if why == "failed":
                    failed.append((i, " ".join(f"{type(e).__name__}: {e}".split())[:200]))
                continue
            out.append((i, need))
            if len(out) >= limit:
                break
        if failed and not self._logged:
            self._logged = True
            served = f"plan {out[0][0]} serves it" if out else "no plan serves it"
            LOG.warning("pydtnn: note: cuDNN frontend graph: plan %d failed to build or run (%s); %s (this note is "
                        "printed once; GPUBackend.conv_report() counts every plan passed over)",
                        failed[0][0], failed[0][1], served)
        if not out:
            raise RuntimeError("no execution plan of the graph builds"
                               + (": " + "; ".join(f"[{i}] {why}" for i, why in failed[:3]) if failed else ""))
        return out

    def _plans(self, op, g, call, x, w, y, cache_key):
        """{"heuristic": (index, bytes), "tuned": (index, bytes)}: tuned by measurement when autotuning."""
        candidates = self._candidates(g, autotune.MAX_CANDIDATES if self.autotune else 1)
        heuristic = candidates[0]
        if not self.autotune or len(candidates) == 1:
            return {"heuristic": heuristic, "tuned": heuristic}
        names = {self._name(g, i): (i, need) for i, need in candidates}
        cached = autotune.lookup(cache_key)
        if cached is not None and cached["plan"] in names:
            return {"heuristic": heuristic, "tuned": names[cached["plan"]]}
        inputs = {"fprop": (x, w), "dgrad": (y, w), "wgrad": (x, y)}[op]
        sets = autotune.rotations(self.cp, inputs)
        timed = {}
        for name, (i, need) in names.items():
            if need > _AUTOTUNE_WS_LIMIT:
                continue
            ws = self.ws.ptr(need)
            out_ptr = {"fprop": y, "dgrad": x, "wgrad": w}[op].data.ptr

            def run(ops, i=i, ws=ws):
                a, b = ops
                pack = {"fprop": {call.X: a.data.ptr, call.W: b.data.ptr, call.Y: out_ptr},
                        "dgrad": {call.Y: a.data.ptr, call.W: b.data.ptr, call.X: out_ptr},
                        "wgrad": {call.X: a.data.ptr, call.Y: b.data.ptr, call.W: out_ptr}}[op]
                g.execute_plan_at_index(pack, ws, index=i, handle=self.handle)
            try:
                timed[name] = autotune.time_ms(self.cp, run, sets)
            except Exception as e:  # noqa: BLE001 - a plan that builds but fails to run: not a candidate
                self.passed_over[self._passed_over(e)] += 1
        if not timed:
            return {"heuristic": heuristic, "tuned": heuristic}
        heur_name = next(n for n, v in names.items() if v == heuristic)
        best = autotune.pick(timed, heur_name)
        autotune.store(cache_key, {"plan": best, "ms": {k: round(v, 4) for k, v in timed.items()}})
        return {"heuristic": heuristic, "tuned": names[best]}
