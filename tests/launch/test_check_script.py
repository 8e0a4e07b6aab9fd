"""Tests of the GPU check SCRIPT itself (scripts/gpu_check.sh; its helpers in scripts/gpu/: the wheel packer
gpu_check_prepare.sh, the pytest deadline plugin, the benchmarks' time limit) on a machine without a GPU: its
dry run, stage order and limits, summary lines, what it leaves in $OUT, its total limit, stages stopped at their
limit (not failed), its verdict, a copy of the checkout that lost its links, the size check and the deadline
plugin. They test the script's own logic, NOT the GPU: no stage's GPU work runs here (each says so)."""
import os
import re
import subprocess
import sys
import time

import pytest

from paths import REPO_DIR as REPO  # noqa: E402
SCRIPT = os.path.join(REPO, "scripts", "gpu_check.sh")
STAGES = ["versions", "decisive", "conformance", "bench", "loop", "mixed", "mnist", "resume", "nccl"]
ALLOWED = {"summary.txt", "gpu_check.log", "conformance.xml", "bench.jsonl", "histories.json"}

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bash scripts")


def _run(tmp_path, *args, script=SCRIPT, rc=0, **env):
    out = tmp_path / "out"
    full_env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    full_env.update({k: str(v) for k, v in env.items()})
    r = subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=600, env=full_env)
    assert r.returncode == rc, r.stdout + r.stderr
    return r, out


def _dry_run(tmp_path, **env):
    return _run(tmp_path, "--dry-run", **env)


def _stage_lines(text):
    return {m.group(1): m.group(0) for m in re.finditer(r"^(%s): .*$" % "|".join(STAGES), text, re.M)}


def test_check_script_dry_run_order_limits_summary_and_out_files(tmp_path):
    r, out = _dry_run(tmp_path)
    header = r.stdout.splitlines()[0]
    assert "DRY RUN" in header
    limits = re.search(r"stage limits \((\d+)s\):(.*)$", header)
    pairs = [p.split("=") for p in limits.group(2).split()]
    assert [name for name, _ in pairs] == STAGES                   # the decisive stages first
    assert sum(int(v) for _, v in pairs) == int(limits.group(1))
    total = int(re.search(r"total limit (\d+)s", header).group(1))
    # about 6 minutes, as docs/gpu.md says (test_the_docs_state_the_scripts_stages_and_limits)
    assert 300 <= int(limits.group(1)) <= 350 and int(limits.group(1)) <= total <= 360
    lines = _stage_lines(r.stdout)
    assert list(lines) == STAGES, r.stdout                          # one line per stage, on the console
    for name, line in lines.items():
        assert line.startswith(f"{name}: dry run ok (its GPU work skipped: no GPU)"), line
    collected = re.search(r"would run (\d+) tests, of which (\d+) stand-in ones", lines["conformance"])
    assert int(collected.group(1)) > 50 and int(collected.group(2)) == 0
    decisive = re.search(r"would run (\d+) tests, of which (\d+) stand-in ones", lines["decisive"])
    assert int(decisive.group(1)) >= 3 and int(decisive.group(2)) == 0   # each decisive test found, none twice
    assert int(collected.group(1)) + int(decisive.group(1)) == _collected_gpu_tests()
    summary = (out / "summary.txt").read_text()
    assert list(_stage_lines(summary)) == STAGES and summary.splitlines()[0] == header
    entries = list(out.iterdir())
    assert {p.name for p in entries} <= ALLOWED and len(entries) <= 5 and all(p.is_file() for p in entries)
    assert re.search(r"^total: \d+s; 2 file\(s\) in \$OUT: gpu_check.log summary.txt$", r.stdout, re.M)
    assert "=== conformance (limit 50s" in (out / "gpu_check.log").read_text()
    assert r.stdout.splitlines()[-1] == summary.splitlines()[-1] == "check passed: no stage failed"


