"""The PyTorch oracle tests (marked `oracle`): skipped without torch, a failure where CI requires them, and
counted in one line at the end of the run; CI installs torch and requires them."""
import os
import subprocess
import sys

from paths import REPO, REPO_DIR

ONE_ORACLE_TEST = "tests/layers/test_losses_metrics.py::test_cce_per_token_matches_torch"


def _pytest(tmp_path, require):
    stub = tmp_path / "torch"                  # a torch that cannot be imported: as if not installed
    stub.mkdir(exist_ok=True)
    (stub / "__init__.py").write_text("raise ImportError('no torch here')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO_DIR)]))
    env.pop("PYDTNN_REQUIRE_TORCH_ORACLE", None)
    if require:
        env["PYDTNN_REQUIRE_TORCH_ORACLE"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", ONE_ORACLE_TEST],
                          capture_output=True, text=True, timeout=300, cwd=str(REPO_DIR), env=env)


def test_without_torch_an_oracle_test_is_skipped_or_fails_where_required(tmp_path):
    r = _pytest(tmp_path, require=False)
    assert r.returncode == 0 and "1 skipped" in r.stdout and "PyTorch oracle tests: 1 skipped" in r.stdout, r.stdout
    r = _pytest(tmp_path, require=True)
    assert r.returncode == 1 and "1 error" in r.stdout and "PyTorch oracle tests: 1 error" in r.stdout, r.stdout
    assert "torch is not installed (PYDTNN_REQUIRE_TORCH_ORACLE=1)" in r.stdout, r.stdout


def test_ci_installs_the_oracle_and_requires_it():
    script = (REPO / ".ci" / "run").read_text()
    lines = [line.split("#")[0].strip() for line in script.splitlines()]
    install = lines.index('pip install "torch==2.13.0"')
    require = lines.index("export PYDTNN_REQUIRE_TORCH_ORACLE=1")
    assert install < require < lines.index("python -m pytest -q") < lines.index("unset PYDTNN_REQUIRE_TORCH_ORACLE")
