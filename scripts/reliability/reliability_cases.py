"""The cases of `reliability_sweep.py`: issue 38's classes and their neighbours, each run as a user would.

Part 1 is one line at the right time, what a new user tripped on and CI's PyTorch oracle; part 2 is the hangs,
nothing lost and a checkpoint is data. ``Case.part`` records which; both are judged alike.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zipfile
from dataclasses import dataclass

import numpy as np

from case_runs import REPO, run

FAST = ["--model", "simplemlp", "--synthetic_samples", "64", "--batch_size", "16", "--num_epochs", "1",
        "--steps_per_epoch", "2", "--progress_bar", "false", "--lr_schedulers", ""]
ONE, NEW, CI, HANG, LOST, DATA = ("one line, at the right time", "what a new user tripped on", "CI's PyTorch oracle",
                                  "hangs", "nothing lost", "a checkpoint is data")


class NotRun(Exception):
    """A case this machine cannot run (the reason is its message)."""


@dataclass
class Case:
    section: str
    title: str
    promise: str
    check: object              # check(ctx) -> (holds, what happened)
    mpi: bool = False
    part: int = 1
    how: str = "sequential"
    ranks: int = 2             # under mpiexec: how many


CASES: list[Case] = []


def case(section, title, promise, mpi=(False,), part=1, how="sequential", ranks=2):
    """Register ``check`` once per entry of ``mpi`` (False: sequential, True: under mpiexec -n ``ranks``)."""
    def register(check):
        for m in mpi:
            CASES.append(Case(section, title, promise, check, m, part, how, ranks))
        return check
    return register


# ------------------------------------------------------------------------------------------- verdicts

def said(r, limit=3) -> str:
    """What a run showed: its status, time and first error line (or last stdout line)."""
    if r.rc is None:
        return f"no end in {r.seconds:.0f} s: killed (a hang)"
    lines = r.lines
    errors = [l for l in lines if l.startswith("pydtnn: error")]
    head = errors[0] if errors else (lines[-1] if lines else (r.out.strip().splitlines() or [""])[-1])
    after = lines[lines.index(errors[0]) + 1:] if errors else []
    frames = [l for l in after if l.startswith(("  File ", "    "))]
    other = [l for l in after if l not in frames]
    return (f"exit {r.rc} in {r.seconds:.1f} s; {head}" + (f" (+{len(frames)} line(s) of the user's frames)" if frames
                                                           else "")
            + (f" (then: {' / '.join(other)[:160]})" if other else ""))


def one_line(r, needle, before_work=True, frames=0):
    """Status 2, one `pydtnn: error:` line holding ``needle``, then at most ``frames`` lines of the user's
    frames and nothing else on stderr; nothing on stdout when refused before work."""
    lines = r.lines
    errors = [i for i, l in enumerate(lines) if l.startswith("pydtnn: error")]
    ok = (r.rc == 2 and len(errors) == 1 and needle in lines[errors[0]] and len(lines) - errors[0] - 1 <= frames
          and all(l.startswith(("  File ", "    ")) for l in lines[errors[0] + 1:])
          and (not before_work or r.out.strip() == "") and "Traceback" not in r.err)
    return ok, said(r)


def works(r, *needles):
    """Status 0 and every needle in the output; what happened: the first line holding each needle."""
    lines = (r.out + r.err).splitlines()
    missing = [n for n in needles if not any(n in line for line in lines)]
    shown = [next(line.strip() for line in lines if n in line) for n in needles if n not in missing]
    if r.rc != 0 or (needles and not shown):
        return False, said(r) + (f"; missing {missing}" if missing else "")
    return not missing, f"exit 0 in {r.seconds:.1f} s; " + " / ".join(dict.fromkeys(shown)) + \
        (f"; missing {missing}" if missing else "")


def fast(*extra):
    return [*FAST, *map(str, extra)]


def mpi_flags(ctx):
    return ["--parallel", "data"] if ctx.mpi else []


# ----------------------------------------------------------------------------------- the user's files

RAISING_DATA = ("import numpy as np\n\n\ndef create_dataset(seed):\n    return parse(seed)\n\n\n"
                "def parse(seed):\n    raise ValueError('my.csv row 7: 3 fields, expected 4')\n")
LAYER_MODEL = ("from pydtnn.layers import FC, Flatten, Input, Layer\n\n\nclass Halves(Layer):\n"
               "    def build(self, in_shape):\n        return in_shape\n\n"
               "    def forward(self, x, training=False):\n        return x / self.divisor\n\n\n"
               "def create_model(model):\n    model.add(Input(shape=(1, 28, 28)))\n    model.add(Flatten())\n"
               "    model.add(Halves())\n    model.add(FC(10, activation='softmax'))\n")
POLICIES = ("from pydtnn.parallel.balance import BalancePolicy\n\n\n"
            "class AtInit(BalancePolicy):\n    def __init__(self):\n        self.table = open('/no/such/table')\n\n\n"
            "class AtStart(BalancePolicy):\n    def initial_sizes(self, global_batch, nreplicas, caps):\n"
            "        return [global_batch / 0] * nreplicas\n\n\n"
            "class AfterStep(BalancePolicy):\n    def after_step(self, step, seconds_per_sample):\n"
            "        return self.table[step]\n\n\n"
            "class AtProbe(BalancePolicy):\n    wants_probe = True\n\n    def probed(self, global_batch, speeds, caps):\n"
            "        raise RuntimeError('probe table missing')\n\n\n"
            "class AtSave(BalancePolicy):\n    def state_dict(self):\n        return {'x': 1 / 0}\n\n\n"
            "class ByRank(BalancePolicy):\n    def initial_sizes(self, global_batch, nreplicas, caps):\n"
            "        import os\n        r = int(os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK', 0)))\n"
            "        return [global_batch // 2 + (1 if r else -1), global_batch - global_batch // 2 - (1 if r else -1)]\n")
WEIGHTS = ("def short(sizes):\n    return [1.0] * (len(sizes) - 1)\n\n\ndef nan(sizes):\n    return [float('nan')] * len(sizes)\n\n\n"
           "def none(sizes):\n    return None\n\n\ndef text(sizes):\n    return ['a'] * len(sizes)\n\n\n"
           "def nested(sizes):\n    return [[0.5]] * len(sizes)\n\n\ndef raises(sizes):\n    raise KeyError('w')\n")
LABELS = """import numpy as np
def create_dataset(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((64, 8)).astype(np.float32), rng.integers(0, 3, 64)
    {change}
    return {ret}
"""
MLP8 = ("from pydtnn.layers import FC, Input\n\n\ndef create_model(model, nclasses=3):\n"
        "    model.add(Input(shape=(8,)))\n    model.add(FC(nclasses, activation='softmax'))\n")
BLOCKS = ("from pydtnn.layers import FC, AdditionBlock, BatchNormalization, Conv2D, Flatten, Input, Relu\n\n\n"
          "def create_model(model):\n    model.add(Input(shape=(1, 28, 28)))\n"
          "    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1))\n"
          "    model.add(AdditionBlock([Conv2D(nfilters=4, filter_shape=(3, 3), padding=1), BatchNormalization(), "
          "Relu()], []))\n    model.add(Flatten())\n    model.add(FC(10, activation='softmax'))\n")
RANK_DATA = """import os
import numpy as np
RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", 0)))
def create_dataset(seed):
    rng = np.random.default_rng(seed)
    n, width, classes, dtype = 64, 8, 3, np.float32
    {change}
    return rng.standard_normal((n, width)).astype(dtype), rng.integers(0, classes, n)
"""
EVIL = "open({marker!r}, 'w').write('ran')\n\ndef create_dataset(seed):\n    raise SystemExit(0)\n"


# ====================================================================== part 1: one line, at the right time

USER_CODE = {
    "a dataset file raises in create_dataset": ({"data.py": RAISING_DATA}, ["--dataset", "data.py"],
                                                "create_dataset failed: ValueError: my.csv row 7", True),
    "a dataset file raises at import": ({"data.py": "import numpy as np\nTABLE = {}['rows']\n"},
                                        ["--dataset", "data.py"], "failed to load: KeyError: 'rows'", True),
    "a dataset file does not parse": ({"data.py": "def create_dataset(seed) return 1\n"}, ["--dataset", "data.py"],
                                      "failed to load (line 1): SyntaxError", True),
    "a dataset file imports a missing module": ({"data.py": "import pandas_not_here\n"}, ["--dataset", "data.py"],
                                                "ModuleNotFoundError", True),
    "a dataset file raises the project's own error": (
        {"data.py": "from pydtnn.errors import DatasetError\n\ndef create_dataset(seed):\n"
                    "    raise DatasetError('shard 3 is missing')\n"}, ["--dataset", "data.py"],
        "create_dataset failed: DatasetError: shard 3 is missing", True),
    "a model file raises in create_model": (
        {"model.py": "from pydtnn.layers import FC, Input\n\ndef create_model(model):\n"
                     "    model.add(Input(shape=(1, 28, 28)))\n    model.add(FC(10, units_typo=3))\n"},
        ["--model", "model.py"], "create_model failed: TypeError", True),
    "a model file raises at import": ({"model.py": "raise RuntimeError('boom')\n"}, ["--model", "model.py"],
                                      "failed to load: RuntimeError: boom", True),
    "a user layer's build has a bug": (
        {"model.py": "from pydtnn.layers import FC, Input, Layer\n\nclass B(Layer):\n    def build(self, s):\n"
                     "        return s.nonexistent\n\ndef create_model(model):\n    model.add(Input(shape=(1, 28, 28)))\n"
                     "    model.add(B())\n"}, ["--model", "model.py"], "AttributeError", True),
    "a user layer raises while training": ({"layer.py": LAYER_MODEL}, ["--model", "layer.py"],
                                           "your code raised: AttributeError", False),
    "a --balance plug-in raises in __init__": ({"pol.py": POLICIES}, ["--parallel", "data", "--balance", "pol.py:AtInit"],
                                               "AtInit() failed: FileNotFoundError", True),
    "a --balance plug-in raises in initial_sizes": ({"pol.py": POLICIES},
                                                    ["--parallel", "data", "--balance", "pol.py:AtStart"],
                                                    "initial_sizes failed: ZeroDivisionError", True),
    "a --balance plug-in raises in after_step": ({"pol.py": POLICIES},
                                                 ["--parallel", "data", "--balance", "pol.py:AfterStep"],
                                                 "after_step failed: AttributeError", False),
    "a --balance plug-in raises in probed": ({"pol.py": POLICIES}, ["--parallel", "data", "--balance", "pol.py:AtProbe"],
                                             "probed failed: RuntimeError: probe table missing", True),
    "a --balance plug-in raises in state_dict at a checkpoint": (
        {"pol.py": POLICIES}, ["--parallel", "data", "--balance", "pol.py:AtSave", "--model_checkpoint_save_steps", "1",
                               "--checkpoint_dir", "ck"], "AtSave: state_dict failed: ZeroDivisionError", False),
    "a --balance module that does not exist": ({}, ["--parallel", "data", "--balance", "no_such_mod:P"],
                                               "cannot import no_such_mod", True),
}
for _title, (_files, _args, _needle, _before) in USER_CODE.items():
    _mpi = (False, True) if _title in ("a dataset file raises in create_dataset", "a dataset file raises at import",
                                      "a model file raises in create_model", "a user layer raises while training",
                                      "a --balance plug-in raises in initial_sizes",
                                      "a --balance plug-in raises in after_step") else (False,)

    def _check(ctx, files=_files, args=_args, needle=_needle, before=_before):
        for name, text in files.items():
            ctx.write(name, text)
        extra = ["--dataset", "mnist", "--use_synthetic_data", "true"] if "--model" in args else []
        r = ctx.launch(fast(*args, *extra, *(mpi_flags(ctx) if "--parallel" not in args else [])))
        return one_line(r, needle, before_work=before, frames=4)
    case(ONE, _title, "one `pydtnn: error:` line and at most the user's own frames, status 2"
         + (", before the banner" if _before else ""), mpi=_mpi)(_check)


@case(ONE, "a dataset file raises on rank 1 only", "one line naming rank 1, status 2 on every rank", mpi=(True,))
def _(ctx):
    ctx.write("data.py", "import os\nimport numpy as np\n\ndef create_dataset(seed):\n"
                         "    if os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK')) == '1':\n"
                         "        raise OSError('rank 1 has no copy of my.npy')\n"
                         "    return np.zeros((64, 1, 28, 28), np.float32), np.arange(64) % 10\n")
    return one_line(ctx.launch(fast("--parallel", "data", "--dataset", "data.py")), "rank 1: ", frames=4)


for _policy, _needle in (("AtStart", "initial_sizes failed: ZeroDivisionError"), ("AfterStep", "after_step failed: AttributeError")):
    @case(ONE, f"the simulator runs a plug-in that raises ({_policy})", "one line and the user's frames, status 2",
          how="pydtnn-simulate")
    def _(ctx, policy=_policy, needle=_needle):
        ctx.write("pol.py", POLICIES)
        r = ctx.simulate(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "4", "--balance",
                          f"pol.py:{policy}", "--steps", "3"])
        return one_line(r, needle, before_work=False, frames=4)     # stdout: what it models, said first

for _fn in ("short", "nan", "none", "text", "nested", "raises"):
    @case(ONE, f"a --gradient_weighting function that returns {_fn}", "refused before work (the function called "
          "once on the initial split)", part=2)
    def _(ctx, fn=_fn):
        ctx.write("w.py", WEIGHTS)
        return one_line(ctx.launch(fast("--parallel", "data", "--gradient_weighting", f"w.py:{fn}")),
                        "gradient weighting", frames=4)


@case(ONE, "a balancing policy whose split depends on the rank", "the ranks agree on every split, or one line",
      mpi=(True,), part=2)
def _(ctx):
    ctx.write("pol.py", POLICIES)
    r = ctx.launch(fast("--parallel", "data", "--balance", "pol.py:ByRank"))
    return one_line(r, "", frames=4)


# --- files that gave tracebacks
def _weights(ctx, change, name="w.npz"):
    """The weights of a first run, changed by ``change(arrays, path)``."""
    r = ctx.launch(fast("--save_weights_and_bias_filename", "w0.npz", *mpi_flags(ctx)))
    if r.rc != 0:
        raise NotRun(f"the first run failed: {said(r)}")
    with np.load(ctx.folder / "w0.npz") as d:
        arrays = {k: d[k] for k in d.files}
    path = ctx.folder / name
    change(arrays, path)
    return path


def _savez(arrays, path):
    np.savez(path, **arrays)


def _text_member(arrays, path):
    np.savez(path, **arrays)
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("notes.txt", "trained on Tuesday")


WEIGHT_FILES = {
    "a weights npz with a text member": (_text_member, "member 'notes.txt' is a plain file"),
    "a weights npz with a pickled array": (lambda a, p: np.savez(p, **a, extra=np.array([{"x": 1}], dtype=object)),
                                           "Python objects"),
    "a weights npz with an array of strings": (lambda a, p: np.savez(p, **a, extra=np.array(["a"])), "strings"),
    "a weights npz with a NaN": (lambda a, p: _savez({k: (v * np.nan if i == 0 else v) for i, (k, v) in
                                                      enumerate(a.items())}, p), "NaN"),
    "a weights npz truncated": (lambda a, p: (_savez(a, p), p.write_bytes(p.read_bytes()[:200])), "corrupt"),
    "a weights .npy for an .npz": (lambda a, p: np.save(p, np.ones(3)), "is a .npy file"),
    "the weights of another model": (lambda a, p: _savez({k + "x": v for k, v in a.items()}, p), "does not match"),
}
for _title, (_change, _needle) in WEIGHT_FILES.items():
    @case(ONE, _title, "one line naming the file, before work", mpi=(False, True) if "text member" in _title else (False,))
    def _(ctx, change=_change, needle=_needle):
        path = _weights(ctx, change, "w.npy" if "npy" in needle else "w.npz")
        return one_line(ctx.launch(fast("--weights_and_bias_filename", path, *mpi_flags(ctx))), needle)


def _checkpoint(ctx, change, extra=()):
    """A step checkpoint of a first run, its metadata changed by ``change(meta, arrays)``; its path."""
    r = ctx.launch(fast("--model_checkpoint_save_steps", "1", "--checkpoint_dir", "ck", *extra, *mpi_flags(ctx)))
    saved = sorted((ctx.folder / "ck").glob("*.npz"))
    if r.rc != 0 or not saved:
        raise NotRun(f"the first run wrote no checkpoint: {said(r)}")
    with np.load(saved[-1]) as d:
        arrays = {k: d[k] for k in d.files}
    meta = json.loads(arrays["__meta__"].tobytes())
    change(meta, arrays)
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(ctx.folder / "bad.npz", **arrays)
    return ctx.folder / "bad.npz"


RNG = {
    "a checkpoint whose generator state overflows (uinteger 2^70)": lambda s: s.update(uinteger=1 << 70),
    "a checkpoint whose PCG64 state is 2^130": lambda s: s["state"].update(state=1 << 130),
    "a checkpoint whose generator has an extra field": lambda s: s.update(extra=1),
    "a checkpoint whose generator is of an unknown kind": lambda s: s.update(bit_generator="Mersenne"),
    "a checkpoint whose generator state is MT19937 with pos 10^6": lambda s: s.clear() or s.update(
        {"bit_generator": "MT19937", "state": {"key": [1] * 624, "pos": 10 ** 6}}),
}
for _title, _change in RNG.items():
    @case(ONE, _title, "one line naming the field, before work",
          mpi=(False, True) if "overflows" in _title else (False,))
    def _(ctx, change=_change):
        path = _checkpoint(ctx, lambda meta, arrays: change(meta["rng_states"][0]))
        return one_line(ctx.launch(fast("--num_epochs", "2", "--resume", path, *mpi_flags(ctx))), "rng_states[0]")


@case(ONE, "a checkpoint with a text member", "one line naming the member, before work")
def _(ctx):
    path = _checkpoint(ctx, lambda meta, arrays: None)
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("README", "x")
    return one_line(ctx.launch(fast("--num_epochs", "2", "--resume", path)), "member 'README'")


LABEL_CASES = {
    "labels (N, 5) against one distribution per sample (y 2-D mismatch)": ("y = rng.integers(0, 3, (64, 5))",
                                                                           "has targets of shape (5, 3)", True),
    "a label of 2^40": ("y[5] = 2 ** 40", "its largest label is 1099511627776", True),
    "a label of 2^40 with a registered model": ("y[5] = 2 ** 40", "its largest label is 1099511627776", False),
    "a negative label": ("y[3] = -1", "labels must be >= 0", True),
    "x and y of different lengths": ("y = y[:10]", "x holds 64 samples", True),
    "a label of 2^40 in the test arrays only": ("", "its largest label is 1099511627776", True),
}
for _title, (_change, _needle, _file_model) in LABEL_CASES.items():
    @case(ONE, _title, "one line before any allocation or work",
          mpi=(False, True) if _title in ("a label of 2^40", "labels (N, 5) against one distribution per sample "
                                                               "(y 2-D mismatch)") else (False,))
    def _(ctx, change=_change, needle=_needle, file_model=_file_model, title=_title):
        ret = "x, y, x[:8], np.full(8, 2 ** 40)" if "test arrays" in title else "x, y"
        ctx.write("data.py", LABELS.format(change=change or "pass", ret=ret))
        ctx.write("mlp.py", MLP8)
        model = ["--model", "mlp.py"] if file_model else []
        return one_line(ctx.launch(fast("--dataset", "data.py", *model, *mpi_flags(ctx))), needle)


@case(ONE, "float targets with a NaN", "one line naming the divergence, status 2 (at the first step)")
def _(ctx):
    ctx.write("data.py", "import numpy as np\ndef create_dataset(seed):\n    y = np.ones((64, 3))\n    y[0, 0] = np.nan\n"
                         "    return np.ones((64, 8), np.float32), y\n")
    ctx.write("mlp.py", MLP8)
    return one_line(ctx.launch(fast("--dataset", "data.py", "--model", "mlp.py", "--loss_func", "mean_squared_error",
                                    "--metrics", "", "--steps_per_epoch", "4")), "", before_work=False)


SIM_OUT = {
    "the simulator's --plot in a missing folder": (["run", "--model", "simplemlp", "--global_batch_size", "64",
                                                    "--replicas", "4", "--sweep", "auto", "--plot", "no/t.png"],
                                                   "--plot no/t.png"),
    "the simulator's --plot where a file is a folder": (["run", "--model", "simplemlp", "--global_batch_size", "64",
                                                         "--replicas", "4", "--sweep", "auto", "--plot", "f/t.png"],
                                                        "--plot f/t.png"),
    "the simulator's --plot without --sweep": (["run", "--model", "simplemlp", "--global_batch_size", "64",
                                                "--replicas", "4", "--plot", "t.png"], "--plot draws the sweep"),
    "calibrate --out in a missing folder (before the 60 s measurement)": (
        ["calibrate", "--model", "simplemlp", "--out", "no/p.json"], "--out no/p.json"),
    "calibrate --out that is a folder": (["calibrate", "--model", "simplemlp", "--out", "."], "--out ."),
}
for _title, (_args, _needle) in SIM_OUT.items():
    @case(ONE, _title, "one line before any work or measurement (in seconds), status 2", how="pydtnn-simulate")
    def _(ctx, args=_args, needle=_needle):
        ctx.write("f", "")
        r = ctx.simulate(args)
        ok, what = one_line(r, needle)
        return ok and r.seconds < 30, what


# --- refused before work
BEFORE_WORK = {
    "--num_epochs 0": (["--num_epochs", "0"], "--num_epochs 0 trains nothing", True),
    "--tensorboard_dir ''": (["--tensorboard_dir", ""], "--tensorboard_dir: empty folder name", True),
    "--plots_dir ''": (["--plots_dir", ""], "--plots_dir: empty folder name", False),
    "--step_history_file ''": (["--step_history_file", ""], "--step_history_file: empty file name", False),
    "--history_file ''": (["--history_file", ""], "--history_file: empty file name", False),
    "--save_weights_and_bias_filename ''": (["--save_weights_and_bias_filename", ""], "empty file name", False),
    "--resume ''": (["--resume", ""], "--resume: empty path", True),
    "--weights_and_bias_filename ''": (["--weights_and_bias_filename", ""], "empty path", False),
    "--dataset_train_path ''": (["--dataset", "mnist", "--dataset_train_path", ""], "empty path", False),
    "--checkpoint_dir ''": (["--checkpoint_dir", ""], "--checkpoint_dir: empty folder name", False),
    "--tracer_output '' with --tracing true": (["--tracing", "true", "--tracer_output", ""], "empty file name", False),
    "--evaluate_only on the bytes dataset (no test split)": (["--model", "bytelm_small", "--dataset", "bytes",
                                                              "--evaluate_only", "true"], "no test split", True),
    "--evaluate_only on the t10k pool (no test split)": (["--dataset", "mnist", "--dataset_train_path",
                                                          str(REPO / "tests" / "data" / "mnist-t10k"),
                                                          "--evaluate_only", "true"], "no test split", False),
    "--evaluate true without a test split": (["--model", "bytelm_small", "--dataset", "bytes", "--evaluate", "true"],
                                             "no test split", False),
    "--steps_per_epoch -1": (["--steps_per_epoch", "-1"], "must be >= 0", False),
    "--batch_size 0": (["--batch_size", "0"], "must be a positive integer", False),
    "--num_epochs -1": (["--num_epochs", "-1"], "must be >= 0", False),
    "--global_batch_size above the training samples": (["--global_batch_size", "4096"], "larger than the", True),
    "--dataset_test_path that does not exist": (["--dataset", "mnist", "--dataset_train_path",
                                                 str(REPO / "tests" / "data" / "mnist-t10k"), "--dataset_test_path",
                                                 "nowhere"], "test folder not found", False),
}
for _title, (_args, _needle, _both) in BEFORE_WORK.items():
    @case(ONE, _title, "one line before the banner, status 2", mpi=(False, True) if _both else (False,))
    def _(ctx, args=_args, needle=_needle):
        return one_line(ctx.launch(fast(*args, *mpi_flags(ctx))), needle)


@case(ONE, "--evaluate_only on a dataset file with an empty test split", "one line before the banner")
def _(ctx):
    ctx.write("data.py", "import numpy as np\nfrom pydtnn.datasets import ArraySplit, Dataset\n"
                         "def create_dataset(seed):\n    x, y = np.zeros((32, 1, 28, 28), np.float32), np.arange(32) % 10\n"
                         "    return Dataset(name='m', input_shape=(1, 28, 28), nclasses=10, train=ArraySplit(x, y, 0, 32, "
                         "nclasses=10), val=None, test=ArraySplit(x, y, 0, 0, nclasses=10, name='test'))\n")
    return one_line(ctx.launch(fast("--dataset", "data.py", "--evaluate_only", "true")), "no test split")


@case(ONE, "--num_epochs 0 --evaluate_only true", "evaluates, status 0")
def _(ctx):
    return works(ctx.launch(fast("--num_epochs", "0", "--evaluate_only", "true")), "evaluation: loss=")


@case(ONE, "--num_epochs 0 --save_weights_and_bias_filename", "writes the initial weights, status 0")
def _(ctx):
    ok, what = works(ctx.launch(fast("--num_epochs", "0", "--save_weights_and_bias_filename", "init.npz")))
    return ok and (ctx.folder / "init.npz").is_file(), what


@case(ONE, "--resume a checkpoint that already trained --num_epochs", "one line before work", mpi=(False, True))
def _(ctx):
    path = _checkpoint(ctx, lambda meta, arrays: None, extra=("--num_epochs", "2", "--steps_per_epoch", "1"))
    return one_line(ctx.launch(fast("--resume", path, "--num_epochs", "1", *mpi_flags(ctx))), "nothing is left to train")


# ============================================================================ part 1: a new user's first runs

@case(NEW, "the documented byte model: --model bytelm_small --dataset bytes", "trains as written (the default batch "
      "shrinks, said), perplexity and tokens/s", mpi=(False, True))
def _(ctx):
    r = ctx.launch(["--model", "bytelm_small", "--dataset", "bytes", *mpi_flags(ctx)], timeout=300)
    return works(r, "batch: --batch_size", "perplexity=", "throughput:")


@case(NEW, "the byte model with --batch_size 64 given", "one line: the user's batch is not changed")
def _(ctx):
    return one_line(ctx.launch(["--model", "bytelm_small", "--dataset", "bytes", "--batch_size", "64"]),
                    "larger than the 60 training samples")


@case(NEW, "the byte model with --validation_split 0.2", "val_perplexity in the epoch line")
def _(ctx):
    return works(ctx.launch(["--model", "bytelm_small", "--dataset", "bytes", "--validation_split", "0.2",
                             "--batch_size", "8"], timeout=300), "val_perplexity=")


@case(NEW, "an image model", "no perplexity or tokens (not a language model)")
def _(ctx):
    r = ctx.launch(fast())
    ok, what = works(r, "throughput:")
    return ok and "perplexity" not in r.out and "tokens/s" not in r.out, what


@case(NEW, "the report's throughput", "leaves out the first step, which compiles, and says so")
def _(ctx):
    return works(ctx.launch(fast("--steps_per_epoch", "4")), "the first step, which compiles, left out")


@case(NEW, "the first progress line", "says that the first step compiles, no estimate from it")
def _(ctx):
    r = ctx.launch([*fast("--steps_per_epoch", "6"), "--progress_bar", "true"], env={"PYDTNN_PROGRESS_INTERVAL_S": 0})
    progress = [l for l in r.err.splitlines() if l.startswith("epoch 1/1: step")]
    ok = r.rc == 0 and progress and progress[0].endswith("(the first step compiles the kernels: no estimate yet)") \
        and all(l.endswith(" s left") for l in progress[1:])
    return bool(ok), (progress[0] if progress else said(r)) + (f" ... {progress[-1]}" if len(progress) > 1 else "")


@case(NEW, "Embedding on integer-valued float ids (an Input without dtype)", "trains, as Keras's Embedding")
def _(ctx):
    ctx.write("lm.py", "from pydtnn.activations import Softmax\nfrom pydtnn.layers import FC, Embedding, Input\n"
                       "def create_model(model):\n    model.add(Input(shape=(64,)))\n    model.add(Embedding(256, 8))\n"
                       "    model.add(FC(256))\n    model.add(Softmax())\n")
    return works(ctx.launch(["--model", "lm.py", "--dataset", "bytes", "--batch_size", "16", "--progress_bar",
                             "false"]), "perplexity=")


def _embedding(ctx, value, dtype, needle):
    """A dataset with one bad id, ``value``, and a model whose Embedding reads ids of ``dtype`` (None: floats)."""
    ctx.write("data.py", f"import numpy as np\ndef create_dataset(seed):\n    x = np.ones((64, 4), {'np.' + dtype if dtype else 'float'})\n"
                         f"    x[3, 1] = {value}\n    return x, np.arange(64) % 5\n")
    ctx.write("m.py", "from pydtnn.layers import FC, Embedding, Flatten, Input\ndef create_model(model):\n"
                      f"    model.add(Input(shape=(4,), dtype={dtype!r}))\n    model.add(Embedding(8, 3))\n"
                      "    model.add(Flatten())\n    model.add(FC(5, activation='softmax'))\n")
    return one_line(ctx.launch(fast("--dataset", "data.py", "--model", "m.py", "--steps_per_epoch", "4")), needle,
                    before_work=False)


for _title, _value, _dtype, _needle in (("a float id of 2.5", "2.5", None, "token ids must be integers, got 2.5"),
                                        ("a float id of NaN", "float('nan')", None, "token ids must be integers"),
                                        ("an id beyond its table", "99", "int64", "token id 99 is outside [0, 8)")):
    @case(NEW, f"Embedding on {_title}", "one line naming the layer and the id")
    def _(ctx, value=_value, dtype=_dtype, needle=_needle):
        return _embedding(ctx, value, dtype, needle)


@case(NEW, "the trace of a model with a block", "every layer inside the block has its own event, with the block as "
      "parent", mpi=(False, True))
def _(ctx):
    ctx.write("b.py", BLOCKS)
    r = ctx.launch(fast("--model", "b.py", "--dataset", "mnist", "--use_synthetic_data", "true", "--tracing", "true",
                        "--tracer_output", "t.json", "--trace_steps", "1:2", *mpi_flags(ctx)))
    if r.rc != 0:
        return False, said(r)
    events = [e for e in json.loads((ctx.folder / "t.json").read_text())["traceEvents"] if e["ph"] == "X"]
    nested = sorted({e["name"] for e in events if "parent" in e.get("args", {})})
    return len(nested) == 3, f"nested events: {nested} (parent {sorted({e['args']['parent'] for e in events if 'parent' in e['args']})})"


@case(NEW, "--profile_layers on a model with a block", "the block's layers on rows of their own, indented under it")
def _(ctx):
    ctx.write("b.py", BLOCKS)
    r = ctx.launch(fast("--model", "b.py", "--dataset", "mnist", "--use_synthetic_data", "true", "--profile_layers",
                        "true", "--steps_per_epoch", "3"))
    table = r.out.split("layer profile of rank 0", 1)[-1] if "layer profile of rank 0" in r.out else ""
    rows = [l for l in table.splitlines() if l.startswith("  ") and ("Conv2D" in l or "BatchNorm" in l)]
    return r.rc == 0 and len(rows) == 2, f"indented rows: {[l.split()[0] for l in rows]}"


@case(NEW, "calibrating the simulator from a trace with nested events", "a profile whose layers are the top-level ones")
def _(ctx):
    ctx.write("b.py", BLOCKS)
    r = ctx.launch(fast("--model", "b.py", "--dataset", "mnist", "--use_synthetic_data", "true", "--tracing", "true",
                        "--tracer_output", "t.json", "--trace_steps", "1:2"))
    if r.rc != 0:
        return False, said(r)
    r = ctx.simulate(["calibrate", "--model", "b.py", "--dataset", "mnist", "--trace", "t.json", "--out", "p.json"])
    return works(r, "written to p.json")


@case(NEW, "TensorBoard tags", "one naming: step/<column> and epoch/<column>")
def _(ctx):
    r = ctx.launch(fast("--tensorboard_dir", "tb", "--steps_per_epoch", "3"))
    if r.rc != 0:
        return False, said(r)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(ctx.folder / "tb"))
    events.Reload()
    tags = sorted(events.Tags()["scalars"])
    return all(t.startswith(("step/", "epoch/")) for t in tags) and "step/rank0_b" in tags and "epoch/rank0_b" in tags, \
        f"{len(tags)} tags, e.g. {tags[:2]} ... {tags[-2:]}"


@case(NEW, "scripts/experiments/heterogeneity_experiment.py from another folder",
      "writes into ./out of the current folder, not the repository's", how="script")
def _(ctx):
    before = set((REPO / "out").glob("**/*")) if (REPO / "out").exists() else set()
    r = run([sys.executable, REPO / "scripts" / "experiments" / "heterogeneity_experiment.py", "--quick", "--parts",
             "b", "--data", "synthetic", "--epochs", "2"], ctx.folder, "script", 600)
    after = set((REPO / "out").glob("**/*")) if (REPO / "out").exists() else set()
    mine = list((ctx.folder / "out").glob("**/*"))
    return r.rc == 0 and mine and after == before, f"{said(r)}; {len(mine)} files under ./out, {len(after - before)} " \
                                                  f"new in the repository's out/"


SIM_LAYOUT = {
    "the simulator's 1,024-replica example on a 2-core profile": (["--replicas", "1024", "--global_batch_size", "4096",
                                                                    "--sweep", "auto"],
                                                                   "on 512 node(s) of 2 rank(s)", None),
    "--nodes 3 for 8 replicas": (["--replicas", "8", "--nodes", "3"], None, "multiple of --nodes 3"),
    "--ranks_per_node 4 for 6 replicas": (["--replicas", "6", "--ranks_per_node", "4"], None, "--ranks_per_node 4"),
    "--nodes 2 --ranks_per_node 4 for 8 replicas": (["--replicas", "8", "--nodes", "2", "--ranks_per_node", "4"],
                                                    "modelled: 8 replica(s) on 2 node(s) of 4 rank(s)", None),
    "--nodes 2 --ranks_per_node 2 for 8 replicas": (["--replicas", "8", "--nodes", "2", "--ranks_per_node", "2"],
                                                    None, "not --replicas 8"),
    "--sweep 3 at 2 ranks per node": (["--replicas", "8", "--ranks_per_node", "2", "--sweep", "3,4"], None,
                                      "--sweep 3: not a multiple"),
    "--sweep beyond the global batch": (["--replicas", "8", "--sweep", "4,128", "--global_batch_size", "64"], None,
                                        "more replicas than the global"),
    "--sweep auto with --nodes": (["--replicas", "8", "--nodes", "2", "--sweep", "auto"],
                                  "sweep: 4 rank(s) per node, the nodes growing with P", None),
    "--network_alg hierarchical on one node": (["--replicas", "2", "--network_alg", "hierarchical"], None,
                                               "needs more than one node"),
    "a roofline profile (it does not know its node)": (["--replicas", "4", "--roofline_only"],
                                                       "modelled: 4 replica(s) on 4 node(s) of 1 rank(s)", None),
}
for _title, (_args, _ok, _refused) in SIM_LAYOUT.items():
    @case(NEW, f"simulator: {_title}", "says what it models" if _ok else "refused in one line, before work",
          how="pydtnn-simulate")
    def _(ctx, args=_args, ok_needle=_ok, refused=_refused):
        profile = ["--model", "simplemlp"]
        if "--roofline_only" not in args:
            doc = json.loads(json.dumps(_roofline(ctx)))
            doc["cores"] = 2
            ctx.write("p.json", json.dumps(doc))
            profile = ["--profile", "p.json", "--model", "simplemlp"]
        args = [a for a in args if a != "--roofline_only"]
        if "--global_batch_size" not in args:
            args += ["--global_batch_size", "256"]
        r = ctx.simulate(["run", *profile, *args, "--steps", "5"])
        return works(r, ok_needle) if ok_needle else one_line(r, refused)


def _roofline(ctx):
    r = ctx.simulate(["calibrate", "--model", "simplemlp", "--roofline", "--out", "roof.json"])
    if r.rc != 0:
        raise NotRun(said(r))
    return json.loads((ctx.folder / "roof.json").read_text())


@case(NEW, "simulator: a sweep of a half-slow cluster keeps its mix", "at P=2 one fast and one slow replica: static "
      "beats equal", how="pydtnn-simulate")
def _(ctx):
    _roofline(ctx)
    r = ctx.simulate(["run", "--profile", "roof.json", "--model", "simplemlp", "--global_batch_size", "256",
                      "--replicas", "8", "--speed_factors", "1,1,1,1,2,2,2,2", "--steps", "10", "--sweep", "2,8",
                      "--json"])
    if r.rc != 0:
        return False, said(r)
    doc = json.loads(r.out)
    eq, st = (next(x for x in doc["sweep"][p] if x["replicas"] == 2)["step_seconds"] for p in ("equal", "static"))
    return st < eq, f"P=2: equal {eq * 1e3:.2f} ms, static {st * 1e3:.2f} ms; {doc['sweep_layout']}"


# ================================================================================ part 1: CI's oracle

@case(CI, "the PyTorch oracle tests with torch installed", "run and pass, counted", how="pytest")
def _(ctx):
    try:
        import torch  # noqa: F401
    except ImportError:
        raise NotRun("torch is not installed in this environment") from None
    r = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "oracle"], REPO, "pytest", 600,
            env={"PYDTNN_REQUIRE_TORCH_ORACLE": "1"})
    count = [l for l in r.out.splitlines() if l.startswith("PyTorch oracle tests:")]
    return r.rc == 0 and bool(count), (count or [said(r)])[0]


@case(CI, "the oracle tests where torch is missing and CI requires it", "they fail, never skip", how="pytest")
def _(ctx):
    ctx.write("torch/__init__.py", "raise ImportError('no torch here')\n")
    r = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "oracle",
             "tests/layers/test_losses_metrics.py"], REPO, "pytest", 600,
            env={"PYDTNN_REQUIRE_TORCH_ORACLE": "1", "PYTHONPATH": f"{ctx.folder}{os.pathsep}{REPO}"})
    count = [l for l in r.out.splitlines() if l.startswith("PyTorch oracle tests:")]
    return r.rc == 1 and bool(count) and "skipped" not in count[0], (count or [said(r)])[0]


@case(CI, ".ci/run", "installs torch==2.13.0 and requires the oracle", how="read")
def _(ctx):
    text = (REPO / ".ci" / "run").read_text()
    ok = 'pip install "torch==2.13.0"' in text and "export PYDTNN_REQUIRE_TORCH_ORACLE=1" in text
    return ok, "installs torch==2.13.0, exports PYDTNN_REQUIRE_TORCH_ORACLE=1, runs python -m pytest -q" if ok else \
        "not found"


# =================================================================================== part 2: hangs

for _title, _programs in (
        ("--history_file on rank 0 only (MPMD)", [(1, ["--history_file", "h.csv"]), (1, [])]),
        ("--history_file on rank 1 only (MPMD)", [(1, []), (1, ["--history_file", "h.csv"])]),
        ("--save_weights_and_bias_filename on rank 0 only (MPMD)", [(1, ["--save_weights_and_bias_filename", "w.npz"]),
                                                                   (1, [])])):
    @case(HANG, _title, "no hang: the job ends (trains, or one line)", part=2, how="mpiexec MPMD")
    def _(ctx, programs=_programs):
        cmd, how = ctx.mpmd([(n, fast("--parallel", "data", "--num_epochs", "2", *extra)) for n, extra in programs])
        r = run(cmd, ctx.folder, how, 90)
        return r.rc is not None, said(r)

for _title, _change, _needle in (("different sample counts", "n = 64 + 16 * RANK", "samples"),
                                 ("different shapes", "width = 8 + RANK", "shape"),
                                 ("different classes", "classes = 3 + RANK", "classes"),
                                 ("different dtypes", "dtype = np.float32 if RANK else np.float64", "")):
    @case(HANG, f"a dataset file that gives the ranks {_title}", "one line before training, no hang", mpi=(True,),
          part=2)
    def _(ctx, change=_change, needle=_needle):
        ctx.write("data.py", RANK_DATA.format(change=change))
        ctx.write("mlp.py", MLP8.replace("shape=(8,)", "shape=(8,)"))
        r = ctx.launch(fast("--parallel", "data", "--dataset", "data.py"), timeout=90)
        return one_line(r, needle)


@case(HANG, "the simulator asked for 10^7 replicas", "refused, or says how long, within seconds", part=2,
      how="pydtnn-simulate")
def _(ctx):
    r = run([sys.executable, "-m", "pydtnn.sim", "run", "--model", "simplemlp", "--global_batch_size", "20000000",
             "--samples", "20000000", "--replicas", "10000000", "--steps", "1"], ctx.folder, "pydtnn-simulate", 30)
    told = next((l for l in (r.out + r.err).splitlines() if "replicas" in l and " of memory (the same run at " in l),
                None)
    if r.rc is None and told:           # still running after 30 s (it takes minutes), having said how long
        return True, f"said, then stopped by the sweep at {r.seconds:.0f} s: {told}"
    return r.rc is not None, said(r)


# ============================================================================== part 2: nothing lost

def _full_disk(ctx):
    """A 64 KiB tmpfs under the case's folder, filled: writes there fail with ENOSPC; creating a file does not."""
    where = ctx.folder / "full"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True).returncode:
        raise NotRun("mounting a tmpfs needs root")
    ctx.cleanup = lambda: subprocess.run(["umount", "-l", str(where)], capture_output=True)
    try:
        with open(where / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:                        # full: what the case wants
        pass
    return where


for _flag, _value in (("--history_file", "full/h.csv"), ("--step_history_file", "full/s.csv"),
                      ("--tracer_output", "full/t.json"), ("--tensorboard_dir", "full/tb"), ("--plots_dir", "full/p"),
                      ("--save_weights_and_bias_filename", "full/w.npz")):
    @case(LOST, f"a full disk under {_flag}", "one line naming the failure and the rescue; the trained state "
          "saved in the writable --checkpoint_dir", part=2)
    def _(ctx, flag=_flag, value=_value):
        _full_disk(ctx)
        try:
            extra = ["--tracing", "true"] if flag == "--tracer_output" else []
            r = ctx.launch(fast(flag, value, *extra, "--num_epochs", "2", "--checkpoint_dir", "ck"), timeout=90)
        finally:
            ctx.cleanup()
        # the rescue: the full state (a checkpoint) or the final weights, in the writable --checkpoint_dir
        kept = sorted(p.name for p in (ctx.folder / "ck").glob("*.npz")) if (ctx.folder / "ck").exists() else []
        ok, what = one_line(r, "", before_work=False)
        return ok and bool(kept), f"{what}; kept: {kept or 'nothing'}"


def _interrupt(ctx, signum, mpi):
    args = [*FAST, "--num_epochs", "4", "--steps_per_epoch", "400", "--checkpoint_dir", "ck", *(["--parallel", "data"]
                                                                                                  if mpi else [])]
    r = ctx.launch(args, timeout=180, signal_after=("epoch 1:", 0.3, signum))
    kept = sorted(p.name for p in (ctx.folder / "ck").glob("*.npz")) if (ctx.folder / "ck").exists() else []
    return r, kept


# under Open MPI, mpirun itself signalled drops the ranks' line: the launcher says where the checkpoint went
for _name, _signum, _mpi, _part in (("Ctrl-C (SIGINT)", signal.SIGINT, (False, True), 2),
                                    ("SIGTERM", signal.SIGTERM, (False,), 1), ("SIGTERM", signal.SIGTERM, (True,), 2)):
    @case(LOST, f"{_name} mid-epoch", "a checkpoint written and named", mpi=_mpi, part=_part)
    def _(ctx, signum=_signum):
        r, kept = _interrupt(ctx, signum, ctx.mpi)
        named = any("ck/" in l or "checkpoint" in l for l in r.lines)
        return bool(kept) and named, f"{said(r)}; checkpoints: {kept or 'none'}"


@case(LOST, "resume from an early checkpoint with the original outputs", "refused before work unless --overwrite "
      "true: the original run's files unchanged", part=2)
def _(ctx):
    args = fast("--num_epochs", "2", "--history_file", "h.csv", "--save_weights_and_bias_filename", "w.npz",
                "--checkpoint_dir", "ck", "--model_checkpoint_save_steps", "2")
    r = ctx.launch(args)
    saved = sorted((ctx.folder / "ck").glob("*.npz"))
    if r.rc != 0 or not saved:
        raise NotRun(said(r))
    before = {p: p.read_bytes() for p in (ctx.folder / "h.csv", ctx.folder / "w.npz")}
    r = ctx.launch([*args, "--resume", saved[0]])
    same = all(p.read_bytes() == b for p, b in before.items())
    return r.rc == 2 and same, f"{said(r)}; the original files {'unchanged' if same else 'OVERWRITTEN'}"


@case(LOST, "a checkpoint missing its optimizer state", "refused, or one line saying what is missing", part=2)
def _(ctx):
    path = _checkpoint(ctx, lambda meta, arrays: [arrays.pop(k) for k in list(arrays) if k.startswith("optimizer/")],
                       extra=("--momentum", "0.9"))
    r = ctx.launch(fast("--num_epochs", "2", "--momentum", "0.9", "--resume", path))
    told = [l for l in (r.out + r.err).splitlines() if "optimizer" in l and ("missing" in l or "without" in l
                                                                              or "no optimizer" in l)]
    return (r.rc == 2 or bool(told)), said(r) + (f"; {told[0]}" if told else "; nothing said about the optimizer")


@case(LOST, "a --history_file whose folder is a file, from the start", "one line before work", part=1)
def _(ctx):
    (ctx.folder / "f").write_text("")
    return one_line(ctx.launch(fast("--history_file", "f/h.csv")), "--history_file f/h.csv")


# ========================================================================== part 2: a checkpoint is data

for _flag, _value in (("dataset_name", "evil.py"), ("model_name", "evil.py"),
                      ("gradient_weighting", "evil_mod:w")):
    @case(DATA, f"a crafted checkpoint whose flags set --{_flag} {_value}", "the code never runs", part=2)
    def _(ctx, flag=_flag, value=_value):
        marker = ctx.folder / "RAN"
        ctx.write("evil.py", EVIL.format(marker=str(marker)))
        ctx.write("evil_mod.py", EVIL.format(marker=str(marker)))
        path = _checkpoint(ctx, lambda meta, arrays: meta["flags"].update({flag: value}))
        r = ctx.launch(["--resume", path, "--num_epochs", "2", "--progress_bar", "false"],
                       env={"PYTHONPATH": f"{ctx.folder}{os.pathsep}{REPO}"})
        return not marker.exists(), f"{said(r)}; the file's code {'RAN' if marker.exists() else 'did not run'}"

for _flag, _value in (("history_file", "../../pwned.csv"), ("save_weights_and_bias_filename", "../pwned.npz"),
                      ("checkpoint_dir", "../../pwned_dir")):
    @case(DATA, f"a crafted checkpoint whose flags set --{_flag} {_value}", "no file written there", part=2)
    def _(ctx, flag=_flag, value=_value):
        path = _checkpoint(ctx, lambda meta, arrays: meta["flags"].update({flag: value}))
        (ctx.folder / "a" / "b").mkdir(parents=True)
        target = (ctx.folder / "a" / "b" / value).resolve()
        r = run([sys.executable, REPO / "scripts" / "pydtnn_benchmark.py", "--resume", path, "--num_epochs", "3",
                 "--progress_bar", "false", "--model_checkpoint_save_steps", "1"], ctx.folder / "a" / "b",
                "sequential", 120)
        return not target.exists(), f"{said(r)}; {target.name} {'WRITTEN' if target.exists() else 'not written'}"


@case(DATA, "a checkpoint with a pickled member", "one line, nothing unpickled")
def _(ctx):
    path = _checkpoint(ctx, lambda meta, arrays: arrays.update(evil=np.array([{"a": 1}], dtype=object)))
    return one_line(ctx.launch(fast("--num_epochs", "2", "--resume", path)), "Python objects")


@case(DATA, "resume after SIGTERM", "bit-exact: the same final weights as an uninterrupted run")
def _(ctx):
    args = [*FAST, "--num_epochs", "2", "--steps_per_epoch", "400", "--checkpoint_dir", "ck", "--seed", "3"]
    r = ctx.launch([*args, "--save_weights_and_bias_filename", "full.npz"], timeout=240)
    if r.rc != 0:
        raise NotRun(said(r))
    r = ctx.launch(args, timeout=180, signal_after=("epoch 1:", 0.3, signal.SIGTERM))
    saved = sorted((ctx.folder / "ck").glob("*.npz"))
    if r.rc != 3 or not saved:
        return False, said(r)
    r = ctx.launch([*args, "--resume", saved[-1], "--save_weights_and_bias_filename", "resumed.npz"], timeout=240)
    with np.load(ctx.folder / "full.npz") as a, np.load(ctx.folder / "resumed.npz") as b:
        same = all(np.array_equal(a[k], b[k]) for k in a.files)
    return same, f"{said(r)}; resumed from {saved[-1].name}: weights {'identical' if same else 'DIFFER'}"



# ==================================================================================== more neighbours

@case(ONE, "a dataset file whose own split raises while training", "one line and the user's frames, status 2",
      mpi=(False, True))
def _(ctx):
    ctx.write("data.py", "import numpy as np\nfrom pydtnn.datasets import ArraySplit, Dataset\n\n\n"
                         "class Flaky(ArraySplit):\n    def take(self, indices, epoch=None):\n"
                         "        if epoch is not None:\n            raise IOError('shard server went away')\n"
                         "        return super().take(indices, epoch)\n\n\n"
                         "def create_dataset(seed):\n    x, y = np.zeros((64, 1, 28, 28), np.float32), np.arange(64) % 10\n"
                         "    return Dataset(name='f', input_shape=(1, 28, 28), nclasses=10, "
                         "train=Flaky(x, y, nclasses=10), val=None, test=None)\n")
    return one_line(ctx.launch(fast("--dataset", "data.py", *mpi_flags(ctx))), "OSError: shard server went away",
                    before_work=False, frames=4)


@case(ONE, "--balance naming a class that is no BalancePolicy", "one line before work")
def _(ctx):
    ctx.write("pol.py", "class Mine:\n    pass\n")
    return one_line(ctx.launch(fast("--parallel", "data", "--balance", "pol.py:Mine")), "expected a subclass")


@case(ONE, "--gradient_weighting naming a module that does not exist", "one line before work")
def _(ctx):
    return one_line(ctx.launch(fast("--parallel", "data", "--gradient_weighting", "no_such_mod:w")),
                    "cannot import no_such_mod")


@case(NEW, "the bytes dataset with --sequence_length 2000 (its 3.8 kB make one)", "one line: fewer than 2 sequences")
def _(ctx):
    return one_line(ctx.launch(["--model", "bytelm_small", "--dataset", "bytes", "--sequence_length", "2000"]),
                    "fewer than 2 sequences")


@case(NEW, "the byte model under mpiexec with --global_batch_size 64 given", "one line: the user's batch is kept",
      mpi=(True,))
def _(ctx):
    return one_line(ctx.launch(["--model", "bytelm_small", "--dataset", "bytes", "--parallel", "data",
                                "--global_batch_size", "64"]), "larger than the 60 training samples")


@case(NEW, "simulator: --ranks_per_node 3 for 6 replicas and a sweep", "says what it models: 2 nodes of 3; the sweep "
      "3, 6", how="pydtnn-simulate")
def _(ctx):
    return works(ctx.simulate(["run", "--model", "simplemlp", "--global_batch_size", "60", "--replicas", "6",
                               "--ranks_per_node", "3", "--steps", "5", "--sweep", "auto"]),
                 "modelled: 6 replica(s) on 2 node(s) of 3 rank(s)", "sweep: 3 rank(s) per node")


@case(NEW, "simulator: the JSON document says what it models", "nodes, ranks_per_node, layout", how="pydtnn-simulate")
def _(ctx):
    r = ctx.simulate(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "4", "--steps", "3",
                      "--json"])
    if r.rc != 0:
        return False, said(r)
    doc = json.loads(r.out)
    return {"nodes", "ranks_per_node", "layout"} <= set(doc), f"nodes {doc.get('nodes')}, ranks_per_node " \
                                                             f"{doc.get('ranks_per_node')}: {doc.get('layout')}"
