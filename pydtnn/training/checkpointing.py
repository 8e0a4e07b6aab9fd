"""Full training checkpoints (`--resume`, model_checkpoint, the loop's checkpoints inside epochs).

A checkpoint is a weights file (`pydtnn.weights`: NPZ, written atomically, read without pickle) plus the
optimizer's state arrays under "optimizer/..." and a JSON document under "__meta__" (stored as uint8
bytes) holding the epoch, the step, the scheduler and balancer states, the RNG states and the flag values.
What the Trainer puts in that document and how it restores it: `pydtnn.training.trainer_state`.
"""
from __future__ import annotations

import json
import math

import numpy as np

from pydtnn.errors import CheckpointError, ConfigError
from pydtnn.weights import META_KEY, OPTIMIZER_PREFIX, atomic_savez, open_npz, read_npz

FORMAT = "pydtnn-checkpoint-1"


def save_checkpoint(path: str, model, optimizer, meta: dict) -> None:
    arrays = dict(model.state_arrays())
    opt_state = optimizer.state_dict()
    for key, value in opt_state.items():
        if hasattr(value, "shape"):
            arrays[f"{OPTIMIZER_PREFIX}{key}"] = model.backend.to_numpy(value)
    meta = dict(meta, format=FORMAT, optimizer={k: v for k, v in opt_state.items() if not hasattr(v, "shape")},
                optimizer_name=optimizer.name, nparams=int(model.nparams))
    arrays[META_KEY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    atomic_savez(path, arrays)


def _decode_meta(raw, path) -> dict:
    if raw is None:
        raise CheckpointError(f"checkpoint {path} has no training state (a weights-only file? use "
                              f"--weights_and_bias_filename for those)")
    try:
        meta = json.loads(np.asarray(raw).tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"checkpoint {path}: its metadata is corrupt") from None
    validate_meta(meta, path)
    return meta


def read_meta(path: str) -> dict:
    """A checkpoint's metadata alone (counters, flags of its run), validated; its arrays are not read."""
    with open_npz(path, "checkpoint") as data:
        raw = data[META_KEY] if META_KEY in data.files else None
    return _decode_meta(raw, path)


def load_checkpoint(path: str, model, optimizer, restore_optimizer: bool = True) -> dict:
    """Restore weights and optimizer state in place; returns the metadata dict. Without
    ``restore_optimizer`` (another optimizer than the checkpoint's, chosen on purpose) only the weights."""
    arrays = read_npz(path, "checkpoint")
    meta = _decode_meta(arrays.pop(META_KEY, None), path)
    opt_arrays = {k[len(OPTIMIZER_PREFIX):]: arrays.pop(k) for k in list(arrays) if k.startswith(OPTIMIZER_PREFIX)}
    model.load_state_arrays(arrays, source=f"checkpoint {path}")
    if not restore_optimizer:
        return meta
    if meta["optimizer_name"] != optimizer.name:
        raise CheckpointError(f"checkpoint {path} was written with optimizer {meta.get('optimizer_name')}, "
                              f"not {optimizer.name}")
    state = dict(meta["optimizer"], **opt_arrays)
    missing = [s for s in optimizer.slots if s not in opt_arrays]
    if missing and meta["optimizer"]["iterations"] > 0:
        # resuming would restart these buffers from zero (no momentum, no moments): not the run it continues
        raise CheckpointError(f"checkpoint {path} lacks the {optimizer.name} optimizer's state "
                              f"{', '.join(OPTIMIZER_PREFIX + s for s in missing)} after "
                              f"{meta['optimizer']['iterations']} steps: resuming from it would restart "
                              f"{'them' if len(missing) > 1 else 'it'} from zero and not continue the run; resume "
                              f"from a complete checkpoint, or load its weights alone with "
                              f"--weights_and_bias_filename")
    for key, value in opt_arrays.items():
        if value.shape != (model.nparams,):
            raise CheckpointError(f"checkpoint {path}: optimizer state {key} has shape {value.shape}, expected "
                                  f"({model.nparams},)")
    try:
        optimizer.load_state_dict(state, model.xp)
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {path}: optimizer state: {e}") from None
    return meta


# --- metadata validation: every field the trainer reads, checked before anything is restored ----------

def _is_int(v, minimum=0):
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check(ok, path, field, expected, value):
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise CheckpointError(f"checkpoint {path}: metadata field {field!r} must be {expected}, got {shown}")


_MISSING = object()


def validate_meta(meta, path) -> None:
    """Raise CheckpointError naming the first field that is missing or of the wrong type or range."""
    _check(isinstance(meta, dict), path, "(top level)", "a JSON object", meta)
    get = lambda k: meta.get(k, _MISSING)
    if get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: unknown format {meta.get('format')!r} (expected {FORMAT})")
    for key, ok, expected in (
            ("epoch", _is_int, "an integer >= 0"),
            ("step", _is_int, "an integer >= 0"),
            ("nreplicas", lambda v: _is_int(v, 1), "an integer >= 1"),
            ("seed", _is_int, "an integer >= 0"),
            ("nparams", _is_int, "an integer >= 0"),
            ("optimizer_name", lambda v: isinstance(v, str), "a string"),
            ("history", lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v), "a list of objects"),
            ("flags", lambda v: isinstance(v, dict), "an object"),
            ("optimizer", lambda v: isinstance(v, dict), "an object")):
        _check(ok(get(key)), path, key, expected, get(key))
    if "steps_per_epoch" in meta:       # written since the checkpoints say it (older ones do not)
        _check(_is_int(meta["steps_per_epoch"], 1), path, "steps_per_epoch", "an integer >= 1", meta["steps_per_epoch"])
    n = meta["nreplicas"]
    sizes, rngs = get("sizes"), get("rng_states")
    _check(isinstance(sizes, list) and len(sizes) == n and all(_is_int(s, 1) for s in sizes), path, "sizes",
           f"a list of {n} integers >= 1", sizes)
    _check(isinstance(rngs, list) and len(rngs) == n and all(r is None or isinstance(r, dict) for r in rngs),
           path, "rng_states", f"a list of {n} objects", rngs)
    opt = meta["optimizer"]
    _check(_is_num(opt.get("learning_rate")) and opt.get("learning_rate") > 0, path, "optimizer.learning_rate",
           "a finite number > 0", opt.get("learning_rate"))
    _check(_is_int(opt.get("iterations")), path, "optimizer.iterations", "an integer >= 0", opt.get("iterations"))
    scheds = get("schedulers")
    _check(isinstance(scheds, list) and all(isinstance(s, list) and len(s) == 2 and isinstance(s[0], str)
                                            and isinstance(s[1], dict) for s in scheds),
           path, "schedulers", "a list of [name, object] pairs", scheds)
    callbacks = meta.get("callbacks")                 # written since callbacks resume (older ones lack it)
    _check(callbacks is None or isinstance(callbacks, dict), path, "callbacks", "null or an object", callbacks)
    bal = get("balancer")
    if bal is not None:
        _check(isinstance(bal, dict), path, "balancer", "null or an object", bal)
    if isinstance(bal, dict) and not ("ema" in bal or "sizes" in bal):     # the FPM dynamic policy's
        _check_policy_state(bal, "balancer", path, n)
    elif isinstance(bal, dict):                      # the constant-model balancer's, of older checkpoints
        for key in ("sizes", "ema") + (("window_sum",) if "window" not in bal else ()):
            v = bal.get(key)
            _check(isinstance(v, list) and all(_is_num(x) for x in v), path, f"balancer.{key}", "a list of numbers", v)
        _check(all(_is_num(v) and v > 0 for v in bal["ema"]), path, "balancer.ema", "a list of speeds > 0", bal["ema"])
        _check(all(_is_int(v, 1) for v in bal["sizes"]), path, "balancer.sizes", "a list of integers >= 1",
               bal["sizes"])
        if "window" in bal:          # the current window's observations: one row of n numbers per step
            v = bal["window"]
            _check(isinstance(v, list) and all(isinstance(row, list) and len(row) == n and all(_is_num(x) for x in row)
                                               for row in v), path, "balancer.window", f"a list of rows of {n} numbers", v)
        for key in ("n_observed", "n_rebalances") + (("window_n",) if "window" not in bal else ()):
            _check(_is_int(bal.get(key)), path, f"balancer.{key}", "an integer >= 0", bal.get(key))
    state = meta.get("balance_policy_state")
    if meta.get("balance_policy") == "fpm" and state is not None:      # a built-in's (a user's is the user's)
        _check_policy_state(state, "balance_policy_state", path, n)
    if meta["step"] > 0:                              # written inside an epoch: the partial epoch's sums
        part = get("partial_epoch")
        _check(isinstance(part, dict), path, "partial_epoch", "an object (the checkpoint is mid-epoch)", part)
        for key in ("global_batch", "steps_per_epoch", "train_samples"):
            _check(_is_int(part.get(key), 1), path, f"partial_epoch.{key}", "an integer >= 1", part.get(key))
        _check(_is_int(part.get("samples")), path, "partial_epoch.samples", "an integer >= 0", part.get("samples"))
        sums = part.get("sums")
        _check(isinstance(sums, list) and sums and all(_is_num(x) for x in sums), path, "partial_epoch.sums",
               "a non-empty list of numbers", sums)
        _check(meta["step"] < part["steps_per_epoch"], path, "step",
               f"below partial_epoch.steps_per_epoch ({part['steps_per_epoch']})", meta["step"])


def _check_policy_state(state, key, path, nreplicas):
    """The fpm or dynamic policy's state (its cost model, window, noise; `pydtnn.parallel.balance.policy_state`):
    types, finiteness and ranges, the first problem named as the checkpoint's field."""
    from pydtnn.parallel.balance.policy_state import state_problem
    problem = state_problem(state, nreplicas)
    if problem:
        field, expected, value = problem
        _check(False, path, key if field == "(top level)" else f"{key}.{field}", expected, value)
