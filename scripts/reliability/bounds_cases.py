"""The cases of issue 46 (items 5, 6 and 9) for `reliability_sweep.py`, registered beside `reliability_cases.py`'s:
bounds where a number enters (the emulation flags, a resumed checkpoint's emulation, a checkpoint's balance-policy
state), nothing accepted and ignored (--precision without a GPU, --balance without --parallel data), signals
while a step is padded and while the probe runs, and what the probe costs (shown, and the factor form of
--emulate_costs agreed by every rank). Each is run as a user would, with its promise checked.
"""
from __future__ import annotations

import re
import signal

from reliability_cases import NotRun, _checkpoint, case, fast, mpi_flags, one_line, said, works

EMU, IGN, STATE, SIG, COST = ("emulation values are bounded", "nothing accepted and ignored",
                              "a balance-policy state is data", "signals while padding and probing",
                              "the probe's cost is shown")
BOTH, MPI = (False, True), (True,)
DATA_FPM = ["--parallel", "data", "--balance", "fpm", "--global_batch_size", "32"]


# ================================================================ emulation values: finite, within a range

BAD_EMULATION = {   # title: (flags, the line's needle, under MPI too)
    "--emulate_costs with an infinite fixed part (1e400ms)": (["--emulate_costs", "1e400ms+1.0"],
                                                             "1e400ms is not a finite number", True),
    "--emulate_costs with an infinite factor (1e999)": (["--emulate_costs", "0+1e999"], "1e999 is not a finite number",
                                                        True),
    "--emulate_costs with an infinite time per sample": (["--emulate_costs", "0+1e400ms"], "not a finite number", False),
    "--emulate_costs with a fixed cost of a year": (["--emulate_costs", "31536000s+1.0"],
                                                    "the fixed part per step must be at most 60 s", True),
    "--emulate_costs with a fixed cost of 61 s": (["--emulate_costs", "61s+1.0"], "at most 60 s", False),
    "--emulate_costs with a factor of 10^6": (["--emulate_costs", "0+1e6"], "a factor per sample must be in [1, 1000]",
                                             True),
    "--emulate_costs with an hour per sample": (["--emulate_costs", "0+3600s"], "a time per sample must be at most 10 s",
                                               False),
    "--emulate_schedule with an infinite factor": (["--emulate_schedule", "0:1e999@0-10"], "1 <= FACTOR <= 1000", True),
    "--emulate_schedule with a factor of 10^6": (["--emulate_schedule", "0:1e6@0-10"], "1 <= FACTOR <= 1000", False),
    "--emulate_schedule to step 10^11": (["--emulate_schedule", "0:2@0-99999999999"], "LAST <= 10^9", False),
    "--emulate_schedule with overlapping factors 40 x 30": (["--emulate_schedule", "0:40@0-10,0:30@5-20"],
                                                           "1.2e+03 times slower than this machine at once", False),
    "--emulate_costs factor 500 with a schedule factor 3": (["--emulate_costs", "0+500", "--emulate_schedule",
                                                             "0:3@0-10"], "(--emulate_costs' factor 500 x the "
                                                                          "schedule's 3)", False),
    "--emulate_costs with NaN": (["--emulate_costs", "nan+1.0"], "expected a duration", False),
}
for _title, (_flags, _needle, _mpi) in BAD_EMULATION.items():
    @case(EMU, _title, "one line before any work, naming the flag and its range, status 2",
          mpi=BOTH if _mpi else (False,))
    def _(ctx, flags=_flags, needle=_needle):
        if ctx.mpi:          # one cost per replica: the bad one, then a sound one for rank 1
            flags = [v + ",0+1.0" if flag == "--emulate_costs" else v for flag, v in zip([None, *flags], flags)]
        return one_line(ctx.launch(fast(*flags, *mpi_flags(ctx))), needle)


