"""Seeing inside a run. Nothing here runs unless a flag asks for it, except the per-replica timing (every
step is timed: the per-replica table and the balancing policies read it) and the progress bar (on by
default, --progress_bar).

    timing.py         per-step compute / wait timers and per-replica totals (`StepTimer`, `ReplicaStats`,
                      `epoch_summary`): the numbers the per-replica table and the balancing policies read
    timeline.py       one rank's events and their Chrome / Perfetto trace (--tracing, --trace_steps)
    layer_timer.py    times each top-level layer's forward and backward (for the timeline and the profile)
    layer_profile.py  the per-layer table of milliseconds and GFLOP/s (--profile_layers)
    step_metrics.py   per-step and per-epoch scalars to a CSV (--step_history_file) and TensorBoard
                      (--tensorboard_dir), and the per-replica plot (--plots_dir)
    replica_plot.py   that plot: each replica's local batch, compute and wait over the steps
    progress.py       progress on stderr: a bar on a terminal, a plain line now and then in a log file (the
                      loop's epochs, a dataset's download, the simulator's steps)
"""
