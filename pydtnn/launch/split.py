"""The global batch and the balance policy's checked initial split of it, refused before any work when it
does not suit the training samples or a pass (a local batch, or its largest micro-batch) cannot fit in memory."""
from __future__ import annotations

import types

from pydtnn.launch.config import check_against_data


def policy_and_split(config, local, comm):
    """The global batch and the policy's initial split of it (`initial_split`), in a block that ends in a
    collective, then agreed on by every rank (a user's policy is told its rank: it could decide by it). It
    follows data and model: B must suit the training samples, and each local batch's activations must fit
    this rank's memory."""
    from pydtnn.parallel.balance import policy_calls
    from pydtnn.parallel.comm import raise_together
    from pydtnn.launch.config import learning_rate_in_force
    batch_given = bool({"batch_size", "global_batch_size"} & set(config.given))
    split = raise_together(comm, lambda: initial_split(config.p, config.policy, local.model, local.dataset,
                                                       comm.size, comm.rank, config.devices, config.weighting,
                                                       batch_given),
                           "another rank could not split the global batch")
    if policy_calls.needs_agreement(config.policy, comm):
        policy_calls.agree(comm, config.policy, split.sizes, None, "for the initial split")
    if split.batch_note:         # the same rate; its explanation names the batch in force
        config.learning_rate, config.learning_rate_why = learning_rate_in_force(config.p, config.nreplicas)
    return split


def initial_split(p, policy, model, dataset, nprocs, rank=0, devices=None, weighting=None, batch_given=True):
    """The global batch B, the memory caps (of one pass: `pydtnn.parallel.accumulation`) and the policy's
    checked initial sizes (pydtnn.parallel.balance.policies), which the policy keeps; refused when B does not
    suit the data or a pass does not fit memory. The policy is told its rank, the devices and --balance_options
    first; `weighting` (a user's --gradient_weighting) is called once on the split, so that a bad one fails
    before any work. Without `batch_given`, a default --batch_size larger than the training set shrinks to fit
    it (said in the returned ``batch_note``): a small dataset runs as written, a batch the user chose is refused."""
    from pydtnn.parallel.balance import policy_calls, proportional
    n = nprocs if p.parallel == "data" else 1
    B = p.global_batch_size or p.batch_size * n
    note = None
    if not batch_given and not p.global_batch_size and B > len(dataset.train) >= n:
        default, p.batch_size = p.batch_size, 1 << ((len(dataset.train) // n).bit_length() - 1)
        B = p.batch_size * n
        note = (f"batch: --batch_size {p.batch_size}, as the default {default}"
                f"{f' x {n} replicas' if n > 1 else ''} is more than the {len(dataset.train)} training samples")
    caps = proportional.caps_for(p.max_local_batch, n)
    check_against_data(p, dataset, B)
    sizes = policy_calls.initial_split(policy, B, n, None, rank,     # memory caps bound passes, not shares
                                       devices if devices is not None and len(devices) == n else None)
    if weighting is not None:
        weighting(sizes)
    _check_batch_fits(model, sizes, len(dataset.train), p, caps)
    return types.SimpleNamespace(global_batch=B, sizes=sizes, caps=caps, batch_note=note)


def _check_batch_fits(model, sizes, ntrain, p, caps=None):
    """A pass whose activations cannot fit in this machine's memory is refused before allocating: a pass holds
    one micro-batch of a local batch, the largest of any replica (`pydtnn.parallel.accumulation`: K of them,
    more above a replica's memory cap)."""
    from pydtnn.launch.limits import activation_bytes, check_fits
    from pydtnn.parallel.accumulation import micro_batch_counts
    held = sizes if p.steps_per_epoch > 0 else [min(b, ntrain) for b in sizes]   # a full pass never exceeds N
    counts = micro_batch_counts(held, p.accumulation_steps, caps)
    micro, local = max((-(-b // n), b) for b, n in zip(held, counts) if n)    # the largest pass
    flag = "--global_batch_size" if p.global_batch_size else "--batch_size"
    if micro < local:
        check_fits(activation_bytes(model, micro), f"a micro-batch of {micro} samples of {p.model_name} (a local "
                   f"batch of {local} in {-(-local // micro)} micro-batches)",
                   f"lower {flag} or raise --accumulation_steps")
        return
    check_fits(activation_bytes(model, local), f"a local batch of {local} samples of {p.model_name}",
               f"lower {flag} or give --accumulation_steps")
