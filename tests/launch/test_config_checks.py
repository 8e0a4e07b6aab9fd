"""The launcher's checks across flags (pydtnn.launch.config), without MPI: given flags, the learning rate in
force, scheduler values, flags against the data, the resume rule; and the ranks' agreement on flags
(pydtnn.launch.agreement)."""
import types

import numpy as np
import pytest

from pydtnn.launch import agreement
from pydtnn.launch import config as cc
from pydtnn.cli import build_parser, parse_args
from pydtnn.launch.flags import flag_dests
from pydtnn.errors import CheckpointError, ConfigError


def test_given_flags_are_those_on_the_command_line_not_the_defaults():
    given = cc.given_flags(build_parser, ["--model", "simplemlp", "--learning_rate", "0.01", "--evaluate", "false"])
    # named by attribute (--model is model_name, --evaluate is evaluate_on_train), given even when equal to
    # the default
    assert given == {"model_name", "learning_rate", "evaluate_on_train"}
    assert cc.given_flags(build_parser, []) == frozenset()
    with pytest.raises(ConfigError, match="batch_size"):
        cc.given_flags(build_parser, ["--batch_size", "-1"])


def test_resume_with_a_weights_file_is_refused():
    cc.check_combinations(parse_args(["--resume", "ck.npz"]))
    with pytest.raises(ConfigError, match="--resume .* --weights_and_bias_filename .* give one of the two"):
        cc.check_combinations(parse_args(["--resume", "ck.npz", "--weights_and_bias_filename", "w.npz"]))


@pytest.mark.parametrize("args, replicas, rate, scaled", [
    ([], 1, 0.01, False),
    (["--parallel", "data"], 1, 0.01, False),                                     # one replica: x 1
    (["--parallel", "data"], 3, 0.03, True),                                      # B = batch_size x 3
    (["--parallel", "data", "--global_batch_size", "96"], 3, 0.01, False),        # B fixed: never scaled
    (["--parallel", "data", "--learning_rate_scaling", "false"], 3, 0.01, False),
    (["--parallel", "data", "--optimizer", "adam"], 3, 0.01, False),              # SGD only, as upstream
    (["--global_batch_size", "96"], 1, 0.01, False),
])
def test_learning_rate_scales_only_when_the_global_batch_grows_with_the_replicas(args, replicas, rate, scaled):
    got, why = cc.learning_rate_in_force(parse_args(args), replicas)
    assert got == pytest.approx(rate)
    assert (why is not None) == scaled
    if scaled:
        assert "--learning_rate 0.01 x 3 replicas" in why and "--batch_size 64 x 3" in why


def test_cosine_min_lr_is_checked_against_the_rate_in_force_and_names_the_users_rate():
    p = parse_args(["--lr_schedulers", "cosine", "--cosine_min_lr", "0.02", "--parallel", "data"])
    cc.check_schedules(p, *cc.learning_rate_in_force(p, 3))        # 0.02 <= 0.03: fine
    with pytest.raises(ConfigError) as e:
        cc.check_schedules(p, *cc.learning_rate_in_force(p, 1))
    assert str(e.value) == "cosine: min_lr must be in [0, 0.01] (the learning rate), got 0.02 (--cosine_min_lr)"
    p.cosine_min_lr = 1.0
    with pytest.raises(ConfigError) as e:
        cc.check_schedules(p, *cc.learning_rate_in_force(p, 3))
    assert "[0, 0.03]" in str(e.value) and "--learning_rate 0.01 x 3 replicas" in str(e.value)
    cc.check_schedules(parse_args(["--cosine_min_lr", "1"]), 0.01, None)     # cosine not used: no check


def _dataset(ntrain, test=True, val=False):
    split = lambda n: list(range(n))
    return types.SimpleNamespace(train=split(ntrain), test=split(10) if test else None, val=split(5) if val else None)


def test_evaluate_without_a_test_split_is_the_same_line_for_both_flags():
    lines = set()
    for flag in ("--evaluate", "--evaluate_only"):
        with pytest.raises(ConfigError) as e:
            cc.check_against_data(parse_args([flag, "true"]), _dataset(100, test=False), 64)
        lines.add(str(e.value))
    assert len(lines) == 1 and "no test split" in lines.pop()
    cc.check_against_data(parse_args(["--evaluate", "true"]), _dataset(100), 64)
    cc.check_against_data(parse_args([]), _dataset(100, test=False), 64)     # no evaluation asked: fine


