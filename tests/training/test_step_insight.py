"""Seeing inside a step: waits counted as waits, the per-layer trace, the layer profile, per-step metrics
(CSV, TensorBoard) and the per-replica plot.

The MPI jobs run in virtual time (tests/mpi_scripts/virtual_time.py): a forward + backward of b samples
costs exactly b x COST virtual seconds, charged when the pass starts, and a blocking allreduce ends when
the last rank arrives. So with synchronized BatchNorm at a 16 : 48 split on identical (virtual) devices,
rank 0 arrives (48 - 16) x COST early at the first BatchNorm reduction of every step and waits exactly
that long there: a controlled delay on one rank, no timing threshold.
Virtual-time error: every clock reading costs one tick (1e-7 s), a step reads the clock < 300 times with
the layer timer on, against >= 16 ms of compute: 300 * 1e-7 / 16e-3 < 2e-3 relative (REL).
"""
import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest

from mpi_helpers import describe, run_mpi  # noqa: E402
from paths import sibling  # noqa: E402
# its nested block's BatchNorm syncs inside the block's event
BN_MODEL = sibling("parallel", "test_data_parallel").BN_MODEL

from pydtnn.observe import timing as trace  # noqa: E402
from pydtnn.observe.layer_profile import layer_flops  # noqa: E402
from pydtnn.observe.timeline import CATEGORIES  # noqa: E402

COST = 1e-3
REL = 2e-3
BASE = ["--dataset", "synthetic", "--parallel", "data", "--lr_schedulers", "", "--progress_bar", "false",
        "--threads_per_replica", "1", "--seed", "1"]


def _bn_layers():
    """The BatchNorm net's top-level layers (model.summary()'s names; the softmax fuses with the loss) and
    its gradient bytes."""
    from pydtnn.model import Model
    namespace = {}
    exec(BN_MODEL, namespace)
    model = namespace["create_model"](Model(seed=0))
    return [layer.name for layer in model.layers[:-1]] + ["softmax + loss"], model.nparams * 4


def launch(args, timeout=120):
    r = run_mpi(2, "virtual_time.py", [*BASE, *map(str, args)], timeout=timeout, env={"VIRTUAL_COST_S": COST})
    assert r.returncode == 0, describe(r)
    return r


# ------------------------------------------------------------------------------------ pure unit checks

def test_a_wait_inside_compute_is_wait_not_compute(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(trace, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    timer = trace.StepTimer()
    timer.start_step(4)
    with timer.compute(None):
        now[0] += 1.0
        with timer.wait("bn_sync forward", category="bn_sync"):
            now[0] += 5.0
        now[0] += 2.0
    with timer.wait():
        now[0] += 0.5
    timer.end_step()
    assert (timer.stats.compute_s, timer.stats.wait_s) == (3.0, 5.5)
    assert timer.stats.last_compute_per_sample == 0.75


def test_layer_flops_are_the_multiply_adds_of_conv_and_fc():
    from pydtnn.layers import FC, Conv2D, Flatten, Input
    from pydtnn.model import Model
    model = Model(seed=0)
    model.add(Input(shape=(3, 8, 8)))
    conv = model.add(Conv2D(nfilters=5, filter_shape=(3, 3), padding=1))
    model.add(Flatten())
    fc = model.add(FC(shape=(7,)))
    model.params  # noqa: B018 (binds the weights)
    # conv: 5 x 8 x 8 outputs, each 3 x 3 x 3 multiply-adds; FC: 7 outputs of 320 multiply-adds
    assert layer_flops(conv, 2, "forward") == 2 * 2 * (5 * 8 * 8) * 27
    assert layer_flops(fc, 2, "forward") == 2 * 2 * 7 * 320
    assert layer_flops(fc, 2, "backward") == 2 * layer_flops(fc, 2, "forward")
    conv.input_grad_needed = False          # the first layer computes no input gradient
    assert layer_flops(conv, 2, "backward") == layer_flops(conv, 2, "forward")
    assert layer_flops(model.layers[2], 2, "forward") is None


def _tiny_trainer(**kwargs):
    from pydtnn.datasets import load_dataset
    from pydtnn.model import Model
    from pydtnn.models import build_model
    from pydtnn.optimizers import SGD
    from pydtnn.training.loop import Trainer
    model = Model(backend="cpu", seed=0)
    build_model("simplecnn", model)
    data = load_dataset("synthetic", input_shape=model.input_shape, nclasses=10, synthetic_samples=64, seed=0)
    return Trainer(model, data, SGD(learning_rate=0.01), global_batch=16, progress=False, log=lambda m: None,
                   **kwargs)


def test_layer_timer_runs_only_in_the_steps_it_times(monkeypatch, tmp_path):
    from pydtnn.observe import layer_timer
    calls = []
    run = layer_timer.LayerTimer.run
    monkeypatch.setattr(layer_timer.LayerTimer, "run",
                        lambda self, layer, phase, *a: (calls.append((layer.name, phase)), run(self, layer, phase, *a))[1])
    _tiny_trainer().fit(1)                                     # 4 steps, nothing asked: no per-layer call
    assert calls == []
    trainer = _tiny_trainer(tracer_output=str(tmp_path / "t.json"), trace_steps=(3, 3))
    trainer.fit(1)
    names = [l.name for l in trainer.model.layers]
    fused_last = names[:-1]                                    # Softmax + cross-entropy: the loss's
    assert calls == [(n, "forward") for n in fused_last] + [(n, "backward") for n in reversed(fused_last[1:])]
    doc = json.loads((tmp_path / "t.json").read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["cat"] for e in spans} <= set(CATEGORIES) and {e["args"]["step"] for e in spans} == {3}


def test_profile_table_has_every_layer_and_gflops_for_conv_and_fc():
    trainer = _tiny_trainer(profile_layers=True)
    trainer.fit(1)
    profile = trainer.layer_profile
    assert profile.steps == 3                                  # every step but the first
    table = profile.table(peak_flops=1e11)
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:-3]}
    names = [l.name for l in trainer.model.layers[:-1]]
    assert list(rows) == names, table
    for name, cols in rows.items():
        kind = cols[1]
        assert float(cols[2]) >= 0 and float(cols[3]) >= 0 and float(cols[4]) >= 0, table
        assert len(cols) == (7 if kind in ("Conv2D", "FC") else 5), table   # GFLOP/s and % of peak
    assert "peak: 100.0 GFLOP/s" in table


