"""Weights and checkpoint files that used to give tracebacks are one line before any work: a weights NPZ with
a member that is no array (a text file in the archive), and a checkpoint whose saved generator state has the
right kind but integers NumPy cannot hold (an OverflowError at restore) or a position that crashes it later."""
import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from pydtnn import Model
from pydtnn.errors import CheckpointError
from pydtnn.layers import FC, Input
from pydtnn.training.trainer_state import _check_rng_state, _jsonable
from pydtnn.weights import load_weights, read_npz

from paths import REPO_DIR as REPO  # noqa: E402

LAUNCHER = f"{REPO}/scripts/pydtnn_benchmark.py"
FAST = ["--model", "simplemlp", "--synthetic_samples", "64", "--batch_size", "16", "--steps_per_epoch", "2",
        "--progress_bar", "false", "--lr_schedulers", ""]


def _model():
    m = Model(dtype="float64", seed=0)
    m.add(Input(shape=(4,)))
    m.add(FC(shape=(3,), activation="softmax"))
    return m


def _launch(*args, cwd):
    return subprocess.run([sys.executable, LAUNCHER, *FAST, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=str(cwd))


def _one_line(r, needle):
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr[-3000:]
    assert r.stderr.startswith("pydtnn: error: ") and needle in r.stderr, r.stderr


def test_a_weights_file_with_a_text_member_is_one_line(tmp_path):
    path = tmp_path / "w.npz"
    model = _model()
    np.savez(path, **model.state_arrays())
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("notes.txt", "trained on Tuesday")
    with pytest.raises(CheckpointError, match=r"member 'notes.txt' is a plain file in the archive") as e:
        load_weights(str(path), model)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match="notes.txt"):
        read_npz(str(path), "checkpoint")


def _fresh(kind):
    return json.loads(json.dumps(getattr(np.random, kind)(7).state, default=_jsonable))


BAD_STATES = {        # each passed the old check (a fresh generator accepting it) or crashed it with no line
    "PCG64 state above 128 bits": ("PCG64", lambda s: s["state"].update(state=1 << 130)),
    "PCG64 negative increment": ("PCG64", lambda s: s["state"].update(inc=-1)),
    "uinteger above 32 bits": ("PCG64", lambda s: s.update(uinteger=1 << 40)),
    "has_uint32 not a flag": ("PCG64DXSM", lambda s: s.update(has_uint32=-1)),
    "MT19937 position past the key": ("MT19937", lambda s: s["state"].update(pos=10 ** 6)),
    "MT19937 key too short": ("MT19937", lambda s: s["state"].update(key=s["state"]["key"][:10])),
    "Philox buffer position": ("Philox", lambda s: s.update(buffer_pos=9)),
    "SFC64 word above 64 bits": ("SFC64", lambda s: s["state"]["state"].__setitem__(0, 1 << 64)),
    "an extra field": ("PCG64", lambda s: s.update(extra=1)),
    "a boolean for an integer": ("PCG64", lambda s: s.update(has_uint32=True)),
}


@pytest.mark.parametrize("case", sorted(BAD_STATES))
def test_a_saved_generator_state_is_checked_field_by_field(case):
    kind, change = BAD_STATES[case]
    good = _fresh(kind)
    _check_rng_state(good)
    change(good)
    with pytest.raises(ValueError):
        _check_rng_state(good)


def test_a_checkpoint_whose_generator_state_overflows_is_one_line_before_work(tmp_path):
    r = _launch("--num_epochs", "1", "--model_checkpoint_save_steps", "1", "--checkpoint_dir", tmp_path / "ck",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    saved = sorted((tmp_path / "ck").glob("*.npz"))
    assert saved, r.stdout
    with np.load(saved[-1]) as d:
        arrays = {k: d[k] for k in d.files}
    meta = json.loads(arrays["__meta__"].tobytes())
    meta["rng_states"][0]["uinteger"] = 1 << 70
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(tmp_path / "bad.npz", **arrays)
    _one_line(_launch("--num_epochs", "2", "--resume", tmp_path / "bad.npz", cwd=tmp_path),
              "metadata field 'rng_states[0]' is not a valid random generator state")
    # the weights file of the same run with a text member: refused the same way
    weights = tmp_path / "w.npz"
    np.savez(weights, **{k: v for k, v in arrays.items() if "/" in k and not k.startswith("optimizer/")})
    with zipfile.ZipFile(weights, "a") as z:
        z.writestr("README", "hello")
    _one_line(_launch("--num_epochs", "1", "--weights_and_bias_filename", weights, cwd=tmp_path),
              "member 'README' is a plain file")
