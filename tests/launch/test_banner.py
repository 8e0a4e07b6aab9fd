"""What a run prints before training: a few lines by default (the model, the data, the replicas and their split,
the precision, the outputs), every parameter and the model's layers with --verbose true."""
import types

from paths import sibling
from pydtnn.launch.banner import _compression_line, _outputs_line, _replicas_line
from pydtnn.launch.flags import build_parser, flag_dests, parse_args

cli_tests = sibling("launch", "test_cli")
FAST, launch = cli_tests.FAST, cli_tests.launch


def _banner(stdout):
    """The lines before the first epoch's."""
    lines = stdout.splitlines()
    return lines[:next(i for i, line in enumerate(lines) if line.startswith("epoch 1:"))]


def test_a_run_starts_with_a_few_lines(tmp_path):
    args = [*FAST, "--num_epochs", "1", "--steps_per_epoch", "2", "--history_file", tmp_path / "h.csv"]
    r = launch(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    head = _banner(r.stdout)
    assert [line.split(":")[0] for line in head] == ["model", "data", "replicas", "threads per replica",
                                                     "CPU convolutions", "outputs"], head
    assert head[0].startswith("model: simplecnn, 101,810 parameters (0.39 MiB as float32, backend cpu)"), head
    assert head[0].endswith("--verbose true"), head                      # says where the rest is
    assert head[1] == "data: synthetic: input (1, 28, 28), 10 classes, train 256, val none, test 51", head
    assert head[2] == "replicas: 1 (--parallel sequential) on cpu, batch 32", head
    assert head[5] == (f"outputs: history {tmp_path / 'h.csv'}; checkpoints (--checkpoint_dir checkpoints) on "
                       f"SIGTERM, SIGUSR1 or Ctrl-C"), head
    assert "PyDTNN parameters" not in r.stdout and "Layer " not in r.stdout


def test_verbose_prints_every_parameter_and_the_layers(tmp_path):
    args = [*FAST, "--num_epochs", "1", "--steps_per_epoch", "2", "--verbose", "true"]
    r = launch(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    head = _banner(r.stdout)
    assert head[0] == "PyDTNN parameters (1 replica(s)):", head
    rows = {}
    for line in head[1:]:
        if not line.startswith("  "):
            break
        name, _, value = line[2:].partition(" ")
        rows[name] = value.strip()
    expected = vars(parse_args(list(map(str, args))))
    assert sorted(rows) == sorted(flag_dests(build_parser())), set(rows) ^ set(flag_dests(build_parser()))
    assert rows == {k: str(v).strip() for k, v in expected.items()}, rows
    total = next(line for line in head if line.startswith("Total parameters: "))
    assert total.startswith("Total parameters: 101,810  (0.39 MiB as float32, backend cpu)"), total
    assert sum(line.startswith("fc ") or line.startswith("conv2d ") for line in head) == 2, head   # the layers
    model_line = next(line for line in head if line.startswith("model: "))
    assert model_line == "model: simplecnn, 101,810 parameters (0.39 MiB as float32, backend cpu)", model_line


def test_verbose_is_this_command_lines_not_the_checkpoints(tmp_path):
    """--verbose says how this run shows itself (an execution flag): a resumed run does not inherit it."""
    ck = cli_tests._checkpoint(tmp_path, "--verbose", "true")
    r = launch(*FAST[:-2], "--resume", ck, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "next", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("model: simplecnn, ") and "PyDTNN parameters" not in r.stdout, r.stdout[:2000]


def _config(devices, data=True, **flags):
    p = types.SimpleNamespace(**{"emulate_speeds": None, "emulate_costs": None, "emulate_schedule": None, **flags})
    return types.SimpleNamespace(p=p, nreplicas=len(devices), data_parallel=data, devices=devices)


def test_the_replicas_line_names_the_devices_and_the_emulation():
    split = types.SimpleNamespace(global_batch=96)
    assert _replicas_line(_config(["cpu"], data=False), split) == "replicas: 1 (--parallel sequential) on cpu, batch 96"
    assert _replicas_line(_config(["cpu"] * 3), split) == "replicas: 3 (--parallel data) all on cpu"
    assert (_replicas_line(_config(["gpu", "cpu", "cpu"], emulate_speeds=(1.0, 0.5, 0.5)), split)
            == "replicas: 3 (--parallel data) on gpu, cpu, cpu, emulating --emulate_speeds 1,0.5,0.5")
    # many replicas: counts, not a word each
    assert (_replicas_line(_config(["gpu"] * 16 + ["cpu"] * 48), split)
            == "replicas: 64 (--parallel data) on 16 gpu, 48 cpu")


def test_the_outputs_line_says_what_is_written_and_when():
    flags = dict(evaluate_only=False, history_file="h.csv", save_weights_and_bias_filename="w.npz",
                 step_history_file=None, tensorboard_dir=None, plots_dir="plots", tracing=True,
                 tracer_output="t.json", model_checkpoint_save_freq=2, model_checkpoint_save_steps=10,
                 model_checkpoint_save_minutes=0.5, checkpoint_dir="ck",
                 lr_schedulers_names="early_stopping, model_checkpoint")
    assert _outputs_line(types.SimpleNamespace(**flags)) == (
        "outputs: history h.csv, final weights w.npz, plots plots, trace t.json; checkpoints (--checkpoint_dir ck) "
        "every 2 epoch(s) and best.npz, every 10 step(s), every 0.5 min, on SIGTERM, SIGUSR1 or Ctrl-C")
    flags.update(lr_schedulers_names="", model_checkpoint_save_steps=0, model_checkpoint_save_minutes=0.0)
    assert _outputs_line(types.SimpleNamespace(**flags)) == (
        "outputs: history h.csv, final weights w.npz, plots plots, trace t.json; checkpoints (--checkpoint_dir ck) "
        "on SIGTERM, SIGUSR1 or Ctrl-C")
    flags.update(evaluate_only=True)
    assert _outputs_line(types.SimpleNamespace(**flags)) == "outputs: none (--evaluate_only true)"


def test_the_compression_line_says_the_format_and_its_bound():
    """--grad_compression's line (a data-parallel run's banner): the format, and the bound with this run's P."""
    assert _compression_line("fp16", 3) == (
        "gradients reduced in fp16 (2 bytes an element on the wire): each element within about 3 x 2^-11 x "
        "sum_i |w_i g_i| of the exact sum (docs/data_parallel.md#compressed-reductions)")
    assert "within about 8 x 2^-8 x" in _compression_line("bf16", 8)
    assert (_compression_line("bf16", 1)
            == "gradient compression bf16: one replica reduces nothing, so nothing is compressed")
