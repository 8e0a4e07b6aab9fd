"""The ranks agree that they were started with the same flags (MPMD launches and per-node job scripts can
start them with others): one digest per flag, compared in one collective, and one line naming the first flag
that differs and its value on each group of ranks.
"""
from __future__ import annotations

import hashlib

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.launch.flags import flag_dests, flag_text, json_value, option_of

# Flags that may differ between ranks: a rank's own threads; files each rank reads from its own node
# (only whether they are given must agree); what only rank 0 writes or shows.
PER_RANK_FLAGS = frozenset({"threads_per_replica", "history_file", "save_weights_and_bias_filename",
                            "tracer_output", "checkpoint_dir", "progress_bar", "profile", "tensorboard_dir",
                            "step_history_file", "plots_dir", "verbose"})
PRESENCE_FLAGS = frozenset({"dataset_train_path", "dataset_test_path", "weights_and_bias_filename", "resume"})

DIGEST_BITS = 62


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> (64 - DIGEST_BITS)


def flag_digests(parser, p) -> np.ndarray:
    """One 62-bit digest per flag that must be equal on every rank (int64, in the parser's order); for a
    flag naming a rank's own file, only whether it is given; 0 for those that may differ."""
    out = []
    for dest in flag_dests(parser):
        if dest in PER_RANK_FLAGS:
            out.append(0)
        elif dest in PRESENCE_FLAGS:
            out.append(_digest(f"{dest}={getattr(p, dest) is not None}"))
        else:
            out.append(_digest(f"{dest}={json_value(getattr(p, dest))!r}"))
    return np.asarray(out, dtype=np.int64)


def first_difference(highest: np.ndarray, lowest: np.ndarray) -> int | None:
    """Index of the first flag whose digest is not the same on every rank (from the elementwise maximum and
    minimum over the ranks), or None."""
    differ = np.flatnonzero(highest != lowest)
    return int(differ[0]) if differ.size else None


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def values_by_rank(values: list) -> str:
    """Each value with the ranks that have it, in rank order: "2 on ranks 0-1 and 3 on rank 2"."""
    groups: dict = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    return " and ".join(f"{value} on {_ranks(ranks)}" for value, ranks in groups.items())


def describe_difference(option: str, values: list) -> str:
    """One line for a flag that differs: the value on each group of ranks, in rank order."""
    shown = values_by_rank(values)
    return (f"the ranks were started with different flags: {option} is {shown} (every rank needs the same "
            f"flags; only --threads_per_replica, the dataset, weights and checkpoint paths, and rank 0's "
            f"outputs may differ)")


def agree_on_flags(world, parser, p, error=None, what="started") -> None:
    """Every rank of `world` (an mpi4py communicator) calls this at the same point, with its parsed flags
    or the ConfigError that parsing them raised. One collective (an elementwise max of the digests and of
    their negatives) decides on every rank at once; then, only when something is wrong, the failing ranks'
    messages or the differing values are gathered, and every rank raises the same ConfigError (rank 0
    prints it)."""
    n = len(flag_dests(parser))
    digests = np.zeros(n, dtype=np.int64) if p is None else flag_digests(parser, p)
    buf = np.concatenate([digests, -digests, [1 if error is not None else 0]]).astype(np.int64)
    from mpi4py import MPI
    world.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
    if buf[-1]:                           # a rank could not parse its flags: its own message
        messages = world.gather(None if error is None else str(error), root=0)
        line = None
        if world.Get_rank() == 0:
            rank, line = next((r, m) for r, m in enumerate(messages) if m is not None)
            if rank != 0 and error is None:
                line = f"rank {rank}: {line}"
        raise ConfigError(world.bcast(line, root=0))
    index = first_difference(buf[:n], -buf[n:2 * n])
    if index is None:
        return
    dest = flag_dests(parser)[index]
    shown = f"given: {getattr(p, dest) is not None}" if dest in PRESENCE_FLAGS else flag_text(getattr(p, dest))
    values = world.gather(shown, root=0)
    line = describe_difference(option_of(parser, dest), values) if world.Get_rank() == 0 else None
    line = world.bcast(line, root=0)
    if what != "started":
        line = line.replace("were started with", what)
    raise ConfigError(line)
