"""README.md stays true: every flag, model and layer is in it, and its commands are the ones CI runs."""
import os

from pydtnn.cli import build_parser
from pydtnn.models import list_models

from paths import REPO_DIR as REPO  # noqa: E402
README = open(os.path.join(REPO, "README.md")).read()


def test_every_flag_documented():
    parser = build_parser()
    flags = [a.option_strings[0] for a in parser._actions if a.option_strings and a.option_strings[0] != "-h"]
    missing = [f for f in flags if f"`{f}`" not in README]
    assert len(flags) > 60 and not missing, missing


def test_every_model_documented():
    missing = [m for m in list_models() if f"`{m}`" not in README]
    assert len(list_models()) >= 40 and not missing, missing


def test_every_layer_documented():
    import pydtnn.layers as layers
    names = [n for n in layers.__all__ if n != "Layer"]
    missing = [n for n in names if f"`{n}" not in README]
    assert len(names) == 26 and not missing, missing


def test_ci_runs_the_readme_commands():
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    commands = [l for l in README.split("```bash\n")[1:4]]
    setup, tests, openmpi = (c.split("\n```")[0].strip() for c in commands)
    assert 'pip install -e ".[mpich,test]"' in setup and setup.endswith("python scripts/pydtnn_benchmark.py")
    assert tests == "python -m pytest -q" and openmpi.endswith("python -m pytest -q -m mpi")
    lines = [l.strip() for l in ci.splitlines()]
    assert setup in lines and tests in lines and lines[-1] == openmpi


def test_no_file_reads_outside_the_repository():
    """A user's clone has no ../shared and none of our machines' paths: nothing tracked may name them."""
    import subprocess
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    if not files:                                   # not a git checkout (an sdist): walk the tree instead
        files = [os.path.relpath(os.path.join(d, f), REPO) for d, _, fs in os.walk(REPO) for f in fs
                 if ".venv" not in d and ".git" not in d]
    bad = []
    for name in files:
        path = os.path.join(REPO, name)
        if name.endswith((".gz", ".png", ".npz")) or name == "tests/launch/test_readme.py" or os.path.islink(path):
            continue        # a link (pydtnn/models -> ../models) names a folder of the repository
        text = open(path, errors="replace").read()
        for needle in ("../shared", "shared/datasets", "/work/", "/home/", "/root/"):
            if needle in text:
                bad.append(f"{name}: {needle}")
    assert not bad, bad


def test_the_flag_tables_defaults_are_the_parsers():
    import re
    rows = dict(re.findall(r"^\| `(--[a-z_0-9]+)` \| `([^`]*)` \|", README, re.M))
    wrong = [(a.option_strings[0], rows.get(a.option_strings[0]), a.default) for a in build_parser()._actions
             if a.option_strings and a.dest != "help" and rows.get(a.option_strings[0]) != str(a.default)]
    assert not wrong, wrong