# ------------------------------------------------------------------------------------------ MPI jobs

@pytest.mark.mpi
def test_synchronized_batchnorm_waits_are_waits_and_everything_is_recorded(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    model = tmp_path / "bnnet.py"
    model.write_text(BN_MODEL)
    out = {k: tmp_path / k for k in ("h.json", "trace.json", "steps.csv", "tb", "plots", "ck")}
    steps_per_epoch, epochs = 3, 2
    layers, grad_bytes = _bn_layers()
    launch(["--model", model, "--balance", "static", "--replica_speeds", "1,3", "--global_batch_size", 64,
            "--synthetic_samples", 64 * steps_per_epoch + 16, "--validation_split", 16 / (64 * 3 + 16),
            "--num_epochs", epochs, "--sync_batchnorm", "true", "--history_file", out["h.json"],
            "--tracing", "true", "--tracer_output", out["trace.json"], "--trace_steps", "2:3",
            "--model_checkpoint_save_steps", 4, "--checkpoint_dir", out["ck"],
            "--tensorboard_dir", out["tb"], "--step_history_file", out["steps.csv"], "--plots_dir", out["plots"]])
    # 1. waits are waits: both replicas compute 1 / COST samples per second; rank 0 waits for rank 1
    for row in json.loads(out["h.json"].read_text()):
        assert (row["rank0_b"], row["rank1_b"]) == (16, 48)
        for r, b in ((0, 16), (1, 48)):
            assert row[f"rank{r}_compute_s"] == pytest.approx(steps_per_epoch * b * COST, rel=REL), row
        assert row["rank0_wait_s"] == pytest.approx(steps_per_epoch * 32 * COST, rel=REL), row
        assert row["rank1_wait_s"] < 0.01 * row["rank0_wait_s"], row
    # 2. the trace: per layer, per BatchNorm sync, the reduction, the update, data, eval, checkpoint
    spans = [e for e in json.loads(out["trace.json"].read_text())["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1} and {e["cat"] for e in spans} == set(CATEGORIES)
    detailed = [e for e in spans if e["cat"] not in ("eval", "checkpoint")]
    assert {e["args"]["step"] for e in detailed} == {2, 3}
    for pid, b in ((0, 16), (1, 48)):
        mine = [e for e in detailed if e["pid"] == pid and e["args"]["step"] == 2]
        assert all(e["args"]["b_i"] == b for e in mine)
        top = [e for e in mine if "parent" not in e["args"]]       # a block's layers are nested in its event
        assert [e["name"] for e in top if e["cat"] == "forward"] == layers
        assert [e["name"] for e in top if e["cat"] == "backward"] == layers[-2:0:-1]
        nested = [e for e in mine if "parent" in e["args"]]
        assert {e["args"]["parent"] for e in nested} == {"addition_block"} and nested, mine
        for e in nested:
            block = [b for b in top if b["name"] == e["args"]["parent"] and b["cat"] == e["cat"]]
            assert len(block) == 1 and block[0]["ts"] <= e["ts"] <= e["ts"] + e["dur"] <= block[0]["ts"] + block[0]["dur"]
        syncs = [e for e in mine if e["cat"] == "bn_sync"]        # float64 sums of 4, 4 and 8 channels
        assert [e["args"]["bytes"] for e in syncs] == [8 * 9, 8 * 9, 8 * 17, 8 * 16, 8 * 8, 8 * 8]
        waited = sum(e["dur"] for e in syncs) * 1e-6
        assert waited == pytest.approx(32 * COST if pid == 0 else 0.0, abs=REL * 16 * COST)
        reduction = [e for e in mine if e["name"] == "allreduce"]
        assert len(reduction) == 1 and reduction[0]["args"]["bytes"] == grad_bytes       # the float32 gradients
        assert sum(e["cat"] == "update" for e in mine) == 1 and sum(e["cat"] == "data" for e in mine) >= 1
    assert sum(e["cat"] == "eval" for e in spans) == 2 * epochs
    assert sum(e["cat"] == "checkpoint" for e in spans) == 2         # after global step 4, on both ranks
    # 3. per-step CSV and TensorBoard event files, read back with TensorBoard's own reader
    with open(out["steps.csv"]) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, steps_per_epoch * epochs + 1))
    assert all(float(r["rank0_wait_s"]) == pytest.approx(32 * COST, rel=REL) for r in rows)
    events = EventAccumulator(str(out["tb"]))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"step/loss", "step/learning_rate", "step/samples_per_s", "step/rank0_b", "step/rank1_compute_s",
            "step/rank0_wait_s", "epoch/loss", "epoch/val_loss", "epoch/rank1_b"} <= tags, tags
    assert all(t.startswith(("step/", "epoch/")) for t in tags), tags            # one naming: the columns'
    assert [e.value for e in events.Scalars("step/rank1_b")] == [48.0] * len(rows)
    losses = [e.value for e in events.Scalars("step/loss")]
    assert losses == pytest.approx([float(r["loss"]) for r in rows], rel=1e-6)         # float32 in the file
    assert [e.step for e in events.Scalars("epoch/loss")] == [3, 6]
    # 4. the per-replica plot
    png = (out["plots"] / "replicas.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.mpi
def test_bucket_reductions_overlap_the_backward_pass_and_the_emulated_slowdown_is_traced(tmp_path):
    # simplemlp in float64 is ~5.3 MB of gradients: several 1 MiB buckets, started during backward
    path = tmp_path / "trace.json"
    launch(["--model", "simplemlp", "--dtype", "float64", "--balance", "static", "--replica_speeds", "1,1",
            "--emulate_speeds", "1,0.5", "--global_batch_size", 40, "--synthetic_samples", 120, "--num_epochs", 1,
            "--non_blocking_mpi", "true", "--tracing", "true", "--tracer_output", path, "--trace_steps", "3:3"])
    spans = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    for pid in (0, 1):
        mine = [e for e in spans if e["pid"] == pid]
        buckets = [e for e in mine if e["name"].startswith("bucket ")]
        backward = [e for e in mine if e["cat"] == "backward" and e["name"] != "emulated slowdown"]
        assert len(buckets) >= 3 and all(e["tid"] == 1 and e["cat"] == "allreduce" for e in buckets)
        whole = [e for e in mine if e["name"] == "allreduce"]       # the wait for them, on the main track
        assert len(whole) == 1 and sum(e["args"]["bytes"] for e in buckets) == whole[0]["args"]["bytes"]
        end_of_backward = max(e["ts"] + e["dur"] for e in backward)
        assert min(e["ts"] for e in buckets) < end_of_backward       # started while backward still ran
        slow = [e for e in mine if e["name"] == "emulated slowdown"]
        # rank 1 at half speed: its 20 samples' pass is padded by 20 x COST
        assert (sum(e["dur"] for e in slow) * 1e-6 == pytest.approx(20 * COST, rel=REL)) if pid == 1 else not slow


def test_the_simulators_profile_reads_the_per_layer_trace(tmp_path):
    """pydtnn.sim's --trace calibration on this trace format: per-layer medians, nested BatchNorm waits left out."""
    from pydtnn.sim.trace_profile import trace_profile
    names = ["input", "flatten", "fc", "relu", "fc_1", "relu_1", "fc_2"]        # simplemlp, softmax fused
    ev = []
    for step in (2, 3):
        t = 1e6 * step
        for i, name in enumerate(names + ["softmax + loss"]):
            dur = 100.0 * (i + 1) * step
            ev.append({"name": name, "cat": "forward", "ph": "X", "pid": 0, "tid": 0, "ts": t, "dur": dur,
                       "args": {"step": step}})
            if name == "fc":           # a wait nested in a layer's event is not its compute
                ev.append({"name": "bn_sync forward", "cat": "bn_sync", "ph": "X", "pid": 0, "tid": 0,
                           "ts": t + 1, "dur": 50.0, "args": {"step": step}})
            t += dur
        for i, name in enumerate(reversed(names[1:])):
            ev.append({"name": name, "cat": "backward", "ph": "X", "pid": 0, "tid": 0, "ts": t, "dur": 10.0 * step,
                       "args": {"step": step}})
            t += 10.0 * step
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    prof = trace_profile(str(path), "simplemlp", [32], rank=0)
    # medians over steps 2 and 3 (the mean of the two), in seconds
    expected_fwd = [1e-4 * (i + 1) * 2.5 - (5e-5 if name == "fc" else 0.0) for i, name in enumerate(names + ["softmax"])]
    assert np.allclose(prof.forward_s[:, 0], expected_fwd, rtol=1e-12)
    assert np.allclose(prof.backward_s[:, 0], [0.0] + [2.5e-5] * 6 + [0.0], rtol=1e-12)


BLOCK_MODEL = """
from pydtnn.layers import FC, AdditionBlock, BatchNormalization, Conv2D, Flatten, Input, Relu


def create_model(model):
    model.add(Input(shape=(3, 8, 8)))
    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1))
    model.add(AdditionBlock([Conv2D(nfilters=4, filter_shape=(3, 3), padding=1), BatchNormalization(), Relu(),
                             Conv2D(nfilters=4, filter_shape=(1, 1))], []))
    model.add(Relu())
    model.add(Flatten())
    model.add(FC(shape=(10,), activation="softmax"))
    return model
"""


def test_the_layers_inside_a_block_get_their_own_events_and_profile_rows(tmp_path):
    """A block's event holds one event per layer of its paths (args.parent = the block), named as in
    model.summary(); the profile lists them indented under the block and its total counts the block once;
    the simulator's --trace calibration counts the block, not its layers again."""
    from pydtnn.datasets import load_dataset
    from pydtnn.model import Model
    from pydtnn.optimizers import SGD
    from pydtnn.sim.trace_profile import step_computes
    from pydtnn.training.loop import Trainer
    namespace = {}
    exec(BLOCK_MODEL, namespace)
    model = namespace["create_model"](Model(backend="cpu", seed=0))
    data = load_dataset("synthetic", input_shape=(3, 8, 8), nclasses=10, synthetic_samples=64, seed=0)
    trace = tmp_path / "t.json"
    trainer = Trainer(model, data, SGD(learning_rate=0.01), global_batch=16, progress=False, log=lambda m: None,
                      tracer_output=str(trace), trace_steps=(2, 3), profile_layers=True)
    trainer.fit(1)
    block = model.layers[2]
    inside = [layer.name for layer in block.sublayers()]
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X" and e["args"]["step"] == 2]
    nested = [e for e in spans if "parent" in e["args"]]
    assert [e["name"] for e in nested if e["cat"] == "forward"] == inside
    assert {e["name"] for e in nested if e["cat"] == "backward"} == set(inside)
    outer = next(e for e in spans if e["name"] == block.name and e["cat"] == "forward")
    assert all(outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"]
               for e in nested if e["cat"] == "forward")
    layer_sum = sum(e["dur"] for e in spans if e["cat"] in ("forward", "backward") and "parent" not in e["args"])
    step2 = step_computes(json.loads(trace.read_text())["traceEvents"])[0]
    assert step2[1] == pytest.approx(layer_sum * 1e-6, rel=1e-9)        # each layer counted once, in its block
    table = trainer.layer_profile.table().splitlines()
    rows = {line.strip().split()[0]: line for line in table[2:-2]}
    assert all(rows[name].startswith("  " + name) for name in inside), table
    assert rows[block.name].startswith(block.name) and list(rows).index(block.name) < list(rows).index(inside[0])
    top = [line.split() for line in table[2:-2] if not line.startswith(" ")]
    top_ms = sum(float(cols[2]) + float(cols[3]) for cols in top)
    assert table[-1].startswith("layers ") and abs(float(table[-1].split()[1]) - top_ms) <= 1e-3 * len(top), table
