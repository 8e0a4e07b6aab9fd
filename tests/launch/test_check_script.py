"""Tests of the device check SCRIPT itself (scripts/gpu_check.sh; scripts/gpu/gpu_check_prepare.sh and
gpu_check_deadline.py) on a machine without a GPU: its dry run, stage order and limits, summary lines, what it
leaves in $OUT, its budget and timeouts, the carried-size check and the pytest deadline plugin. They test the
script's own logic, NOT the GPU: no stage's GPU work runs here (each says so)."""
import os
import re
import subprocess
import sys
import time

import pytest

from paths import REPO_DIR as REPO  # noqa: E402
SCRIPT = os.path.join(REPO, "scripts", "gpu_check.sh")
STAGES = ["versions", "conformance", "bench", "loop", "mixed", "mnist", "resume", "nccl"]
ALLOWED = {"summary.txt", "gpu_check.log", "conformance.xml", "bench.jsonl", "histories.json"}

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bash scripts")


def _dry_run(tmp_path, **env):
    out = tmp_path / "out"
    full_env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    full_env.update({k: str(v) for k, v in env.items()})
    r = subprocess.run(["bash", SCRIPT, "--dry-run"], capture_output=True, text=True, timeout=600, env=full_env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r, out


def _stage_lines(text):
    return {m.group(1): m.group(0) for m in re.finditer(r"^(%s): .*$" % "|".join(STAGES), text, re.M)}


def test_check_script_dry_run_order_limits_summary_and_out_files(tmp_path):
    r, out = _dry_run(tmp_path)
    header = r.stdout.splitlines()[0]
    assert "DRY RUN" in header
    limits = re.search(r"stage limits \((\d+)s\):(.*)$", header)
    pairs = [p.split("=") for p in limits.group(2).split()]
    assert [name for name, _ in pairs] == STAGES                   # the most useful stages first
    assert sum(int(v) for _, v in pairs) == int(limits.group(1))
    budget = int(re.search(r"budget (\d+)s", header).group(1))
    # about 6 minutes: a rerun fits in a 15-minute device session (two machine starts included)
    assert 300 <= int(limits.group(1)) <= 350 and int(limits.group(1)) <= budget <= 360
    lines = _stage_lines(r.stdout)
    assert list(lines) == STAGES, r.stdout                          # one line per stage, on the console
    for name, line in lines.items():
        assert line.startswith(f"{name}: dry run ok (its GPU work skipped: no GPU)"), line
    collected = re.search(r"would run (\d+) tests, of which (\d+) stand-in ones", lines["conformance"])
    assert int(collected.group(1)) > 50 and int(collected.group(2)) == 0
    summary = (out / "summary.txt").read_text()
    assert list(_stage_lines(summary)) == STAGES and summary.splitlines()[0] == header
    entries = list(out.iterdir())
    assert {p.name for p in entries} <= ALLOWED and len(entries) <= 5 and all(p.is_file() for p in entries)
    assert re.search(r"^total: \d+s; 2 file\(s\) in \$OUT: gpu_check.log summary.txt$", r.stdout, re.M)
    assert "=== conformance (limit 70s" in (out / "gpu_check.log").read_text()


def test_check_script_stage_timeout_and_spent_budget(tmp_path):
    """A stage past its limit is killed and says so; stages that would start with under 10 s of the budget
    left say they did not start. Controlled delays: mixed sleeps 3 s against a 1 s limit, mnist 6 s."""
    r, out = _dry_run(tmp_path, GPU_CHECK_BUDGET=16, GPU_CHECK_SKIP="conformance", GPU_CHECK_LIMIT_mixed=1,
                      GPU_CHECK_DRY_SLEEP="mixed=3 mnist=6")
    lines = _stage_lines(r.stdout)
    assert list(lines) == STAGES
    assert lines["conformance"] == "conformance: skipped (GPU_CHECK_ONLY / GPU_CHECK_SKIP)"
    assert lines["mixed"].startswith("mixed: TIMED OUT at its 1s limit")
    assert lines["mnist"].startswith("mnist: dry run ok")
    for name in ("resume", "nccl"):
        assert lines[name].startswith(f"{name}: not started (the 16s budget is spent at "), lines[name]
    assert _stage_lines((out / "summary.txt").read_text()) == lines


def test_check_prepare_size_check_is_one_line(tmp_path):
    script = os.path.join(REPO, "scripts", "gpu", "gpu_check_prepare.sh")
    if subprocess.run(["git", "-C", REPO, "rev-parse"], capture_output=True).returncode != 0:
        pytest.skip("SKIPPED, NOT PASSED: not a git checkout (the size check lists the tree with git)")
    r = subprocess.run(["bash", script, "--check-only"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, GPU_CHECK_MAX_MIB="0"))
    assert r.returncode == 1 and r.stdout == ""
    assert re.fullmatch(r"gpu_check_prepare: error: the device run would carry [\d.]+ MiB \(tree [\d.]+ \+ "
                        r"\.gpu_data [\d.]+\), over the 0 MiB limit\n", r.stderr), r.stderr
    r = subprocess.run(["bash", script, "--check-only"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, GPU_CHECK_MAX_MIB="100000"))
    assert r.returncode == 0 and r.stdout.startswith("gpu_check_prepare: ok: the device run carries"), r.stderr


def test_check_deadline_plugin_stops_pytest_and_keeps_the_junit_xml(tmp_path):
    (tmp_path / "test_two.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    xml = tmp_path / "r.xml"
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "scripts", "gpu"),
               GPU_CHECK_DEADLINE=str(time.time() - 1))
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "gpu_check_deadline", "-p", "no:cacheprovider",
                        f"--junitxml={xml}", str(tmp_path / "test_two.py")], capture_output=True, text=True,
                       timeout=120, env=env, cwd=str(tmp_path))
    assert "gpu_check deadline reached" in r.stdout, r.stdout
    assert xml.exists() and 'tests="0"' in xml.read_text()
    env["GPU_CHECK_DEADLINE"] = str(time.time() + 3600)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "gpu_check_deadline", "-p", "no:cacheprovider",
                        f"--junitxml={xml}", str(tmp_path / "test_two.py")], capture_output=True, text=True,
                       timeout=120, env=env, cwd=str(tmp_path))
    assert r.returncode == 0 and 'tests="2"' in xml.read_text(), r.stdout


def test_check_script_imports_from_a_checkout_where_pydtnn_is_not_installed(tmp_path):
    """On the device the project is not installed (the first run failed at import: `pydtnn.datasets` did not
    exist there). Here Python runs with -S (no site-packages: no editable install's finder), with this
    interpreter's site-packages on PYTHONPATH for numpy and the rest: every stage's imports must come from
    the checkout the script puts first on PYTHONPATH."""
    import site
    wrapper = tmp_path / "python-not-installed"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    wrapper.chmod(0o755)
    sitepkgs = os.pathsep.join(site.getsitepackages())
    r, out = _dry_run(tmp_path, PYTHON=str(wrapper), PYTHONPATH=sitepkgs)
    proof = subprocess.run([str(wrapper), "-c", "import pydtnn"], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=sitepkgs), cwd=str(tmp_path))
    assert proof.returncode != 0 and "No module named 'pydtnn'" in proof.stderr     # really not installed
    lines = _stage_lines(r.stdout)
    for name in ("versions", "bench", "mixed", "mnist", "resume", "nccl"):
        assert "imports from the checkout:" in lines[name], lines[name]
    assert "pydtnn.datasets, pydtnn.models" in lines["mnist"] and "bench_gpu" in lines["bench"]
