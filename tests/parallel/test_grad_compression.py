"""--grad_compression: the 16-bit formats, their MPI sum, the error bound, in process and in real MPI jobs."""
import csv
import json
import sys

import numpy as np
import pytest

from mpi_helpers import REPO_ROOT, run_mpi  # noqa: E402

from pydtnn.errors import ConfigError
from pydtnn.parallel.comm import BucketedReducer, GradCompression, SerialComm
from pydtnn.parallel.comm.half_sum import _adder, is_half

import ml_dtypes  # noqa: E402 - a dependency (pyproject.toml)


# ------------------------------------------------------------------------------------------- in process

def test_none_sends_the_buffer_itself_and_unknown_formats_are_refused():
    g = GradCompression("none")
    a = np.arange(6, dtype=np.float32)
    assert not g.active and g.pack(a) is a and g.wire_nbytes(a) == a.nbytes
    assert np.array_equal(g.error_bound(np.ones(3), 4), np.zeros(3))
    with pytest.raises(ConfigError, match="must be one of none, fp16, bf16"):
        GradCompression("fp8")


def test_bf16_without_ml_dtypes_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)      # import ml_dtypes then fails
    with pytest.raises(ConfigError) as e:
        GradCompression("bf16")
    assert str(e.value) == "--grad_compression bf16 needs the ml_dtypes package: pip install ml_dtypes"
    assert GradCompression("fp16").active                                  # NumPy's own float16


@pytest.mark.parametrize("name, dtype", [("fp16", np.float16), ("bf16", "bfloat16")])
def test_pack_halves_the_bytes_and_unpack_is_exact(name, dtype):
    g = GradCompression(name)
    a = np.linspace(-3, 3, 101, dtype=np.float32)
    wire = g.pack(a)
    assert wire.dtype == np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype) and is_half(wire)
    assert g.wire_nbytes(a) == a.nbytes // 2
    back = np.empty_like(a)
    g.unpack(wire, back)
    assert np.array_equal(back.astype(wire.dtype), wire)      # every 16-bit value is a float32: exact


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_the_mpi_addition_rounds_once_per_sum_within_the_bound(name):
    """half_sum's MPI operation applied in a chain of P-1 additions (the longest path of any reduction tree)
    to P rounded replicas' values, compared with the exact float64 sum: within error_bound elementwise, and
    the bound is not vacuous (the worst element uses a good part of it)."""
    g = GradCompression(name)
    rng = np.random.default_rng(0)
    add = _adder(g.dtype)
    for P in (2, 3, 8):
        x = rng.standard_normal((P, 4000)) * np.exp(rng.uniform(-8, 3, (P, 4000)))   # mixed magnitudes
        acc = g.pack(x[0])
        spelled = acc.copy()                 # each sum in float32, rounded once to the format
        for i in range(1, P):
            add(g.pack(x[i]).view(np.uint8), acc.view(np.uint8), None)    # raw bytes, as MPI hands them
            spelled = (g.pack(x[i]).astype(np.float32) + spelled.astype(np.float32)).astype(g.dtype)
        assert np.array_equal(acc.view(np.uint16), spelled.view(np.uint16))
        err = np.abs(acc.astype(np.float64) - x.sum(axis=0))
        # the reference sum of P float64 values is itself rounded (P-1) 2^-53 sum |x_i| at most
        abs_sum = np.abs(x).sum(axis=0)
        bound = g.error_bound(abs_sum, P) + (P - 1) * 2.0 ** -53 * abs_sum
        assert np.all(err <= bound)
        assert np.max(err / bound) > 0.2


def test_one_replica_compresses_nothing():
    buf = np.linspace(-1, 1, 50, dtype=np.float32)
    before = buf.copy()
    red = BucketedReducer(SerialComm(), buf, bucket_bytes=40, compression=GradCompression("fp16"))
    red.start_step()
    red.ready(0)
    red.finish()
    assert np.array_equal(buf, before)


# ------------------------------------------------------------------------------------ real MPI jobs