@pytest.mark.parametrize("args, batch, flag", [
    (["--batch_size", "100000"], 100000, "--batch_size 100000:"),
    (["--parallel", "data", "--global_batch_size", "96"], 96, "--global_batch_size 96:"),
    (["--parallel", "data", "--batch_size", "40"], 120, "--batch_size 40 x 3 replicas:"),
])
def test_a_global_batch_larger_than_the_data_is_refused(args, batch, flag):
    with pytest.raises(ConfigError) as e:
        cc.check_against_data(parse_args(args), _dataset(90), batch)
    assert str(e.value).startswith(flag) and f"{batch} samples is larger than the 90 training samples" in str(e.value)
    cc.check_against_data(parse_args(args), _dataset(batch), batch)          # exactly the data: one step


# --- resume ---------------------------------------------------------------------------------------------

def _saved(**changes):
    """The flags a checkpoint's run recorded (vars of its namespace, through JSON)."""
    import json
    flags = vars(parse_args(["--num_epochs", "5", "--seed", "3", "--learning_rate", "0.1",
                             "--parallel", "data", "--replica_speeds", "1,2", "--balance", "static"]))
    flags.update(changes)
    return json.loads(json.dumps(flags))


def test_resume_takes_the_flags_not_given_from_the_checkpoint():
    argv = ["--resume", "ck.npz", "--num_epochs", "8"]
    p = parse_args(argv)
    changes, _, lines = cc.merge_resumed_flags(build_parser(), p, cc.given_flags(build_parser, argv), _saved(), "ck.npz")
    # not given: the checkpoint's run's values (lists come back as lists of the parser's type)
    assert p.seed == 3 and p.learning_rate == 0.1 and p.replica_speeds == [1.0, 2.0] and p.balance == "static"
    assert set(changes) == {"seed", "learning_rate", "replica_speeds", "balance"}
    # given: this command line's (configuration, not restored state: no line)
    assert p.num_epochs == 8 and lines == []
    # how this machine runs is never taken from the checkpoint
    assert p.parallel == "sequential" and p.resume == "ck.npz"


def test_resume_lines_say_what_changes_in_the_restored_state():
    argv = ["--resume", "ck.npz", "--learning_rate", "0.05", "--seed", "3", "--optimizer", "adam",
            "--replica_speeds", "1,3", "--history_file", "h.csv", "--momentum", "0.5"]
    p = parse_args(argv)
    _, anew, lines = cc.merge_resumed_flags(build_parser(), p, cc.given_flags(build_parser, argv), _saved(),
                                            "ck.npz")
    assert anew == {"optimizer_name", "learning_rate", "replica_speeds"}
    # --seed 3 is the checkpoint's; --history_file and --momentum are configuration: no line for them
    assert lines == [
        "resume: --optimizer adam instead of the checkpoint's sgd: the weights are restored, the optimizer starts "
        "afresh",
        "resume: --learning_rate 0.05 instead of the checkpoint's 0.1: training continues at the new rate, not at "
        "the checkpoint's",
        "resume: --replica_speeds 1,3 instead of the checkpoint's 1,2: the split of the global batch is computed "
        "anew, not restored"]
    assert p.momentum == 0.5 and p.history_file == "h.csv"


def test_a_checkpoint_whose_flags_do_not_parse_is_one_error_naming_it():
    p = parse_args(["--resume", "ck.npz"])
    with pytest.raises(CheckpointError, match=r"checkpoint ck.npz: the flags of its run do not parse .*batch_size"):
        cc.merge_resumed_flags(build_parser(), p, {"resume"}, _saved(batch_size=-3), "ck.npz")
    with pytest.raises(CheckpointError, match="optimizer"):
        cc.merge_resumed_flags(build_parser(), p, {"resume"}, _saved(optimizer_name="rm -rf"), "ck.npz")


def test_flags_newer_than_the_checkpoint_keep_this_runs_value():
    saved = _saved()
    del saved["label_smoothing"]
    p = parse_args(["--resume", "ck.npz", "--label_smoothing", "0.1"])
    _, _, lines = cc.merge_resumed_flags(build_parser(), p, {"resume", "label_smoothing"}, saved, "ck.npz")
    assert p.label_smoothing == 0.1 and lines == []


def test_a_checkpoint_never_names_this_runs_outputs():
    saved = _saved(history_file="/elsewhere/h.csv", checkpoint_dir="../../x", save_weights_and_bias_filename="w.npz")
    argv = ["--resume", "ck.npz"]
    p = parse_args(argv)
    changes, _, lines = cc.merge_resumed_flags(build_parser(), p, cc.given_flags(build_parser, argv), saved, "ck.npz")
    assert p.history_file is None and p.checkpoint_dir == "checkpoints" and p.save_weights_and_bias_filename is None
    assert not set(changes) & set(cc.OUTPUT_FLAGS)
    assert lines == ["resume: outputs come from this command line, not from the checkpoint's run (which wrote "
                     "--history_file /elsewhere/h.csv, --save_weights_and_bias_filename w.npz, --checkpoint_dir ../../x)"]


