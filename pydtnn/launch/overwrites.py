"""No output replaces a file that this run did not create, unless --overwrite true: checked before any work.

A new run refuses every output file that exists already. A resumed run (--resume) continues its checkpoint's
run, so it may write again what that run wrote up to the checkpoint, and nothing that run wrote after it
(resuming from an early checkpoint must not destroy the later epochs):

- --history_file: allowed when its rows are the checkpoint's own history (the same epochs and losses, up to
  the checkpoint): the resumed run writes them again, then its new rows;
- --step_history_file: allowed when its rows end at or before the checkpoint's step; they are kept and written
  again before the new ones (with --overwrite true, the rows after the checkpoint are dropped);
- --checkpoint_dir: a checkpoint of a later point than where this run starts (epoch_EEEE.npz,
  epoch_EEEE_step_SSSSSS.npz, best.npz) is refused: this run could write that name again;
- the final weights, the trace and the plot are refused when they exist (this run writes them anew).
"""
from __future__ import annotations

import csv
import json
import os
import re

from pydtnn.errors import CheckpointError, DatasetError, OutputError
from pydtnn.observe.step_metrics import PLOT_NAME

_POINT = re.compile(r"epoch_(\d+)(?:_step_(\d+))?\.npz$")


def check_overwrites(p, resumed=None) -> list[dict]:
    """Raise OutputError for the first output that would replace a file this run did not create (nothing
    with --overwrite true). `resumed`: the --resume checkpoint's metadata. Returns the rows of
    --step_history_file a resumed run keeps."""
    start = (resumed["epoch"], resumed["step"]) if resumed else (0, 0)
    kept = _step_rows_kept(p, resumed)
    if p.overwrite:
        return kept
    for flag, path in (("--save_weights_and_bias_filename", p.save_weights_and_bias_filename),
                       ("--tracer_output", p.tracer_output if p.tracing else None),
                       ("--plots_dir", os.path.join(p.plots_dir, PLOT_NAME) if p.plots_dir else None)):
        if path and os.path.lexists(path):
            _refuse(flag, path, "exists and this run did not create it")
    if p.history_file and os.path.lexists(p.history_file) and not _is_history_of(p.history_file, resumed):
        _refuse("--history_file", p.history_file,
                "exists and this run did not create it" if not resumed else
                f"is not the history of checkpoint {p.resume} up to its epoch {resumed['epoch']}")
    later = _later_checkpoints(p.checkpoint_dir, start)
    if later:
        shown = ", ".join(later[:3]) + (f" and {len(later) - 3} more" if len(later) > 3 else "")
        where = f"epoch {start[0]}, step {start[1]}" if start[1] else f"epoch {start[0]}"
        raise OutputError(f"--checkpoint_dir {p.checkpoint_dir} holds checkpoints of a later point than this run "
                          f"starts from ({where}), which it could write again: {shown}; give another "
                          f"--checkpoint_dir, resume from the latest one, or --overwrite true to replace them")
    return kept


def _refuse(flag, path, why):
    raise OutputError(f"{flag} {path} {why}: give another name, or --overwrite true to replace it")


def _later_checkpoints(folder, start) -> list[str]:
    """The checkpoint files in `folder` of a later point than `start` (epochs, steps), sorted by name."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    later = []
    for name in names:
        m = _POINT.fullmatch(name)
        if m:
            point = (int(m.group(1)), int(m.group(2) or 0))
        elif name == "best.npz":
            point = _point_of(os.path.join(folder, name))
        else:
            continue
        if point is None or point > start:
            later.append(name)
    return later


def _point_of(path):
    """(epoch, step) of a checkpoint file, or None when it cannot be read."""
    from pydtnn.training.checkpointing import read_meta
    try:
        meta = read_meta(path)
    except (CheckpointError, DatasetError, OutputError, OSError):
        return None
    return meta["epoch"], meta["step"]


def _read_rows(path):
    """The rows of a CSV (or a .json list of objects) history file, or None when it is neither."""
    try:
        with open(path, newline="") as f:
            if path.endswith(".json"):
                rows = json.load(f)
                return rows if isinstance(rows, list) and all(isinstance(r, dict) for r in rows) else None
            return list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, ValueError, csv.Error):
        return None


def _is_history_of(path, resumed) -> bool:
    """The file at `path` holds the checkpoint's own history (each row's epoch and loss), up to its epoch."""
    if not resumed:
        return False
    rows, saved = _read_rows(path), resumed["history"]
    if rows is None or len(rows) > len(saved):
        return False
    try:
        return all(int(r["epoch"]) == s.get("epoch") and float(r["loss"]) == s.get("loss")
                   for r, s in zip(rows, saved))
    except (KeyError, TypeError, ValueError):
        return False


def _step_rows_kept(p, resumed) -> list[dict]:
    """A resumed run's --step_history_file rows up to the checkpoint's global step (refused when the file
    goes further, unless --overwrite true); none for a new run, whose file must not exist."""
    path = p.step_history_file
    if not path or not os.path.lexists(path):
        return []
    if not resumed:
        if not p.overwrite:
            _refuse("--step_history_file", path, "exists and this run did not create it")
        return []
    rows = _read_rows(path)
    last = _global_step(resumed)
    try:
        steps = [int(r["step"]) for r in rows] if rows is not None else None
    except (KeyError, TypeError, ValueError):
        steps = None
    if steps is None or last is None:
        if not p.overwrite:
            _refuse("--step_history_file", path, f"cannot be continued from checkpoint {p.resume}")
        return []
    if max(steps, default=0) > last and not p.overwrite:
        _refuse("--step_history_file", path, f"holds steps after checkpoint {p.resume}'s step {last}")
    return [r for r, s in zip(rows, steps) if s <= last]


def _global_step(meta):
    """The global steps done at a checkpoint, or None for one that does not say its steps per epoch."""
    spe = meta.get("steps_per_epoch") or (meta.get("partial_epoch") or {}).get("steps_per_epoch")
    return meta["epoch"] * spe + meta["step"] if isinstance(spe, int) and spe > 0 else None
