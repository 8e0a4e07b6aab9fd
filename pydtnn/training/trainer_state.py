"""The Trainer's state in a full checkpoint (`pydtnn.training.checkpointing`): what it writes, how it resumes.

Written: the epoch and the step inside it (and the steps per epoch), the split, every rank's RNG state, the
seed, the history, the schedulers', the user's callbacks' (`Callback.state_dict`) and the balance policy's
states, the flags, and (a checkpoint inside an epoch) that epoch's
partial sums and every rank's timing totals, so that the resumed epoch's history row is bit-exact.
Resumed: elastic (a checkpoint of P replicas resumes on Q), with what the caller chose anew winning over
the checkpoint (`restore`).
"""
from __future__ import annotations

import json
import os

import numpy as np

from pydtnn import plugins
from pydtnn.callbacks import state_keys
from pydtnn.errors import CheckpointError, ConfigError, OutputError, PyDTNNError
from pydtnn.parallel.balance import policy_calls
from pydtnn.parallel.comm import raise_together
from pydtnn.training.checkpointing import load_checkpoint, save_checkpoint


def save(trainer, path, epoch, step=0, partial=None):
    """Full state after `epoch` epochs and `step` more steps (a collective: every rank calls it; rank 0
    writes). An OutputError is raised on every rank; the previous file at `path` stays intact."""
    t = trainer
    rng_states = t.comm.gather_object(_rng_state(t.model), root=0)
    callbacks = _callback_states(t.callbacks)

    def write():
        meta = {"epoch": int(epoch), "step": int(step), "steps_per_epoch": t.steps_per_epoch, "nreplicas": t.nreplicas,
                "sizes": list(map(int, t.sizes)), "rng_states": rng_states, "seed": t.seed,
                "history": t.history, "schedulers": [[s.name, s.state_dict()] for s in t.schedulers],
                "callbacks": callbacks,
                "balancer": None, "balance_policy": t.policy.name,
                t.policy.checkpoint_key: policy_calls.call(t.policy, "state_dict") or None,
                "partial_epoch": partial, "flags": t.flags}
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot create the checkpoint folder {folder}: {e.strerror}") from None
        save_checkpoint(path, t.model, t.optimizer, json.loads(json.dumps(meta, default=_jsonable)))
    with t.span("checkpoint write", "checkpoint", always=True, path=os.path.basename(path)):
        raise_together(t.comm, write, f"rank 0 could not write the checkpoint {path}", rank0_only=True)


def restore(trainer, path, keep_split=True, learning_rate=None, restore_optimizer=True):
    """`Trainer.resume`: restore the state of a checkpoint (configuration stays the command line's); returns
    the checkpoint's metadata.

    Elastic: a checkpoint of P replicas resumes on Q. The split and a dynamic balancer's measurements
    are kept only when P == Q and the global batch is the same (and, for the split, `keep_split`: it
    was measured, not given by flags); otherwise the caller's split stands and is re-measured.
    What the caller chose anew wins over the checkpoint: `learning_rate` (the optimizer's rate and the
    schedulers' base rate), ``restore_optimizer=False`` (another optimizer: only the weights), and a
    seed other than the checkpoint's (a new data order, and a fresh dropout stream).
    """
    t = trainer
    meta = load_checkpoint(path, t.model, t.optimizer, restore_optimizer=restore_optimizer)
    t.start_epoch, t.start_step = meta["epoch"], meta["step"]
    t.history = list(meta["history"])
    same_layout = meta["nreplicas"] == t.nreplicas and sum(meta["sizes"]) == t.global_batch
    if t.start_step:
        part = meta["partial_epoch"]
        mine = {"global_batch": t.global_batch, "steps_per_epoch": t.steps_per_epoch,
                "train_samples": len(t.dataset.train)}
        for key, value in mine.items():
            if part[key] != value:
                raise CheckpointError(f"checkpoint {path} was written inside an epoch (step {t.start_step}) "
                                      f"with {key} {part[key]}, this run has {value}: resume with the same "
                                      f"data and global batch (--global_batch_size), or from an epoch-end "
                                      f"checkpoint")
        if len(part["sums"]) != 1 + len(t.metric_fns):
            raise CheckpointError(f"checkpoint {path} was written inside an epoch with other --metrics")
        t.resumed_partial = part
    _restore_rng(t, meta["rng_states"], path, meta["seed"])
    if keep_split and same_layout:
        t.sizes = list(meta["sizes"])          # memory caps bound micro-batches, not shares: it stands as saved
        t.restored_split = True
    saved = dict((name, st) for name, st in meta["schedulers"])
    for s in t.schedulers:
        if s.name in saved:
            try:
                s.load_state_dict(saved[s.name])
            except ConfigError as e:
                raise CheckpointError(f"checkpoint {path}: metadata field 'schedulers': {e}") from None
    _restore_callbacks(t.callbacks, meta.get("callbacks") or {}, path)
    key = t.policy.checkpoint_key
    state = meta.get(key)
    if state is not None and meta.get("balance_policy", t.policy.name) == t.policy.name:
        if same_layout:
            try:
                t.policy.load_state_dict(state)
            except (ConfigError, ValueError, KeyError, TypeError) as e:
                raise CheckpointError(f"checkpoint {path}: metadata field '{key}': {e}") from None
        else:
            t.log(f"resume: the {t.policy.name} policy's measurements of {meta['nreplicas']} replica(s) "
                  f"do not apply to {t.nreplicas}; starting from {t.sizes} and re-measuring")
    t.dp.adopt(t.sizes)
    if learning_rate is not None:
        t.optimizer.learning_rate = float(learning_rate)
        for s in t.schedulers:
            if getattr(s, "base_lr", None) is not None:
                s.base_lr = float(learning_rate)
    return meta


