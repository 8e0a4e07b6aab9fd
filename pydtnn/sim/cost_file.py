"""`pydtnn-simulate run --cost_model FILE`: each replica's compute t_i(b) from a cost model (the
`pydtnn.parallel.balance.cost_model.CostModel` the FPM fits), and what it was measured on.

FILE is a checkpoint (`.npz`) of a run whose policy kept a cost model (`--balance fpm` or `dynamic`), or this
JSON (docs/simulation.md; `pydtnn-simulate cost_model --checkpoint RUN.npz --out FILE` writes it from one):

    {"format": "pydtnn-cost-model/1",
     "model": "simplemlp",                  # the model whose steps were timed (required)
     "gradient_bytes": 2678824,             # its gradient bytes: parameters x dtype bytes (required)
     "measured_on": "free text",            # optional, printed
     "devices": ["gpu", "cpu"],             # one kind per replica of the file: "cpu" or "gpu"
     "replicas": [{"points": [[31, 0.0439], [254, 0.0655]]},      # [b, seconds of a step of b samples], ...
                  {"points": [[31, 0.0466], [254, 0.381]]}]}

A model for another model than the one simulated is refused (its name or its gradient bytes differ): its
t_i(b) would time another network's steps beside this one's gradient. The file is data: read with a size limit,
its numbers finite, its fields of their types, in one line naming the file and the field; the points
themselves are `CostModel.from_state`'s to judge.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance.cost_model import FORMAT, CostModel
from pydtnn.sim.devices import KINDS

__all__ = ["MAX_BYTES", "CostFile", "read_cost_file", "from_checkpoint", "write_cost_file"]

MAX_BYTES = 64 * 2**20                # as CostModel.load's limit; 10^5 replicas of 5 points are about 10 MiB
MAX_TEXT = 1000                       # characters of the model's name and of measured_on
MAX_DIGITS = 15                       # an integer of more digits is no batch size or byte count


@dataclass
class CostFile:
    path: str
    model: CostModel
    model_name: str
    gradient_bytes: int
    measured_on: str = ""

    @property
    def where(self) -> str:
        return f"--cost_model {self.path}"

    def check_model(self, model_name: str, gradient_bytes: int) -> None:
        """One line when the file was measured on another model than the one simulated."""
        if self.model_name != model_name:
            raise ConfigError(f"{self.where} was measured on model {self.model_name}, not {model_name} (the model "
                              f"simulated): its t_i(b) times another network's steps")
        if int(self.gradient_bytes) != int(gradient_bytes):
            raise ConfigError(f"{self.where} says {self.model_name} has {self.gradient_bytes} gradient bytes; the "
                              f"simulated {model_name} has {int(gradient_bytes)} (another dtype or another version "
                              f"of the model)")

    def assign(self, replicas: int, spec=None):
        """(index (P,), devices (P,), words): replica i's compute is ``model.replicas[index[i]]``. With
        `--devices` (`spec`), a replica of kind k takes the file's replicas of kind k in turn; without, replica
        i takes the file's replica i mod its count, and its device."""
        file_kinds = self.model.devices
        n = len(file_kinds)
        if spec is None:
            index = np.arange(replicas, dtype=np.int64) % n
            devices = (list(file_kinds) * (replicas // n + 1))[:replicas]
            told = ", ".join(f"{devices.count(k)} {k}" for k in dict.fromkeys(devices))
            return index, devices, (f"{told} (from {self.where}: replica i takes its replica i mod {n})")
        devices = spec.kinds(replicas)
        pattern = np.array([KINDS.index(k) for k in spec.pattern])
        kinds = np.tile(pattern, replicas // len(pattern))
        index = np.empty(replicas, dtype=np.int64)
        for k, kind in enumerate(KINDS):
            mine = kinds == k
            if not mine.any():
                continue
            of_kind = np.array([j for j, d in enumerate(file_kinds) if d == kind], dtype=np.int64)
            if of_kind.size == 0:
                raise ConfigError(f"--devices {spec.text} asks for {kind} replicas; {self.where} has none (its "
                                  f"devices: {','.join(file_kinds)})")
            index[mine] = of_kind[np.arange(int(mine.sum())) % of_kind.size]
        return index, devices, spec.describe(replicas)

    def describe(self) -> str:
        kinds = ", ".join(f"{self.model.devices.count(k)} {k}" for k in dict.fromkeys(self.model.devices))
        text = f"{self.where} ({self.model_name}, {self.gradient_bytes} gradient bytes; {kinds}"
        return text + (f"; {self.measured_on})" if self.measured_on else ")")


def read_cost_file(path: str) -> CostFile:
    """The --cost_model FILE: a checkpoint (.npz) or the JSON above."""
    if str(path).endswith(".npz"):
        return from_checkpoint(path)
    where = f"--cost_model {path}"
    doc = _read_json(path, where)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{where}: not a cost model (a JSON object with \"format\": \"{FORMAT}\")")
    name = doc.get("model")
    if not isinstance(name, str) or not name or len(name) > MAX_TEXT:
        raise ConfigError(f"{where}: \"model\" must name the model whose steps were timed (text), got "
                          f"{_shown(name)}")
    grad = doc.get("gradient_bytes")
    if isinstance(grad, bool) or not isinstance(grad, int) or grad < 1:
        raise ConfigError(f"{where}: \"gradient_bytes\" must be a whole number >= 1 (the model's parameters x its "
                          f"dtype's bytes), got {_shown(grad)}")
    measured_on = doc.get("measured_on", "")
    if not isinstance(measured_on, str) or len(measured_on) > MAX_TEXT:
        raise ConfigError(f"{where}: \"measured_on\" must be text of at most {MAX_TEXT} characters")
    devices, replicas = doc.get("devices"), doc.get("replicas")
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        raise ConfigError(f"{where}: \"devices\" must be a list of \"cpu\" / \"gpu\", one per replica, got "
                          f"{_shown(devices)}")
    bad = sorted({d for d in devices if d not in KINDS})
    if bad:
        raise ConfigError(f"{where}: \"devices\" holds {', '.join(map(repr, bad))}: a device is \"cpu\" or \"gpu\"")
    if not isinstance(replicas, list) or not replicas:
        raise ConfigError(f"{where}: \"replicas\" must be a non-empty list, one {{\"points\": [[b, seconds], ...]}} "
                          f"per replica")
    if len(devices) != len(replicas):
        raise ConfigError(f"{where}: {len(replicas)} replicas but {len(devices)} devices (one each)")
    for i, r in enumerate(replicas):
        if not isinstance(r, dict) or not isinstance(r.get("points"), list) or not r["points"]:
            raise ConfigError(f"{where}: replica {i} needs \"points\": a non-empty list of [b, seconds]")
    model = CostModel.from_state(doc, where)
    return CostFile(str(path), model, name, grad, measured_on)


def from_checkpoint(path: str) -> CostFile:
    """The cost model a run's policy kept in its checkpoint, with the run's model and gradient bytes."""
    from pydtnn.training.checkpointing import read_meta
    where = f"--cost_model {path}"
    meta = read_meta(path)
    flags = meta.get("flags")
    name = flags.get("model_name") if isinstance(flags, dict) else None
    dtype = flags.get("dtype") if isinstance(flags, dict) else None
    nparams = meta.get("nparams")
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        itemsize = None
    if not isinstance(name, str) or itemsize is None or isinstance(nparams, bool) or not isinstance(nparams, int):
        raise ConfigError(f"{where}: the checkpoint does not say its model, dtype and parameter count")
    for key in ("balancer", "balance_policy_state"):
        state = meta.get(key)
        if isinstance(state, dict) and state.get("model"):
            model = CostModel.from_state(state["model"], where)
            policy = meta.get("balance_policy", "")
            return CostFile(str(path), model, name, int(nparams) * itemsize,
                            f"checkpoint of a --balance {policy} run of {len(model)} replica(s)")
    raise ConfigError(f"{where}: the checkpoint's balance policy kept no cost model (run with --balance fpm or "
                      f"dynamic)")


def write_cost_file(cost: CostFile, out: str, devices=None, measured_on=None) -> None:
    """The JSON above, from a cost file (a checkpoint's): `devices` relabels its replicas (an emulated run's
    replicas are all cpu; `cost` takes the new labels), `measured_on` says where the times come from."""
    from pydtnn.outputs import atomic_write
    if devices is not None:
        if len(devices) != len(cost.model):
            raise ConfigError(f"--devices gives {len(devices)} devices for the {len(cost.model)} replicas of "
                              f"{cost.path}")
        cost.model.devices = list(devices)
    state = cost.model.state_dict()
    head = {"format": state["format"], "model": cost.model_name, "gradient_bytes": int(cost.gradient_bytes),
            "measured_on": cost.measured_on if measured_on is None else measured_on, "devices": state["devices"]}
    # one line per field and per replica: a file to read and to edit by hand
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    reps = [f"  {json.dumps(_rounded(r))}" for r in state["replicas"]]
    text = "{\n" + "\n".join(lines) + '\n "replicas": [\n' + ",\n".join(reps) + "\n ]\n}\n"
    atomic_write(out, lambda f: f.write(text.encode()))


def _rounded(replica: dict) -> dict:
    """A replica's state with its seconds to 6 significant digits (a timer's noise is larger), and no empty
    list of flagged passes."""
    out = {"points": [[int(b), float(f"{t:.6g}")] for b, t in replica["points"]]}
    if replica.get("flagged"):
        out["flagged"] = [[int(b), float(f"{t:.6g}")] for b, t in replica["flagged"]]
    return out


def _read_json(path: str, where: str):
    """At most MAX_BYTES of `path`, as JSON with finite numbers: one line for anything else."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{where}: {e.strerror or e}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_BYTES // 2**20} MiB, more than a cost model holds")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a text file (a cost model is JSON)") from None

    def constant(word):
        raise ConfigError(f"{where}: {word} is not a number a cost model can hold (finite numbers only)")

    def real(text):
        value = float(text)
        if not math.isfinite(value):
            raise ConfigError(f"{where}: {text} is not a finite number")
        return value

    def whole(text):
        if len(text.lstrip("-")) > MAX_DIGITS:
            raise ConfigError(f"{where}: {text[:20]}... has more than {MAX_DIGITS} digits")
        return int(text)
    try:
        return json.loads(text, parse_constant=constant, parse_float=real, parse_int=whole)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not JSON ({e.msg}, line {e.lineno})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a cost model") from None


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
