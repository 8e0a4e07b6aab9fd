"""The launcher, as a flat composition root: upstream PyDTNN's flags, plus heterogeneity-aware data parallelism.

    python scripts/pydtnn_benchmark.py --model simplecnn --dataset synthetic --num_epochs 1
    mpiexec -n 3 python -m mpi4py scripts/pydtnn_benchmark.py --parallel data --global_batch_size 96 \
        --balance static --replica_speeds 1,2,3 ...

Read `run` top to bottom: parse -> configuration -> devices -> data and model -> policy and split -> trainer ->
train. Each step is a function testable in one process; those with more than wiring in them live in
`pydtnn.launch` (flags, config, agreement, devices, data_and_model, split, banner, outputs).

A user's mistake prints one line (`pydtnn: error: ...`) on rank 0 and every rank exits with status 2
(`pydtnn.parallel.runtime.shutdown`).
Exit statuses: 0 done; 2 a user's mistake or an output that cannot be written (the training's state saved
where it can be); 3 stopped by SIGTERM or SIGUSR1 after writing a full checkpoint (continue with --resume), or
during the probe before training, with nothing trained or written; 130 interrupted (Ctrl-C: after writing a
full checkpoint once training has started).
"""
from __future__ import annotations

import sys
import types

from pydtnn.errors import ConfigError, OutputError, PyDTNNError
from pydtnn.launch.agreement import agree_on_flags
from pydtnn.launch.banner import print_banner
from pydtnn.launch.config import check_combinations, configure, given_flags, merge_resumed_flags
from pydtnn.launch.data_and_model import build_data_and_model
from pydtnn.launch.devices import set_up_devices
from pydtnn.launch.flags import build_parser, parse_args
from pydtnn.launch.outputs import adopt_rank0_outputs, check_outputs, rescue_weights, save_final_weights
from pydtnn.launch.split import policy_and_split

EXIT_PREEMPTED = 3
EXIT_INTERRUPTED = 130


def parse_command_line(argv=None):
    """(flags, the names of those the command line gave). Under a launcher of several processes every rank
    then agrees that all were started with the same flags (`pydtnn.launch.agreement`): a rank whose
    flags do not parse, or that was given others (an MPMD launch, a per-node job script), stops every rank
    with one line."""
    error = p = None
    given = frozenset()
    try:
        p = parse_args(argv)
        given = given_flags(build_parser, argv)
    except ConfigError as e:
        error = e
    world = _world_for_agreement()
    if world is not None:
        agree_on_flags(world, build_parser(), p, error)
    elif error is not None:
        raise error
    return p, given


def _world_for_agreement():
    """MPI's COMM_WORLD under a launcher of several processes (MPI starts here then), else None."""
    from pydtnn.parallel.runtime import environment
    if not environment.launched_with_many_processes():
        return None
    from pydtnn.parallel.comm import MPIComm
    world = MPIComm().comm
    return world if world.Get_size() > 1 else None


def run(p, given=None):
    """Everything after parsing, as named steps. Raises PyDTNNError for the user's mistakes. ``given``: the
    names of the flags the command line gave (None: every attribute of ``p`` counts as given).

    Every check of the flags runs before any work and before the banner. Work that each rank does on its
    own (its device, its copy of the dataset and the model, the weights or checkpoint it reads) runs in
    blocks that end in one collective (`raise_together`), so that a mistake only one rank sees stops every
    rank at once with one line."""
    comm = communicator(p)                                        # serial, or MPI's world under mpiexec
    config = configuration(p, given, comm)                        # resumed flags merged; every cross-flag check
    devices = set_up_devices(config, comm)                        # threads per replica, speed emulation
    local = build_data_and_model(config, comm)                    # each rank's backend, model and data
    split = policy_and_split(config, local, comm)                 # the global batch and the policy's first split
    if p.enable_nccl and comm.size > 1:
        from pydtnn.parallel.comm import make_comm
        comm = make_comm("nccl")
    from pydtnn.training.loop import Preempted
    try:
        trainer = make_trainer(config, devices, local, split, comm)   # optimizer, schedulers, restored state, probe
    except Preempted as e:                 # a signal during the probe: every rank stopped together, nothing trained
        _end_preempted(e)
    if comm.rank == 0:
        print_banner(config, devices, local, split, trainer)
    return train(config, trainer, comm)