# --- the user's callbacks ----------------------------------------------------------------------------
def _callback_states(callbacks) -> dict:
    """{state_key: state} of the callbacks whose `state_dict` says something (a failing one: one line)."""
    out = {}
    for key, cb in zip(state_keys(callbacks), callbacks):
        method = getattr(cb, "state_dict", None)
        if not callable(method):
            continue
        try:
            state = method()
        except PyDTNNError:
            raise
        except Exception as e:                      # noqa: BLE001  (a user's code: one line and its frames)
            raise plugins.user_error(f"callback {key}: state_dict failed", e) from None
        if state:
            out[key] = state
    return out


def _restore_callbacks(callbacks, saved, path):
    """Each callback's saved state back (`load_state_dict`), by its key; a callback the checkpoint lacks starts
    fresh. A state the callback refuses is a CheckpointError naming it."""
    for key, cb in zip(state_keys(callbacks), callbacks):
        method = getattr(cb, "load_state_dict", None)
        if key not in saved or not callable(method):
            continue
        try:
            method(saved[key])
        except PyDTNNError:
            raise
        except Exception as e:                      # noqa: BLE001  (a user's code: one line and its frames)
            raise CheckpointError(f"checkpoint {path}: metadata field 'callbacks.{key}' refused by the callback: "
                                  f"{type(e).__name__}: {e}") from None


# --- an epoch checkpointed inside ---------------------------------------------------------------------
def partial_epoch(trainer, sums, samples):
    """What a checkpoint inside an epoch needs to finish that epoch's history row bit-exactly (a collective)."""
    t, stats = trainer, trainer.stats
    rows = t.comm.gather_object([stats.steps, stats.samples, stats.compute_s, stats.wait_s], root=0)
    return {"sums": [float(v) for v in sums], "samples": int(samples), "global_batch": t.global_batch,
            "steps_per_epoch": t.steps_per_epoch, "train_samples": len(t.dataset.train),
            "stats": rows if t.rank == 0 else None}


def resume_partial_epoch(part, sums, stats, rank, nreplicas):
    """The resumed epoch's sums so far into `sums`, and (same replica count) this rank's timing totals
    into `stats` (a ReplicaStats); returns the samples done."""
    sums[:] = part["sums"]
    rows = part.get("stats")
    if (isinstance(rows, list) and len(rows) == nreplicas and isinstance(rows[rank], list)
            and len(rows[rank]) == 4):
        steps, done, compute_s, wait_s = rows[rank]
        stats.steps, stats.samples = int(steps), int(done)
        stats.compute_s, stats.wait_s = float(compute_s), float(wait_s)
    return int(part["samples"])


