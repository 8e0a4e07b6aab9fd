"""The README and the docs/ pages it links stay true: every flag (with its default), model and layer is on its
page, the README's commands are the ones CI runs, its links resolve, and the Python API example runs."""
import os
import re
import subprocess
import sys

from pydtnn.cli import build_parser
from pydtnn.models import list_models

from paths import REPO_DIR as REPO  # noqa: E402


def _read(*parts):
    return open(os.path.join(REPO, *parts)).read()


README = _read("README.md")
FLAGS = _read("docs", "flags.md")                        # the flag tables
LAYERS_AND_MODELS = _read("docs", "layers_and_models.md")
PYTHON_API = _read("docs", "python_api.md")


def test_every_flag_documented():
    parser = build_parser()
    flags = [a.option_strings[0] for a in parser._actions if a.option_strings and a.option_strings[0] != "-h"]
    missing = [f for f in flags if f"`{f}`" not in FLAGS]
    assert len(flags) > 60 and not missing, missing


def test_every_model_documented():
    missing = [m for m in list_models() if f"`{m}`" not in LAYERS_AND_MODELS]
    assert len(list_models()) >= 40 and not missing, missing


def test_every_layer_documented():
    import pydtnn.layers as layers
    names = [n for n in layers.__all__ if n != "Layer"]
    missing = [n for n in names if f"`{n}" not in LAYERS_AND_MODELS]
    assert len(names) == 26 and not missing, missing


def test_ci_runs_the_readme_commands():
    ci = _read(".ci", "run")
    commands = [l for l in README.split("```bash\n")[1:4]]
    setup, tests, openmpi = (c.split("\n```")[0].strip() for c in commands)
    assert 'pip install -e ".[mpich,test]"' in setup and setup.endswith("python scripts/pydtnn_benchmark.py")
    assert tests == "python -m pytest -q" and openmpi.endswith("python -m pytest -q -m mpi")
    lines = [l.strip() for l in ci.splitlines()]
    assert setup in lines and tests in lines and lines[-1] == openmpi


def test_no_file_reads_outside_the_repository():
    """A user's clone has no ../shared and none of our machines' paths: nothing tracked may name them."""
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
    rows = dict(re.findall(r"^\| `(--[a-z_0-9]+)` \| `([^`]*)` \|", FLAGS, re.M))
    wrong = [(a.option_strings[0], rows.get(a.option_strings[0]), a.default) for a in build_parser()._actions
             if a.option_strings and a.dest != "help" and rows.get(a.option_strings[0]) != str(a.default)]
    assert not wrong, wrong


def test_every_link_of_the_readme_and_docs_resolves_and_every_page_is_linked():
    """Relative links (and their #anchors) of README.md and docs/*.md name files and headings that exist, and
    the README links every page of docs/, so nothing moved out of it is lost."""
    pages = {"README.md": README}
    pages.update({f"docs/{n}": _read("docs", n) for n in sorted(os.listdir(os.path.join(REPO, "docs")))
                  if n.endswith(".md")})

    def anchors(text):                              # GitHub's heading ids
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", text, re.M)}
    broken = []
    for name, text in pages.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue                            # https: and the like
            path, _, anchor = target.partition("#")
            where = os.path.normpath(os.path.join(os.path.dirname(name), path)) if path else name
            if where not in pages and not os.path.exists(os.path.join(REPO, where)):
                broken.append(f"{name}: {target}")
            elif anchor and where in pages and anchor not in anchors(pages[where]):
                broken.append(f"{name}: {target} (no such heading)")
    unlinked = [n for n in pages if n.startswith("docs/") and f"]({n}" not in README]
    assert not broken and not unlinked, (broken, unlinked)


def test_the_python_api_example_runs(tmp_path):
    """docs/python_api.md's first example, as a user pastes it: builds, summarizes, trains, predicts."""
    code = re.search(r"```python\n(.*?)```", PYTHON_API, re.S).group(1)
    assert "model.fit(" in code and "model.forward(" in code
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Total parameters" in r.stdout, r.stdout


# the words of how one particular machine was obtained and run (grep -rniwE of issue 45: whole words, any case)
MACHINE_WORDS = re.compile(r"(?<!\w)(sessions?|workplace|lent|lend|lending|timeout_s|gpu_data)(?!\w)", re.I)


def test_the_repository_speaks_to_its_users_not_of_a_machine_it_was_run_on():
    """`grep -rniwE "sessions?|workplace|lent|lend|lending|timeout_s|gpu_data" README.md docs scripts pydtnn`
    finds nothing in the tracked files: the docs, scripts and docstrings speak to whoever runs them, and a time
    limit or a folder of wheels is a knob, not a story of how a device was obtained."""
    assert MACHINE_WORDS.search("one device Session") and MACHINE_WORDS.search("x = TIMEOUT_S")
    assert not MACHINE_WORDS.search("pytest_sessionstart, lentil, relentless, .gpu_database")
    roots = ["README.md", "docs", "scripts", "pydtnn"]
    files = subprocess.run(["git", "ls-files", *roots], cwd=REPO, capture_output=True, text=True).stdout.split()
    if not files:                                   # not a git checkout (an sdist): walk the tree instead
        files = ["README.md"] + [os.path.relpath(os.path.join(d, f), REPO) for root in roots[1:]
                                 for d, _, fs in os.walk(os.path.join(REPO, root)) for f in fs
                                 if "__pycache__" not in d]
    hits = []
    for name in files:
        path = os.path.join(REPO, name)
        if name.endswith((".gz", ".png", ".npz")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        for number, line in enumerate(open(path, errors="replace"), 1):
            if MACHINE_WORDS.search(line):
                hits.append(f"{name}:{number}: {line.strip()[:120]}")
    assert len(files) > 100 and not hits, hits