@pytest.mark.parametrize("flag, value, refused", [
    ("dataset_name", "data.py", True), ("dataset_name", "mnist", False),
    ("model_name", "net.py", True), ("model_name", "models/net", True), ("model_name", "simplemlp", False),
    ("gradient_weighting", "w.py:weights", True), ("gradient_weighting", "pkg.mod:weights", True),
    ("gradient_weighting", "uniform", False),
    ("balance", "p.py:Policy", True), ("balance", "dynamic", False),
    ("dataset_train_path", "/data", True), ("dataset_test_path", "/data", True),
])
def test_a_checkpoint_never_loads_code_or_reads_a_path(flag, value, refused):
    p = parse_args(["--resume", "ck.npz"])
    saved = _saved(**{flag: value})
    if not refused:
        cc.merge_resumed_flags(build_parser(), p, {"resume"}, saved, "ck.npz")
        assert getattr(p, flag) == value
        return
    with pytest.raises(CheckpointError, match="never (loads code|chooses a path)"):
        cc.merge_resumed_flags(build_parser(), p, {"resume"}, saved, "ck.npz")
    # given on this command line (a dataset file must exist to parse: set as the parser would), it is the user's
    p = parse_args(["--resume", "ck.npz"])
    setattr(p, flag, value)
    cc.merge_resumed_flags(build_parser(), p, {"resume", flag}, saved, "ck.npz")
    assert getattr(p, flag) == value


# --- the ranks agree on their flags ---------------------------------------------------------------------

def _digests(args):
    return agreement.flag_digests(build_parser(), parse_args(args))


def _first_differing(*argvs):
    table = np.stack([_digests(a) for a in argvs])
    index = agreement.first_difference(table.max(axis=0), table.min(axis=0))
    return None if index is None else flag_dests(build_parser())[index]


def test_flag_digests_find_the_first_differing_flag():
    assert _first_differing([], []) is None
    assert _first_differing(["--num_epochs", "2"], ["--num_epochs", "2"], ["--num_epochs", "3"]) == "num_epochs"
    assert _first_differing(["--model", "simplecnn"], ["--model", "simplemlp"]) == "model_name"
    # the first in --help order: --model comes before --num_epochs
    assert _first_differing(["--num_epochs", "3"], ["--model", "simplemlp"]) == "model_name"
    assert _first_differing(["--replica_speeds", "1,2"], ["--replica_speeds", "1,2.0"]) is None   # same values


def test_flags_that_may_differ_between_ranks():
    # a rank's own threads, and rank 0's outputs
    assert _first_differing(["--threads_per_replica", "1", "--history_file", "a.csv"],
                            ["--threads_per_replica", "4", "--history_file", "b.csv"]) is None
    # a node's own copy of the data: the path may differ, whether one is given may not
    assert _first_differing(["--dataset_train_path", "/a"], ["--dataset_train_path", "/b"]) is None
    assert _first_differing(["--dataset_train_path", "/a"], []) == "dataset_train_path"
    assert _first_differing(["--resume", "/a/ck.npz"], []) == "resume"


def test_digests_fit_the_max_min_reduction():
    d = _digests(["--num_epochs", "7"])
    assert d.dtype == np.int64 and (d >= 0).all() and (d < 2 ** agreement.DIGEST_BITS).all()
    assert (-d >= -(2 ** 62)).all()                          # negatives never overflow


def test_the_line_for_a_difference_names_the_flag_and_each_ranks_value():
    line = agreement.describe_difference("--num_epochs", ["2", "2", "3"])
    assert line.startswith("the ranks were started with different flags: --num_epochs is 2 on ranks 0-1 and 3 on "
                           "rank 2")
    assert "3 on ranks 1,3" in agreement.describe_difference("--seed", ["0", "3", "0", "3"])


# ----------------------------------------------------------------------- nothing accepted and ignored

