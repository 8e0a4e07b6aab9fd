"""The launcher's output files: every path checked writable before any work, and the final weights, which
are not lost when writing them (or another output, during training) fails."""
from __future__ import annotations

import os

from pydtnn.errors import ConfigError, OutputError


def check_outputs(p, comm):
    """Every output path is writable before any work (rank 0, which writes them, checks; all ranks agree)."""
    from pydtnn.parallel.comm import raise_together
    from pydtnn.outputs import check_output_dir, check_output_file

    def check():
        check_output_file(p.history_file, "--history_file")
        check_output_file(p.save_weights_and_bias_filename, "--save_weights_and_bias_filename")
        if p.tracing:
            check_output_file(p.tracer_output, "--tracer_output")
        check_output_file(p.step_history_file, "--step_history_file")
        for flag in ("tensorboard_dir", "plots_dir"):
            if getattr(p, flag) is not None:       # an empty name is refused, not taken as "no output"
                check_output_dir(getattr(p, flag), f"--{flag}", create=True)
        if p.tensorboard_dir:
            try:
                import tensorboardX  # noqa: F401
            except ImportError:
                raise ConfigError("--tensorboard_dir needs tensorboardX (pip install tensorboardX)") from None
        # only checked: it is created by the first checkpoint (a run that writes none leaves no folder)
        check_output_dir(p.checkpoint_dir, "--checkpoint_dir", create=False)
    raise_together(comm, check, "rank 0 cannot write an output path", rank0_only=True)


def save_final_weights(p, model, comm):
    """Rank 0 writes the final weights; if that fails, it tries the checkpoint folder, and says where."""
    from pydtnn.training.checkpointing import save_weights
    from pydtnn.parallel.comm import raise_together
    if not p.save_weights_and_bias_filename:
        return

    def save():
        try:
            save_weights(p.save_weights_and_bias_filename, model)
        except OutputError as e:
            fallback = os.path.join(p.checkpoint_dir, "final_weights.npz")
            try:
                os.makedirs(p.checkpoint_dir, exist_ok=True)
                save_weights(fallback, model)
            except (OutputError, OSError) as e2:
                raise OutputError(f"{e}; saving them to {fallback} failed too ({e2}): the trained weights "
                                  f"are lost") from None
            raise OutputError(f"{e}; the trained weights were saved to {fallback} instead") from None
    raise_together(comm, save, "rank 0 could not write the final weights", rank0_only=True)


def rescue_weights(p, model, comm):
    """After an output failed during training, the weights still go to --save_weights_and_bias_filename (or
    its fall-back, --checkpoint_dir/final_weights.npz); returns what to add to the error's line."""
    if not p.save_weights_and_bias_filename:
        return ""
    try:
        save_final_weights(p, model, comm)
    except OutputError as e:
        return f"; {e}"
    return f"; the trained weights were saved to {p.save_weights_and_bias_filename}"