def test_check_script_stage_timeout_and_spent_total_limit(tmp_path):
    """A stage past its limit is stopped there and says so (not a failure); stages that would start with
    under 10 s of the total limit left say they did not start; the header's stage limits follow the knobs and
    sum to its total. Controlled delays: mixed sleeps 3 s against a 1 s limit, mnist 11 s. With a total of 22 s,
    the stages before mnist (versions, bench, loop, mixed: at least mixed's 1 s) may take 1 to 11 s: mnist starts
    (under 12 s spent), is not stopped (11 s of its limit), and spends the total before resume (over 12 s)."""
    r, out = _dry_run(tmp_path, GPU_CHECK_TOTAL_LIMIT=22, GPU_CHECK_SKIP="decisive conformance",
                      GPU_CHECK_LIMIT_mixed=1, GPU_CHECK_DRY_SLEEP="mixed=3 mnist=11")
    limits = re.search(r"total limit 22s; stage limits \((\d+)s\):(.*)$", r.stdout.splitlines()[0])
    pairs = dict(p.split("=") for p in limits.group(2).split())
    assert pairs["mixed"] == "1" and sum(map(int, pairs.values())) == int(limits.group(1))
    lines = _stage_lines(r.stdout)
    assert list(lines) == STAGES
    assert lines["conformance"] == "conformance: skipped (GPU_CHECK_ONLY / GPU_CHECK_SKIP)"
    assert lines["mixed"].startswith("mixed: stopped at its 1s limit (by timeout)")
    assert lines["mnist"].startswith("mnist: dry run ok")
    for name in ("resume", "nccl"):
        assert lines[name].startswith(f"{name}: not started (the check's 22s total limit is spent at "), lines[name]
    assert _stage_lines((out / "summary.txt").read_text()) == lines
    assert r.stdout.splitlines()[-1] == "check incomplete: no stage failed; stopped at its limit: mixed; " \
                                        "not started: resume nccl"


def test_check_script_pytest_stage_stopped_at_its_deadline_and_a_failure(tmp_path):
    """The decisive stage for real (not a dry run) on this machine without a GPU. With a 40 s limit and its
    pytest deadline 40 s before the end (GPU_CHECK_DEADLINE_MARGIN), the deadline is reached before the first
    test, however long pytest takes to start (under 40 s): the stage ends by itself, keeps
    its JUnit XML and reports "stopped at its limit", and the check is incomplete, not failed. With its
    default limit its tests run and skip (no GPU): a decisive test that skips has shown nothing, so the stage
    fails, with its last lines, and the check fails with exit status 1."""
    r, out = _run(tmp_path, GPU_CHECK_ONLY="decisive", GPU_CHECK_LIMIT_decisive=40, GPU_CHECK_DEADLINE_MARGIN=40)
    line = _stage_lines(r.stdout)["decisive"]
    assert line.startswith("decisive: stopped at its 40s limit in ") and line.endswith("(of 0 run)"), line
    assert re.search(r"^    \| STOPPED: the stage's deadline: \d+ test\(s\) not run$", r.stdout, re.M), r.stdout
    assert '<testsuite name="decisive"' in (out / "conformance.xml").read_text()
    assert r.stdout.splitlines()[-1] == "check incomplete: no stage failed; stopped at its limit: decisive"
    r, out = _run(tmp_path, rc=1, GPU_CHECK_ONLY="decisive")
    line = _stage_lines(r.stdout)["decisive"]
    assert re.match(r"decisive: FAILED \(rc=1\) in \d+s \(at \d+s\): 0 passed, 0 failed, 0 errors, "
                    r"(\d+) skipped \(of \1 run\)$", line), line
    assert "decisive test(s) skipped: is the GPU backend usable here?" in r.stdout
    assert r.stdout.splitlines()[-1] == "check FAILED: decisive"