@pytest.mark.parametrize("args, nreplicas, needle", [
    # issue 46: a CPU-only run trained in fp32 while it said tf32
    (["--precision", "tf32"], 1, "--precision tf32 sets a GPU's float32 math, and no replica of this run is on a GPU"),
    (["--precision", "fp32_strict"], 1, "--precision fp32_strict sets a GPU's float32 math"),
    (["--parallel", "data", "--precision", "tf32"], 3, "no replica of this run is on a GPU"),
    (["--parallel", "data", "--precision", "tf32", "--devices", "cpu,cpu"], 2, "no replica of this run is on a GPU"),
    # --balance without --parallel data was ignored while --balance_options there was refused
    (["--balance", "fpm"], 1, "--balance fpm splits the global batch among replicas: it needs --parallel data"),
    (["--balance", "static"], 1, "--balance static splits the global batch"),
    (["--balance_options", "points=5"], 1, "--balance_options is used by --parallel data only"),
    # emulation values beyond their documented ranges, refused before any work
    (["--parallel", "data", "--emulate_costs", "1e400ms+1.0,0+1"], 2, "1e400ms is not a finite number"),
    (["--parallel", "data", "--emulate_costs", "31536000s+1.0,0+1"], 2, "the fixed part per step must be at most 60 s"),
    (["--parallel", "data", "--emulate_costs", "0+1e6,0+1"], 2, "a factor per sample must be in [1, 1000]"),
    (["--parallel", "data", "--emulate_schedule", "1:1e999@0-10"], 2, "1 <= FACTOR <= 1000"),
    (["--parallel", "data", "--emulate_speeds", "1,1e-300"], 2, "the slowest replica would be 1e+300 times slower"),
])
def test_what_would_be_ignored_or_unbounded_is_refused_in_configure(args, nreplicas, needle):
    with pytest.raises(ConfigError) as e:
        cc.configure(parse_args(args), nreplicas)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_gpu_replica_takes_any_precision_and_fp32_is_everyones():
    for args in (["--precision", "tf32", "--enable_gpu", "true"], ["--precision", "fp32"], []):
        assert cc.configure(parse_args(args), 1).devices in (["gpu"], ["cpu"])
    mixed = cc.configure(parse_args(["--parallel", "data", "--precision", "tf32", "--devices", "gpu,cpu"]), 2)
    assert mixed.devices == ["gpu", "cpu"]
    assert cc.configure(parse_args(["--balance", "none"]), 1).policy.name == "equal"


@pytest.mark.parametrize("flag, stored, needle", [
    ("emulate_costs", "0+1e9s,0+1", "a time per sample must be at most 10 s"),
    ("emulate_costs", "3e7s+1,0+1", "the fixed part per step must be at most 60 s"),
    ("emulate_schedule", "1:1e6@0-10", "1 <= FACTOR <= 1000"),
    ("emulate_speeds", [1.0, 1e-6], "the slowest replica would be 1e+06 times slower"),
])
def test_a_checkpoints_emulation_is_checked_when_restored(flag, stored, needle):
    """--restore_emulation true takes the checkpoint's --emulate_* values: within the command line's ranges, or one
    line naming the checkpoint and the field (a step of years once came back from a checkpoint)."""
    p = parse_args(["--resume", "ck.npz", "--restore_emulation", "true", "--parallel", "data"])
    saved = {flag: stored}
    with pytest.raises(CheckpointError) as e:
        cc.merge_resumed_flags(build_parser(), p, frozenset({"resume", "restore_emulation", "parallel"}), saved,
                               "ck.npz")
    assert str(e.value).startswith(f"checkpoint ck.npz: metadata field 'flags.{flag}' (restored by "
                                   f"--restore_emulation true): ") and needle in str(e.value), str(e.value)
    p = parse_args(["--resume", "ck.npz", "--parallel", "data"])      # not restored: not read, one line says so
    _, _, lines = cc.merge_resumed_flags(build_parser(), p, frozenset({"resume", "parallel"}), saved, "ck.npz")
    assert any("this run does not (--restore_emulation true would)" in line for line in lines)


def test_grad_compression_is_kept_in_checkpoints_and_taken_back_unless_given():
    """--grad_compression changes the numerics: a resumed run compresses as its checkpoint's run did, unless its
    own command line says otherwise."""
    assert "grad_compression" not in cc.EXECUTION_FLAGS
    argv = ["--resume", "ck.npz"]
    p = parse_args(argv)
    changes, _, _ = cc.merge_resumed_flags(build_parser(), p, cc.given_flags(build_parser, argv),
                                           _saved(grad_compression="bf16"), "ck.npz")
    assert p.grad_compression == "bf16" and changes["grad_compression"] == "bf16"
    argv = ["--resume", "ck.npz", "--grad_compression", "none"]
    p = parse_args(argv)
    cc.merge_resumed_flags(build_parser(), p, cc.given_flags(build_parser, argv), _saved(grad_compression="bf16"),
                           "ck.npz")
    assert p.grad_compression == "none"
    with pytest.raises(ConfigError, match="give --grad_compression none"):      # resumed as one process
        cc.configure(parse_args(["--resume", "ck.npz", "--grad_compression", "fp16"]), 1)