for _title, _speeds, _needle in (("--emulate_speeds 1,1e-300", "1,1e-300", "1e+300 times slower than the fastest"),
                                 ("--emulate_speeds 1,0.0005 (2000 times slower)", "1,0.0005",
                                  "2e+03 times slower than the fastest")):
    @case(EMU, _title, "one line before any work, naming the flag and its range, status 2", mpi=MPI)
    def _(ctx, speeds=_speeds, needle=_needle):
        return one_line(ctx.launch(fast("--parallel", "data", "--emulate_speeds", speeds)), needle)


@case(EMU, "--emulate_costs with a factor of 1000 (the range's end)", "trains, emulating it")
def _(ctx):
    return works(ctx.launch(fast("--emulate_costs", "1ms+1000", "--steps_per_epoch", "1")),
                 "emulation: --emulate_costs factors multiply a base of", "epoch 1:")


RESTORED = {   # title: (the checkpoint's flag, its crafted value, the needle, MPI only)
    "a checkpoint whose --emulate_costs is 10^9 s per sample": ("emulate_costs", "0+1e9s",
                                                                "a time per sample must be at most 10 s", False),
    "a checkpoint whose --emulate_costs is infinite": ("emulate_costs", "1e400ms+1.0", "not a finite number", False),
    "a checkpoint whose --emulate_schedule factor is 10^6": ("emulate_schedule", "0:1e6@0-10", "1 <= FACTOR <= 1000",
                                                             False),
    "a checkpoint whose --emulate_speeds are 1,1e-300": ("emulate_speeds", [1.0, 1e-300],
                                                         "1e+300 times slower than the fastest", True),
}
for _title, (_flag, _value, _needle, _only_mpi) in RESTORED.items():
    @case(EMU, f"{_title}, restored (--restore_emulation true)", "one line naming the checkpoint and the field "
          "flags.<flag>, before any work", mpi=MPI if _only_mpi else (False,))
    def _(ctx, flag=_flag, value=_value, needle=_needle):
        path = _checkpoint(ctx, lambda meta, arrays: meta["flags"].update({flag: value}))
        r = ctx.launch(fast("--num_epochs", "2", "--resume", path, "--restore_emulation", "true", *mpi_flags(ctx)))
        ok, what = one_line(r, f"metadata field 'flags.{flag}' (restored by --restore_emulation true)")
        return ok and needle in r.err, what


@case(EMU, "a checkpoint whose --emulate_costs is 10^9 s per sample, not restored", "trains without emulating; "
      "one line says what the checkpoint's run emulated")
def _(ctx):
    path = _checkpoint(ctx, lambda meta, arrays: meta["flags"].update(emulate_costs="0+1e9s"))
    return works(ctx.launch(fast("--num_epochs", "2", "--resume", path)),
                 "resume: the checkpoint's run emulated --emulate_costs 0+1e9s; this run does not", "epoch 2:")


# ========================================================================= nothing accepted and ignored

IGNORED = {   # title: (flags, needle, under MPI too)
    "--precision tf32 on a CPU-only run": (["--precision", "tf32"], "--precision tf32 sets a GPU's float32 math, and "
                                                                    "no replica of this run is on a GPU", True),
    "--precision fp32_strict on a CPU-only run": (["--precision", "fp32_strict"], "no replica of this run is on a GPU",
                                                 False),
    "--balance fpm without --parallel data": (["--balance", "fpm"], "it needs --parallel data", False),
    "--balance dynamic without --parallel data": (["--balance", "dynamic"], "it needs --parallel data", False),
    "--balance probe without --parallel data": (["--balance", "probe"], "it needs --parallel data", False),
    "--balance_options without --parallel data": (["--balance_options", "points=5"],
                                                  "--balance_options is used by --parallel data only", False),
    "--balance_options points=100": (["--parallel", "data", "--balance", "fpm", "--balance_options", "points=100"],
                                     "must be >= 4 and <= 64", False),
    "--balance_options rounds=10^9": (["--parallel", "data", "--balance", "fpm", "--balance_options",
                                       "rounds=1000000000"], "must be >= 0 and <= 64", False),
    "--balance_options probe_s=inf": (["--parallel", "data", "--balance", "fpm", "--balance_options", "probe_s=inf"],
                                      "must be in [0.01, 60.0]", False),
}
for _title, (_flags, _needle, _mpi) in IGNORED.items():
    @case(IGN, _title, "one line before any work, status 2", mpi=BOTH if _mpi else (False,))
    def _(ctx, flags=_flags, needle=_needle):
        return one_line(ctx.launch(fast(*flags, *mpi_flags(ctx))), needle)