def _json(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs, dtype, sizes", [(3, "float32", "7,13,20"), (2, "float64", "5,11")])
def test_compressed_reduction_within_the_bound_of_the_exact_sum(nprocs, dtype, sizes):
    out = _json(run_mpi(nprocs, "grad_compression.py", [dtype, sizes]))
    two_bytes_each = lambda nbytes: nbytes // np.dtype(dtype).itemsize * 2     # noqa: E731
    for fmt in ("fp16", "bf16"):
        for mode in ("blocking", "non_blocking"):
            r = out[f"{fmt}/{mode}"]
            assert r["violations"] == 0 and r["worst"] <= 1.0, (fmt, mode, r)
            assert r["differs"], f"{fmt}/{mode}: the reduction is the uncompressed one"
            assert r["agree"], f"{fmt}/{mode}: the ranks hold different sums"
            sent = r["bytes"]
            assert sent["step"] == [two_bytes_each(sent["buffer"])]   # the step's allreduce: the bytes sent
            if mode == "non_blocking":
                assert r["nbuckets"] > 1 and sum(sent["buckets"]) == two_bytes_each(sent["buffer"])
                assert len(sent["buckets"]) == r["nbuckets"]
    for mode in ("blocking", "non_blocking"):                        # none: the model's dtype, untouched
        r = out[f"none/{mode}"]
        assert not r["differs"] and r["agree"] and r["bytes"]["step"] == [r["bytes"]["buffer"]]
    # an fp16 element above 65504 is inf on every rank (documented); bf16 has float32's range
    assert out["overflow"]["fp16"] == [nprocs, "inf", nprocs, nprocs]
    big = out["overflow"]["bf16"][1]
    assert big != "inf" and abs(big - (1e5 + nprocs - 1)) <= 2 ** -8 * nprocs * (1e5 + nprocs)


@pytest.mark.mpi
def test_compressed_training_follows_the_uncompressed_run():
    """8 SGD steps on 3 replicas with unequal shares: the loss decreases, and the loss after them is within the
    first-order tolerance the script derives from the per-step bounds, without being equal (compression
    happened)."""
    out = _json(run_mpi(3, "grad_compression_training.py", ["fp16,bf16", "5,9,14", "8"]))
    for fmt, r in out.items():
        assert r["losses"][-1] < r["losses"][0] - 0.2, (fmt, r["losses"])
        assert 0 < r["diff"] <= r["tol"], (fmt, r)


@pytest.mark.mpi
def test_the_launchers_flag_compresses_and_the_trace_reports_the_bytes_sent(tmp_path):
    """--grad_compression fp16 through the launcher on 3 replicas of unequal shares: said in the banner, the
    loss decreases, every traced gradient allreduce sends half of simplemlp's float32 gradient, and the losses
    differ from the same run's uncompressed (whose allreduces send all of it)."""
    runs = {}
    for fmt in ("fp16", "none"):
        folder = tmp_path / fmt
        folder.mkdir()
        r = run_mpi(3, REPO_ROOT / "scripts" / "pydtnn_benchmark.py",
                    ["--model", "simplemlp", "--synthetic_samples", "192", "--global_batch_size", "48",
                     "--parallel", "data", "--balance", "static", "--replica_speeds", "1,2,3", "--num_epochs", "2",
                     "--progress_bar", "false", "--lr_schedulers", "", "--grad_compression", fmt,
                     "--tracing", "true", "--tracer_output", str(folder / "trace.json"),
                     "--history_file", str(folder / "h.csv")], timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        trace = json.loads((folder / "trace.json").read_text())
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        sent = {e["args"]["bytes"] for e in events if e.get("name") == "allreduce"}
        with open(folder / "h.csv") as f:
            losses = [float(row["loss"]) for row in csv.DictReader(f)]
        runs[fmt] = (r.stdout, sent, losses)
    out, sent, losses = runs["fp16"]
    assert "gradients reduced in fp16 (2 bytes an element on the wire): each element within about 3 x 2^-11" in out
    assert sent == {2678824 // 2} and runs["none"][1] == {2678824}       # simplemlp: 669,706 float32 parameters
    assert len(losses) == 2 and losses[1] < losses[0]
    assert losses[1] != runs["none"][2][1]                               # what was reduced was not the fp32 sum


_STANDIN_NCCL = """
import json, sys
import cupy as cp
import numpy as np
from pydtnn.parallel.comm import BucketedReducer, GradCompression, make_comm

comm = make_comm(sys.argv[1])
rng = np.random.default_rng(comm.rank)
host = (rng.standard_normal(300) * np.exp(rng.uniform(-6, 3, 300))).astype(np.float32)
parts = comm.allgather(host.astype(np.float64))
out = {}
for name in ("fp16", "bf16"):
    g = GradCompression(name)
    bound = g.error_bound(np.abs(parts).sum(axis=0), comm.size) + 2.0 ** -53 * np.abs(parts).sum(axis=0)
    blocking = cp.asarray(host)
    g.allreduce_sum_(comm, blocking)
    bucketed = cp.asarray(host)
    reducer = BucketedReducer(comm, bucketed, bucket_bytes=400, compression=g)
    reducer.start_step()
    reducer.ready(150)
    reducer.finish()
    for mode, got in (("blocking", blocking), ("bucketed", bucketed)):
        err = np.abs(got.get().astype(np.float64) - parts.sum(axis=0))
        out[f"{name}/{mode}"] = {"within": bool(np.all(err <= bound)), "exact": bool(np.all(err == 0)),
                                 "dtype": str(got.dtype)}
from gpu_standin import fake_nccl
out["nccl_types"] = sorted({call[2] for call in fake_nccl.CALLS if call[0] == "allReduce"})
if comm.rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["nccl", "mpi"])
def test_gpu_replicas_compress_over_nccl_and_mpi_on_the_standin(tmp_path, kind):
    """Two GPU replicas (the host stand-in of CuPy and NCCL, tests/gpu_standin): device buffers cast to fp16 /
    bf16 on the device and reduced by NCCL as ncclFloat16 / ncclBfloat16 (CuPy's cupy_backends/cuda/libs/nccl.pxd
    names NCCL_BFLOAT16 = 9, ncclBfloat16 since NCCL 2.10; CuPy 14 makes bf16 arrays of ml_dtypes' bfloat16,
    cupy/cupy#9494), or staged through the host by MPI: blocking and bucketed, within the bound, not exact."""
    import gpu_standin
    script = tmp_path / "standin_compression.py"
    script.write_text(_STANDIN_NCCL)
    env = {k: v for k, v in gpu_standin.subprocess_env(PYDTNN_STANDIN_DEVICES=2).items()
           if k in ("PYTHONPATH", "PYDTNN_GPU_STANDIN", "PYDTNN_STANDIN_DEVICES")}
    r = run_mpi(2, script, [kind], timeout=120, check=True, env=env)
    out = json.loads(r.stdout.split("RESULT ", 1)[1].splitlines()[0])
    from gpu_standin import fake_nccl
    # NCCL reduced the 16-bit buffers in their own types; MPI never called it
    assert out.pop("nccl_types") == ([fake_nccl.NCCL_FLOAT16, fake_nccl.NCCL_BFLOAT16] if kind == "nccl" else [])
    assert set(out) == {f"{f}/{m}" for f in ("fp16", "bf16") for m in ("blocking", "bucketed")}
    for case, res in out.items():
        assert res["within"] and not res["exact"] and res["dtype"] == "float32", (case, res)


@pytest.mark.mpi
def test_a_run_diverging_under_fp16_compression_names_it_in_its_one_error_line():
    from mpi_helpers import output_of_our_processes
    r = run_mpi(2, REPO_ROOT / "scripts" / "pydtnn_benchmark.py",
                ["--model", "simplemlp", "--synthetic_samples", "64", "--batch_size", "16", "--progress_bar", "false",
                 "--lr_schedulers", "", "--parallel", "data", "--learning_rate", "1e30", "--num_epochs", "2",
                 "--grad_compression", "fp16"], timeout=120)
    errors = [line for line in output_of_our_processes(r) if "error" in line.lower() or "Traceback" in line]
    assert r.returncode == 2 and len(errors) == 1, r.stdout + r.stderr
    assert errors[0].startswith("pydtnn: error: the loss became") and errors[0].endswith(
        "training diverged (try a lower --learning_rate; with --grad_compression fp16 a gradient element above "
        "65504 becomes inf: bf16 has float32's range)"), errors[0]