def test_check_prepare_size_check_is_one_line(tmp_path):
    script = os.path.join(REPO, "scripts", "gpu", "gpu_check_prepare.sh")
    if subprocess.run(["git", "-C", REPO, "rev-parse"], capture_output=True).returncode != 0:
        pytest.skip("SKIPPED, NOT PASSED: not a git checkout (the size check lists the tree with git)")
    r = subprocess.run(["bash", script, "--check-only"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, GPU_CHECK_MAX_MIB="0"))
    assert r.returncode == 1 and r.stdout == ""
    assert re.fullmatch(r"gpu_check_prepare: error: the copy for the GPU machine would be [\d.]+ MiB \(tree [\d.]+ "
                        r"\+ \.wheels [\d.]+\), over the 0 MiB limit \(GPU_CHECK_MAX_MIB\)\n", r.stderr), r.stderr
    r = subprocess.run(["bash", script, "--check-only"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, GPU_CHECK_MAX_MIB="100000"))
    assert r.returncode == 0 and r.stdout.startswith("gpu_check_prepare: ok: the copy for the GPU machine is"), \
        r.stderr


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
    """The check runs from a checkout that is not installed (a GPU machine's first run failed at import once:
    `pydtnn.datasets` did not exist there). Here Python runs with -S (no site-packages: no editable install's
    finder), with this interpreter's site-packages on PYTHONPATH for numpy and the rest: every stage's imports
    must come from the checkout the script puts first on PYTHONPATH."""
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


def _collected_gpu_tests():
    """How many tests the device selection of the check (before the decisive ones were split off) collects."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-k",
                        "gpu and not standin and not glue", "--deselect",
                        "tests/backends/test_gpu_backend.py::test_nccl_comm_single_rank[gpu]", "--ignore",
                        "tests/backends/test_gpu_extras.py", "tests/backends/test_gpu_backend.py", "tests"],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    return sum("::" in line for line in r.stdout.splitlines())


def test_check_script_runs_from_a_copy_that_lost_its_links(tmp_path):
    """A bare copy of the checkout (its files, without ignored ones), where pydtnn is not installed and the
    links pydtnn/models -> ../models and pydtnn/datasets -> ../datasets were lost: one is missing, the other
    a text file naming its target (as git writes links where they are off). The dry run restores both, says
    so under its header, and passes, every import from the copy."""
    import shutil
    import site
    listed = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("SKIPPED, NOT PASSED: not a git checkout (the copy is made from git's list of files)")
    copy = tmp_path / "copy"
    for name in listed.stdout.split("\0"):
        src = os.path.join(REPO, name)
        if not name or name in ("pydtnn/models", "pydtnn/datasets") or not os.path.lexists(src):
            continue
        dst = copy / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)
    (copy / "pydtnn" / "datasets").write_text("../datasets")
    wrapper = tmp_path / "python-not-installed"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    wrapper.chmod(0o755)
    r, out = _run(tmp_path, "--dry-run", script=str(copy / "scripts" / "gpu_check.sh"), PYTHON=str(wrapper),
                  PYTHONPATH=os.pathsep.join(site.getsitepackages()), GPU_CHECK_SKIP="conformance")
    assert r.stdout.splitlines()[1] == \
        "checkout: restored the link(s) pydtnn/models -> ../models pydtnn/datasets -> ../datasets", r.stdout
    for name in ("models", "datasets"):
        assert os.readlink(copy / "pydtnn" / name) == f"../{name}"
    lines = _stage_lines(r.stdout)
    assert "imports from the checkout:" in lines["mnist"] and "pydtnn.datasets, pydtnn.models" in lines["mnist"]
    assert lines["decisive"].startswith("decisive: dry run ok") and "would run" in lines["decisive"]
    assert r.stdout.splitlines()[-1] == "check passed: no stage failed"


def _helper(monkeypatch, name):
    import importlib
    monkeypatch.syspath_prepend(os.path.join(REPO, "scripts", "gpu"))
    return importlib.import_module(name)


def test_a_benchmark_checks_its_limit_before_each_row_and_each_round(monkeypatch, capsys, tmp_path):
    """bench_gpu.py under --max_seconds: a row starts only if the longest earlier row of its model (of any
    model before its first) fits in what is left; a row not started is a "skipped" row and is named in the
    closing STOPPED line. Rows of 0.5 s under a 1.3 s limit: two start (at 0 and 0.5 s: 1.3 and 0.8 s left),
    the others do not (0.3 s left). Within a row, a round after the first starts only if the longest round
    so far fits: rounds of 0.3 s (two frameworks, 0.15 s each) under 0.75 s: two. A second run seeded with
    the first's rows (--estimates_from) knows before its first row that a 0.5 s row does not fit in 0.3 s."""
    import types
    bench_gpu, time_limit = _helper(monkeypatch, "bench_gpu"), _helper(monkeypatch, "time_limit")

    def measure(name, precision):
        time.sleep(0.5)
        return {"model": name, "precision": precision, "ours_ms": 1.0, "ours_first_step_s": 0.1}
    limit = time_limit.TimeLimit(1.3)
    jsonl = tmp_path / "rows.jsonl"
    rows = bench_gpu.run_rows(["resnet50_imagenet", "vgg16_imagenet"], ["tf32", "fp32"], measure, limit, jsonl)
    assert [("skipped" in r) for r in rows] == [False, False, True, True]
    assert rows[2] == {"model": "vgg16_imagenet", "precision": "tf32", "skipped": "time limit (--max_seconds)"}
    assert limit.stopped_line() == "STOPPED: at its 1.3 s limit (--max_seconds), not run: tf32 vgg16_imagenet; " \
                                   "fp32 vgg16_imagenet"
    assert "# fp32 vgg16_imagenet: time limit (--max_seconds)" in capsys.readouterr().err
    assert len(jsonl.read_text().splitlines()) == 4 and rows[0]["row_s"] >= 0.5
    seeded = time_limit.TimeLimit(0.3)
    bench_gpu.seed_row_estimates(seeded, jsonl)
    rows = bench_gpu.run_rows(["resnet50_imagenet"], ["fp32_strict"], measure, seeded)
    assert rows == [{"model": "resnet50_imagenet", "precision": "fp32_strict",
                     "skipped": "time limit (--max_seconds)"}]

    limit = time_limit.TimeLimit(0.75)
    args = types.SimpleNamespace(rounds=5, block=1)
    steps = {"ours": lambda: time.sleep(0.15), "torch": lambda: time.sleep(0.15)}
    times = bench_gpu.alternate_blocks(steps, {"ours": lambda: None, "torch": lambda: None}, args, limit, "round")
    assert [len(t) for t in times.values()] == [2, 2]
    assert time_limit.TimeLimit().stopped_line() is None               # no limit: nothing stopped