@case(IGN, "--precision tf32 with --devices cpu,cpu", "one line before any work, status 2", mpi=MPI)
def _(ctx):
    return one_line(ctx.launch(fast("--parallel", "data", "--precision", "tf32", "--devices", "cpu,cpu")),
                    "no replica of this run is on a GPU")


@case(IGN, "an fpm run's checkpoint resumed on one process", "one line naming --balance none as the way out")
def _(ctx):
    path = _checkpoint(ctx, lambda meta, arrays: None, extra=DATA_FPM)
    return one_line(ctx.launch(fast("--num_epochs", "2", "--resume", path)),
                    "a resumed run takes it from its checkpoint: give --balance none")


# ================================================================ a checkpoint's balance-policy state is data

def _point(state, replica, k, value):
    state["model"]["replicas"][replica]["points"][k] = value


STATES = {   # title: (the policy, change(state), the field named, under MPI too)
    "an fpm state that is a list": ("fpm", lambda s: [s], "'balance_policy_state' must be an object", True),
    "an fpm state that is a string": ("fpm", lambda s: "fpm", "'balance_policy_state' must be an object", False),
    "an fpm cost model that is a list": ("fpm", lambda s: {"model": [s["model"]]}, "'balance_policy_state.model'",
                                         False),
    "an fpm cost model without replicas": ("fpm", lambda s: s["model"].update(replicas=[]),
                                           "'balance_policy_state.model.replicas'", False),
    "an fpm point with an infinite batch": ("fpm", lambda s: _point(s, 0, 0, [float("inf"), 0.01]),
                                            "'balance_policy_state.model.replicas[0].points[0]'", True),
    "an fpm point with a batch of 10^300": ("fpm", lambda s: _point(s, 0, 0, [1e300, 0.01]),
                                            "'balance_policy_state.model.replicas[0].points[0]'", False),
    "an fpm point of infinite seconds": ("fpm", lambda s: _point(s, 0, 1, [4, float("inf")]),
                                         "'balance_policy_state.model.replicas[0].points[1]'", False),
    "an fpm cost model on a device tpu": ("fpm", lambda s: s["model"].update(devices=["tpu"] * len(s["model"]["devices"])),
                                          "'balance_policy_state.model.devices'", False),
    "an fpm cost model whose devices are a string": ("fpm", lambda s: s["model"].update(devices="cpu"),
                                                     "'balance_policy_state.model.devices'", False),
    "a dynamic window step of 10^300 samples": ("dynamic", lambda s: s["window"][0].append([1e300, 0.01]),
                                                "'balancer.window[0]", False),
    "a dynamic noise of -1": ("dynamic", lambda s: s.update(noise=[-1.0] * len(s["noise"])), "'balancer.noise'",
                              False),
    "a dynamic suspect of 7": ("dynamic", lambda s: s.update(suspect=[7] * len(s["suspect"])), "'balancer.suspect'",
                               False),
    "a dynamic rebalance count as text": ("dynamic", lambda s: s.update(n_rebalances="2"), "'balancer.n_rebalances'",
                                          False),
}