def communicator(p):
    """The communicator of the run (MPI starts here under a launcher)."""
    from pydtnn.parallel.comm import make_comm
    check_combinations(p)
    return make_comm("auto") if p.parallel == "data" else make_comm("serial")


def configuration(p, given, comm):
    """The one validated configuration (`pydtnn.launch.config.configure`), after --resume's flags are merged in."""
    from pydtnn.parallel.runtime import environment
    from pydtnn.parallel.comm import raise_together
    given = frozenset(vars(p)) if given is None else frozenset(given)
    resume_lines, anew, inherited, meta = [], set(), {}, None
    if p.resume:          # the checkpoint's run gives the flags this command line does not
        from pydtnn.training.checkpointing import read_meta

        def merge():
            saved = read_meta(p.resume)
            return saved, merge_resumed_flags(build_parser(), p, given, saved["flags"], p.resume)
        meta, (inherited, anew, resume_lines) = raise_together(comm, merge,
                                                               "another rank could not read its --resume checkpoint")
        if comm.size > 1:
            agree_on_flags(comm.comm, build_parser(), p, what="resumed from checkpoints of runs with")
    run_config = configure(p, comm.size, environment.launched_with_many_processes())
    run_config.notes = adopt_rank0_outputs(p, comm)              # rank 0 writes: every rank takes its outputs
    run_config.step_rows_kept = check_outputs(p, comm, meta) or []
    run_config.resume = types.SimpleNamespace(lines=resume_lines, anew=anew)
    run_config.given = given | frozenset(inherited)
    return run_config


def make_trainer(config, devices, local, split, comm):
    """The Trainer: optimizer, loss, schedulers and the rest from the flags; then the weights or checkpoint
    it restores and the speed probe of a policy that asks for one."""
    from pydtnn.losses import get_loss
    from pydtnn.optimizers import get_optimizer
    from pydtnn.parallel.comm import raise_together
    from pydtnn.schedulers import check_metrics, make_schedulers
    from pydtnn.training.loop import Trainer
    from pydtnn.training.options import Checkpointing, Emulation, Loop, Outputs, Parallelism
    p, model, dataset = config.p, local.model, local.dataset
    optimizer = get_optimizer(p.optimizer_name, learning_rate=config.learning_rate, momentum=p.momentum,
                              nesterov=p.nesterov, decay=p.decay, rho=p.rho, beta1=p.beta1, beta2=p.beta2,
                              epsilon=p.epsilon)
    has_val = dataset.val is not None
    schedulers = make_schedulers(p.lr_schedulers_names, p)
    check_metrics(schedulers, {"loss", *config.metrics}, has_val)
    if not has_val:          # metric-driven schedulers need validation data
        schedulers = [s for s in schedulers if not (getattr(s, "metric", "").startswith("val_")
                                                    and s.name != "model_checkpoint")]
    from pydtnn.observe.step_metrics import StepMetrics
    step_metrics = StepMetrics(comm.rank, p.tensorboard_dir, p.step_history_file, p.plots_dir,
                               keep_rows=config.step_rows_kept)
    trainer = Trainer(
        model, dataset, optimizer, loss=get_loss(p.loss_func, label_smoothing=p.label_smoothing), metrics=config.metrics,
        parallel=Parallelism(comm=comm, global_batch=split.global_batch, sizes=split.sizes, policy=config.policy,
                             gradient_weighting=config.weighting, non_blocking=p.non_blocking_mpi,
                             sync_batchnorm=p.sync_batchnorm and config.data_parallel, max_local_batch=split.caps,
                             clip_grad_norm=p.clip_grad_norm, devices=config.devices,
                             accumulation_steps=p.accumulation_steps, grad_compression=p.grad_compression),
        loop=Loop(steps_per_epoch=p.steps_per_epoch, seed=p.seed, schedulers=schedulers, callbacks=[step_metrics],
                  cuda_graphs=p.cuda_graphs),
        checkpointing=Checkpointing(checkpoint_dir=p.checkpoint_dir, save_steps=p.model_checkpoint_save_steps,
                                    save_minutes=p.model_checkpoint_save_minutes, handle_signals=True),
        outputs=Outputs(history_file=p.history_file, progress=p.progress_bar,
                        tracer_output=p.tracer_output if p.tracing else None, flags=vars(p),
                        trace_steps=config.trace_steps, profile_layers=p.profile_layers),
        emulation=Emulation(devices.emulate, devices.emulate_spin, devices.emulate_reference, devices.emulate_cost,
                            devices.emulate_schedule))
    anew = config.resume.anew

    def restore():
        if p.weights_and_bias_filename:
            from pydtnn.weights import load_weights
            load_weights(p.weights_and_bias_filename, model)
        if p.resume:
            # a measured split (probe or dynamic) continues from the checkpoint; one given by flags is the flags'
            trainer.resume(p.resume, keep_split=trainer.policy.measured,
                           learning_rate=config.learning_rate if "learning_rate" in anew else None,
                           restore_optimizer="optimizer_name" not in anew)
            if trainer.start_epoch >= p.num_epochs and not p.evaluate_only:
                raise ConfigError(f"--resume {p.resume}: its run trained {trainer.start_epoch} epoch(s) and "
                                  f"--num_epochs {p.num_epochs} is the total, so nothing is left to train: give "
                                  f"--num_epochs above {trainer.start_epoch} (or --evaluate_only true)")
    raise_together(comm, restore, "another rank could not read its weights or checkpoint")
    trainer.probe_split()
    return trainer