# --- the pieces of a resume ----------------------------------------------------------------------------
def _rng_state(model):
    rng = model.backend.rng
    state = rng.bit_generator.state if hasattr(rng, "bit_generator") else None
    return json.loads(json.dumps(state, default=int))


def _restore_rng(t, states, path, seed):
    """Every saved RNG state is checked (on every rank, so all fail together); this rank's is restored."""
    rng = t.model.backend.rng
    if not hasattr(rng, "bit_generator"):
        return
    for r, state in enumerate(states):
        if state is None:
            continue
        try:
            _check_rng_state(state)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise CheckpointError(f"checkpoint {path}: metadata field 'rng_states[{r}]' is not a valid "
                                  f"random generator state ({e})") from None
    mine = states[t.rank] if t.rank < len(states) else None
    same_kind = mine is not None and mine.get("bit_generator") == rng.bit_generator.state.get("bit_generator")
    if same_kind:
        rng.bit_generator.state = mine
    if len(states) != t.nreplicas or seed != t.seed or (mine is not None and not same_kind):
        # (a replica on another device kind than in the checkpoint's run has another generator: a fresh stream)
        # another replica count (or seed): dropout streams cannot continue one to one; a fresh stream per rank
        # that depends on where training resumes (never a replay of epoch 1's masks)
        t.model.backend.seed(t.seed * 1000003 + t.rank + 7919 * (1 + t.start_epoch * 100003 + t.start_step))


# The integer fields of NumPy's generator states and their bounds (exclusive): NumPy converts them to C integers
# when a state is set, and an out-of-range value there is an OverflowError, or (MT19937's pos) a crash later.
_U32, _U64, _U128 = 1 << 32, 1 << 64, 1 << 128
_STATE_BOUNDS = {"has_uint32": 2, "uinteger": _U32, "buffer": _U64, "buffer_pos": 5}
_KIND_BOUNDS = {"PCG64": {"state": _U128, "inc": _U128}, "PCG64DXSM": {"state": _U128, "inc": _U128},
                "MT19937": {"key": _U32, "pos": 625}, "Philox": {"counter": _U64, "key": _U64},
                "SFC64": {"state": _U64}}


def _check_rng_state(state):
    """A saved generator state of any replica's kind (a mixed job has NumPy and GPU generators): every rank
    checks every state the same way, so all ranks accept or refuse a checkpoint together. A NumPy state must
    have exactly the fields of a fresh generator of its kind, each integer within its C type."""
    from pydtnn.backends.gpu import rng as _gpu_random
    kind = state.get("bit_generator") if isinstance(state, dict) else None
    if kind == _gpu_random.KIND:
        _gpu_random.check_state(state)
        return
    if kind not in _KIND_BOUNDS:
        raise ValueError(f"unknown generator kind {kind!r}")
    template = json.loads(json.dumps(getattr(np.random, kind)().state, default=_jsonable))
    _same_shape(state, template, {**_STATE_BOUNDS, **_KIND_BOUNDS[kind]}, None, kind)
    try:
        getattr(np.random, kind)().state = state
    except Exception as e:                          # noqa: BLE001  (whatever NumPy refuses)
        raise ValueError(f"{kind} state refused: {e}") from None


def _same_shape(value, template, bounds, field, where):
    """`value` has `template`'s keys, list lengths and types, every integer in [0, its field's bound)."""
    if isinstance(template, dict):
        if not isinstance(value, dict) or set(value) != set(template):
            raise ValueError(f"{where}: expected the fields {sorted(template)}")
        for key in template:
            _same_shape(value[key], template[key], bounds, key, f"{where}.{key}")
    elif isinstance(template, list):
        if not isinstance(value, list) or len(value) != len(template):
            raise ValueError(f"{where}: expected a list of {len(template)}")
        for v, t in zip(value, template):
            _same_shape(v, t, bounds, field, where)
    elif isinstance(template, bool) or not isinstance(template, int):
        if value != template:
            raise ValueError(f"{where}: expected {template!r}")
    elif not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < bounds.get(field, _U64)):
        raise ValueError(f"{where}: {value!r} is not an integer in [0, {bounds.get(field, _U64)})")


def _jsonable(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