def _policy_checkpoint(ctx, policy, change):
    """A step checkpoint of an fpm or dynamic run (its state changed by ``change``, which may return a new one)."""
    key = "balancer" if policy == "dynamic" else "balance_policy_state"
    flags = ["--parallel", "data", "--balance", policy, "--global_batch_size", "32", "--rebalance_interval", "1"]

    def edit(meta, arrays):
        if not isinstance(meta.get(key), dict):
            raise NotRun(f"the first run kept no {key}")
        out = change(meta[key])
        if out is not None:
            meta[key] = out
    return _checkpoint(ctx, edit, extra=flags), flags


for _title, (_policy, _change, _field, _mpi) in STATES.items():
    @case(STATE, f"a checkpoint with {_title}", "one line naming the checkpoint's field, before any work",
          mpi=BOTH if _mpi else (False,))
    def _(ctx, policy=_policy, change=_change, field=_field):
        path, flags = _policy_checkpoint(ctx, policy, change)
        return one_line(ctx.launch(fast("--num_epochs", "2", "--resume", path, *flags)), f"metadata field {field}")


@case(STATE, "a sound fpm checkpoint", "resumes: its split and model restored, no probe")
def _(ctx):
    path, flags = _policy_checkpoint(ctx, "fpm", lambda s: None)
    r = ctx.launch(fast("--num_epochs", "2", "--resume", path, *flags))
    ok, what = works(r, "epoch 2:")
    return ok and "probe point" not in r.out, what


# ====================================================================== signals while padding and probing

def _stopped(r, status, needle, checkpoint):
    """Status, the one line, and whether a checkpoint was written as promised; what happened."""
    kept = sorted(p.name for p in (r.folder / "ck").glob("*.npz")) if (r.folder / "ck").exists() else []
    sent = next((t for t, line in r.extra.get("stamps", []) if line.startswith("(the sweep sent")), None)
    after = r.seconds - sent if sent is not None else float("nan")
    line = next((l for l in r.lines if needle in l), None)
    ok = r.rc == status and line is not None and bool(kept) == checkpoint and "Traceback" not in r.err
    return ok, after, f"{said(r)}; ended {after:.1f} s after the signal; checkpoints: {kept or 'none'}"


# A step padded to 40 s (the factor form: the base is agreed and printed before training, then the first step)
for _name, _signum, _status, _mpi in (("SIGTERM", signal.SIGTERM, 3, (False,)), ("Ctrl-C (SIGINT)", signal.SIGINT, 130,
                                                                                 (False,)),
                                      ("SIGUSR1", signal.SIGUSR1, 3, BOTH)):
    @case(SIG, f"{_name} 1.5 s into a step padded to 40 s", "the step ends within seconds, a checkpoint written "
          "and named, status " + str(_status), mpi=_mpi)
    def _(ctx, signum=_signum, status=_status):
        costs = ",".join(["40s+1.0"] * (2 if ctx.mpi else 1))
        r = ctx.launch(fast("--emulate_costs", costs, "--checkpoint_dir", "ck", *mpi_flags(ctx)), timeout=120,
                       signal_after=("emulation: --emulate_costs factors multiply", 1.5, signum))
        ok, after, what = _stopped(r, status, "received: checkpoint written to ck/", True)
        return ok and after < 15, what


# The probe with one replica 1000 times slower (or one replica 500 times slower, alone)
def _slow_probe(ctx):
    if ctx.mpi:
        return fast("--parallel", "data", "--balance", "fpm", "--global_batch_size", "64", "--emulate_speeds", "1,0.001",
                    "--checkpoint_dir", "ck")
    return fast("--parallel", "data", "--balance", "fpm", "--global_batch_size", "64", "--emulate_costs", "0+500",
                "--checkpoint_dir", "ck")