def train(config, trainer, comm):
    """Evaluate and/or train as the flags say, then the final weights and the report; the exit status."""
    from pydtnn.training.loop import Preempted
    p, model, rank, test = config.p, trainer.model, comm.rank, trainer.dataset.test
    if p.evaluate_only:
        _print_eval(trainer, test, "evaluation", rank)
        return 0
    if p.evaluate_on_train:
        _print_eval(trainer, test, "test before training", rank)
    try:
        if p.profile and rank == 0:
            import cProfile
            import pstats
            profiler = cProfile.Profile()
            profiler.runcall(trainer.fit, p.num_epochs)
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
        else:
            trainer.fit(p.num_epochs)
    except Preempted as e:                 # every rank stopped after the same step (agreed in the step's allreduce)
        _end_preempted(e)
    except OutputError as e:
        # an output failed after a whole step (a history row, a checkpoint, the trace): the weights are whole
        raise OutputError(f"{e}{rescue_weights(p, model, comm)}") from None
    if p.evaluate_on_train:
        _print_eval(trainer, test, "test after training", rank)
    save_final_weights(p, model, comm)
    if rank == 0:
        for line in trainer.report():
            print(line)
        if p.profile_layers:
            from pydtnn.observe.layer_profile import measure_peak_flops
            print(trainer.layer_profile.table(measure_peak_flops(model.backend),
                                              title=f"layer profile of rank 0 (b_i = {trainer.sizes[0]})"))
    comm.barrier()
    return 0


def _end_preempted(e):
    """Every rank ends together on a signal: 130 for Ctrl-C, 3 for SIGTERM or SIGUSR1 (one line: where the
    checkpoint went, or, stopped in the probe before training, that nothing was trained or written)."""
    import signal
    from pydtnn.parallel.runtime import shutdown
    shutdown.end_job(EXIT_INTERRUPTED if e.signum == signal.SIGINT else EXIT_PREEMPTED, f"pydtnn: {e}",
                     launcher_ending=e.launcher_ending)


def _print_eval(trainer, split, what, rank):
    results = trainer.evaluate(split)
    if rank == 0:
        print(f"{what}: " + ", ".join(f"{k}={v:.4f}" for k, v in results.items()))


def main(argv=None) -> int:
    from pydtnn.parallel.runtime import shutdown
    # a log file or a launcher's pipe gets whole lines, in order, as they happen
    getattr(sys.stdout, "reconfigure", lambda **kw: None)(line_buffering=True)
    try:
        p, given = parse_command_line(argv)
        return run(p, given)
    except PyDTNNError as e:
        shutdown.exit_on_user_error(e)
    except KeyboardInterrupt:
        print("pydtnn: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        from pydtnn.plugins import raised_by_users_code, user_error
        if raised_by_users_code(e):      # a user's layer, callback or data that raised while training
            shutdown.exit_on_user_error(user_error("your code raised", e))
        shutdown.abort_on_bug()
        raise