def test_a_run_stopped_at_the_limit_is_not_a_failure(monkeypatch):
    """fpm_device_check.py under --max_seconds: a run still going at the limit is stopped and noted (None, not
    an exception); the next one, whose estimate no longer fits, does not start. A run past its own --timeout
    with the limit still far is a hang: that raises."""
    import types
    fpm, time_limit = _helper(monkeypatch, "fpm_device_check"), _helper(monkeypatch, "time_limit")
    limit = time_limit.TimeLimit(0.5)
    a = types.SimpleNamespace(timeout=400)
    assert fpm.run_within(a, limit, "fpm", ["sleep", "5"]) is None
    assert fpm.run_within(a, limit, "probe", ["true"]) is None
    assert limit.not_done == ["fpm: stopped at the limit", "probe: not started"]
    with pytest.raises(subprocess.TimeoutExpired):
        fpm.run_within(types.SimpleNamespace(timeout=0.2), time_limit.TimeLimit(60), "dynamic", ["sleep", "5"])


def test_the_docs_state_the_scripts_stages_and_limits():
    """docs/gpu.md's table of stages names the script's stages in its order with its default limits, and says
    how long the whole check takes: their sum, in minutes."""
    script = open(SCRIPT).read()
    stages = re.search(r"^STAGES=\((.*)\)$", script, re.M).group(1).split()
    defaults = [tuple(s.split(":")) for s in stages]
    doc = open(os.path.join(REPO, "docs", "gpu.md")).read()
    table = re.findall(r"^\| (\w+) \| (\d+) s \|", doc, re.M)
    assert table == defaults and [name for name, _ in defaults] == STAGES
    total = sum(int(v) for _, v in defaults)
    assert f"{total} s of stage limits" in doc and f"about {round(total / 60)} minutes" in doc
