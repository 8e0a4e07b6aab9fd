"""The launcher's output files: rank 0's on every rank, every path checked writable (and never replacing a
file this run did not create) before any work, and the final weights, which are not lost when writing them
(or another output, during training) fails."""
from __future__ import annotations

import os

from pydtnn.errors import ConfigError, OutputError
from pydtnn.launch.config import OUTPUT_FLAGS
from pydtnn.launch.flags import flag_text


def adopt_rank0_outputs(p, comm) -> list[str]:
    """Rank 0 writes every output, so every rank takes rank 0's output flags (a collective): the collectives
    around the writes (the final weights', the trace's, a rescue's) are then entered by every rank whatever
    its own flags say. Returns one line per rank whose own values are not used (for rank 0 to print)."""
    if comm.size == 1:
        return []
    mine = [getattr(p, d) for d in OUTPUT_FLAGS]
    everyone = comm.comm.allgather(mine)
    lines = []
    for rank, values in enumerate(everyone[1:], start=1):
        differ = [f"--{d} {_shown(v)}" for d, v, v0 in zip(OUTPUT_FLAGS, values, everyone[0]) if v != v0]
        if differ:
            lines.append(f"note: rank {rank}'s {', '.join(differ)} not used: rank 0 writes every output "
                         f"(with rank 0's flags)")
    for d, v in zip(OUTPUT_FLAGS, everyone[0]):
        setattr(p, d, v)
    return lines


def _shown(value):
    return "(none)" if value is None else flag_text(value)


def check_outputs(p, comm, resumed=None):
    """Every output path is writable before any work, and replaces no file this run did not create unless
    --overwrite true (rank 0, which writes them, checks; all ranks agree). `resumed`: the metadata of the
    --resume checkpoint (a continuation may rewrite what its run wrote up to it: `pydtnn.launch.overwrites`)."""
    from pydtnn.parallel.comm import raise_together
    from pydtnn.outputs import check_output_dir, check_output_file
    from pydtnn.launch.overwrites import check_overwrites

    def check():
        check_output_file(p.history_file, "--history_file")
        check_output_file(p.save_weights_and_bias_filename, "--save_weights_and_bias_filename")
        if p.tracing:
            check_output_file(p.tracer_output, "--tracer_output")
        check_output_file(p.step_history_file, "--step_history_file")
        for flag in ("tensorboard_dir", "plots_dir"):
            if getattr(p, flag) is not None:       # an empty name is refused, not taken as "no output"
                check_output_dir(getattr(p, flag), f"--{flag}", create=False)
        if p.tensorboard_dir:
            try:
                import tensorboardX  # noqa: F401
            except ImportError:
                raise ConfigError("--tensorboard_dir needs tensorboardX (pip install tensorboardX)") from None
        # only checked: it is created by the first checkpoint (a run that writes none leaves no folder)
        check_output_dir(p.checkpoint_dir, "--checkpoint_dir", create=False)
        kept = check_overwrites(p, resumed)
        for flag in ("tensorboard_dir", "plots_dir"):       # created only once nothing is refused
            if getattr(p, flag):
                check_output_dir(getattr(p, flag), f"--{flag}", create=True)
        return kept
    return raise_together(comm, check, "rank 0 cannot write an output path", rank0_only=True)


def save_final_weights(p, model, comm):
    """Rank 0 writes the final weights; if that fails, it tries the checkpoint folder, then a temporary
    folder (never over a file there), and says where."""
    from pydtnn.parallel.comm import raise_together
    if not p.save_weights_and_bias_filename:
        return

    def save():
        from pydtnn.outputs import rescue_folders, unused_path
        from pydtnn.weights import save_weights
        try:
            save_weights(p.save_weights_and_bias_filename, model)
        except OutputError as e:
            failures = []
            for folder in rescue_folders(p.checkpoint_dir):
                fallback = unused_path(os.path.join(folder, "final_weights.npz"))
                try:
                    os.makedirs(folder, exist_ok=True)
                    save_weights(fallback, model)
                except (OutputError, OSError) as e2:
                    failures.append(f"{fallback}: {getattr(e2, 'strerror', None) or e2}")
                    continue
                raise OutputError(f"{e}; the trained weights were saved to {fallback} instead") from None
            raise OutputError(f"{e}; saving them to {' and '.join(failures)} failed too") from None
    raise_together(comm, save, "rank 0 could not write the final weights", rank0_only=True)


def rescue_weights(p, model, comm):
    """After an output failed during training, the weights still go to --save_weights_and_bias_filename (or
    its fall-backs); returns what to add to the error's line."""
    if not p.save_weights_and_bias_filename:
        return ""
    try:
        save_final_weights(p, model, comm)
    except OutputError as e:
        return f"; {e}"
    return f"; the trained weights were saved to {p.save_weights_and_bias_filename}"