for _name, _signum, _status, _mpi in (("SIGUSR1", signal.SIGUSR1, 3, BOTH), ("SIGTERM", signal.SIGTERM, 3, (False,)),
                                      ("Ctrl-C (SIGINT)", signal.SIGINT, 130, (False,))):
    @case(SIG, f"{_name} during the probe, one replica 1000 (alone: 500) times slower", "every rank stops before "
          "training: one line, status " + str(_status) + ", nothing trained or written", mpi=_mpi)
    def _(ctx, signum=_signum, status=_status):
        r = ctx.launch(_slow_probe(ctx), timeout=180, signal_after=("probe point 1:", 0.5, signum))
        ok, after, what = _stopped(r, status, "received during the balance probe, before training: nothing was "
                                              "trained and no checkpoint was written", False)
        return ok and "epoch 1:" not in r.out and after < 15, what


@case(SIG, "the probe with one replica 1000 times slower talks", "its plan within seconds, then a line per point, "
      "each point's timed passes capped", mpi=MPI)
def _(ctx):
    r = ctx.launch(_slow_probe(ctx), timeout=180, signal_after=("probe point 3:", 0.2, signal.SIGUSR1))
    stamps = r.extra.get("stamps", [])
    plan = next((t for t, line in stamps if line.startswith("probe plan:")), None)
    points = [(t, line) for t, line in stamps if line.startswith("probe point ")]
    capped = [line for _, line in points if ", capped;" in line]
    ok = plan is not None and plan < 20 and len(points) == 3 and bool(capped)
    gaps = [b - a for (a, _), (b, _) in zip([(plan or 0, "")] + points, points)]
    return ok, (f"plan after {plan:.1f} s; points at {', '.join(f'{t:.1f}' for t, _ in points)} s (gaps up to "
                f"{max(gaps):.1f} s); {len(capped)} capped: {capped[-1][:90] if capped else ''}") if plan else said(r)


# ============================================================================== the probe's cost, shown

@case(COST, "an fpm run's report", "the probe's seconds and probe + training beside the training time", mpi=BOTH)
def _(ctx):
    r = ctx.launch(fast(*DATA_FPM, *mpi_flags(ctx)))
    ok, what = works(r, "training time:", "probe before training:")
    m = re.search(r"training time: ([0-9.]+) s.*\nprobe before training: ([0-9.]+) s \(fpm\); probe \+ training: "
                  r"([0-9.]+) s", r.out)
    return ok and m is not None and abs(float(m[1]) + float(m[2]) - float(m[3])) <= 0.011, what


@case(COST, "a run without a probe (--balance none)", "no probe line in its report")
def _(ctx):
    r = ctx.launch(fast("--parallel", "data"))
    ok, what = works(r, "training time:")
    return ok and "probe before training" not in r.out, what


@case(COST, "3 replicas, two given the same --emulate_costs factor (40ms+1.0,0+15.0,0+15.0)", "fitted within 10% of "
      "each other in the same run; the agreed base printed", mpi=MPI, ranks=3)
def _(ctx):
    r = ctx.launch(fast("--parallel", "data", "--balance", "fpm", "--global_batch_size", "96", "--synthetic_samples",
                        "192", "--emulate_costs", "40ms+1.0,0+15.0,0+15.0"), nprocs=3, timeout=240)
    fitted = {int(i): float(c) for i, c in re.findall(r"replica (\d) \(cpu\): points b:ms [0-9.: ]+; affine [0-9.e+-]+ "
                                                      r"ms \+ ([0-9.e+-]+) ms/sample", r.out)}
    base = next((l for l in r.out.splitlines() if l.startswith("emulation: --emulate_costs factors multiply")), "")
    if r.rc != 0 or sorted(fitted) != [0, 1, 2] or not base:
        return False, said(r)
    ratio = fitted[2] / fitted[1]
    return abs(ratio - 1) <= 0.10, f"replicas 1 and 2 fitted at {fitted[1]:.4g} and {fitted[2]:.4g} ms/sample " \
                                   f"(ratio {ratio:.3f}); {base[:110]}"

