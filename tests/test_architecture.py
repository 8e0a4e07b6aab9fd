"""The layout stays as docs/architecture.md draws it: the import rules (the contracts in pyproject.toml, checked
by import-linter), no import cycle anywhere in pydtnn, and a map that names every package."""
import os
import re
import subprocess
import sys

import pytest

from paths import REPO_DIR as REPO

ARCHITECTURE = os.path.join(REPO, "docs", "architecture.md")


def test_import_contracts_hold():
    """Every contract of [tool.importlinter] in pyproject.toml: the stack (cli, sim/experiments, launch,
    training, parallel, model/observe, execution, layers/activations, backends), layers and backends below the
    loop and the launchers, model.py without the loop and checkpointing, training without the launchers,
    parallel without training and the launchers. Imports inside functions count."""
    lint = ("import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command(['--no-cache', 'pyproject.toml']))")
    # lint-imports puts its current folder first on sys.path: the checkout's pydtnn is the one analysed
    r = subprocess.run([sys.executable, "-c", lint], cwd=REPO, capture_output=True, text=True, timeout=300)
    report = r.stdout + r.stderr
    assert "Contracts:" in report, report                       # it ran (a bad config is an error, not a pass)
    assert r.returncode == 0, report[report.find("Contracts:"):]


def _import_cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (each holds at least one cycle), by Tarjan's
    algorithm, iterative so that a deep import chain cannot exhaust Python's stack."""
    modules = sorted(graph.modules)
    imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(imports[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(imports[child])))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_no_import_cycles():
    """No module of pydtnn reaches itself through imports, those inside functions included (grimp reads every
    import statement). import-linter's acyclic_siblings contract compares whole sibling packages, which would
    refuse layers <-> activations (a Layer uses make_activation, an activation is a Layer) where no module
    cycle exists; this checks modules."""
    import grimp
    graph = grimp.build_graph("pydtnn", cache_dir=None)     # the pydtnn these tests import
    cycles = _import_cycles(graph)
    report = ["a cycle through " + ", ".join(f"{a} -> {b}" for a in c
                                             for b in sorted(graph.find_modules_directly_imported_by(a)) if b in c)
              for c in cycles]
    assert len(graph.modules) > 100 and not cycles, "\n".join(report)


def test_the_cycle_finder_finds_cycles():
    class Graph:                                   # a -> b -> c -> a, c -> d, d -> e -> d, f alone
        edges = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["e"], "e": ["d"], "f": []}
        modules = set(edges)

        def find_modules_directly_imported_by(self, m):
            return set(self.edges[m])
    assert sorted(_import_cycles(Graph())) == [["a", "b", "c"], ["d", "e"]]


def test_the_map_names_every_package_and_top_level_module():
    """docs/architecture.md names every package of pydtnn and every module at its top, so a new one is drawn
    on the map in the change that adds it."""
    text = open(ARCHITECTURE).read()
    root = os.path.join(REPO, "pydtnn")
    names = []
    for entry in sorted(os.listdir(root)):
        path = os.path.join(root, entry)
        if os.path.isdir(path) and os.path.exists(os.path.join(path, "__init__.py")):
            names.append(f"pydtnn.{entry}")
        elif entry.endswith(".py") and entry != "__init__.py":
            names.append(f"pydtnn.{entry[:-3]}")
    missing = [n for n in names if not re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", text)]
    assert len(names) > 25 and not missing, missing


def test_the_maps_rules_are_the_contracts():
    """The stack drawn in docs/architecture.md is the `stack` contract's layer list, in the same order."""
    tomllib = pytest.importorskip("tomllib")              # Python 3.11+
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    stack = next(c for c in contracts if c["id"] == "stack")["layers"]
    text = open(ARCHITECTURE).read()
    drawn = re.search(r"```text\n(.*?)```", text, re.S).group(1)
    for upper, lower in zip(stack, stack[1:]):
        a = [drawn.find(m) for m in re.findall(r"pydtnn\.\w+", upper)]
        b = [drawn.find(m) for m in re.findall(r"pydtnn\.\w+", lower)]
        assert min(a) >= 0 and min(b) >= 0 and max(a) < min(b), (upper, lower)


# ------------------------------------------------------------------------------------ the map against the tree

def _packages(root):
    """Every package folder of pydtnn (its `__init__.py` present; the zoo and the datasets through their links),
    as the map names it ("pydtnn/parallel/balance/"), with its modules' file names."""
    out = {}
    for folder, dirs, files in os.walk(os.path.join(root, "pydtnn"), followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if "__init__.py" in files:
            rel = os.path.relpath(folder, root).replace(os.sep, "/") + "/"
            out[rel] = sorted(f for f in files if f.endswith(".py") and f != "__init__.py")
    return out


def _package_items(text):
    """{"pydtnn/x/": the text of its item} for each list item of the map that starts with a package's path."""
    items, current = {}, None
    for line in text.splitlines():
        m = re.match(r"- `(pydtnn/(?:\w+/)*)`", line)
        if m:
            current = m.group(1)
            items[current] = line
        elif current and line.startswith("  ") and line.strip():
            items[current] += " " + line.strip()
        else:
            current = None
    return items


def _defines(path, name):
    """Whether the module at `path` (a file, or a package's __init__.py) defines or imports `name` at its top."""
    source = open(path).read()
    return (re.search(rf"^(?:class|def)\s+{name}\b|^{name}\s*[:=]|^from\s+\S+\s+import\s+(?:.*|\([^)]*)\b{name}\b",
                      source, re.M) is not None
            or re.search(rf"__all__\s*=\s*\[[^\]]*[\"']{name}[\"']", source) is not None)   # a lazy name


def _module_file(root, dotted):
    """The file of a module or package `pydtnn.a.b`, or None."""
    base = os.path.join(root, *dotted.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.exists(candidate):
            return candidate
    return None


def map_problems(text, root):
    """What the map gets wrong against the tree at `root`: a package with no item listing its files, a module
    its package's item does not name, a file path or a dotted `pydtnn.` name the map names that does not exist."""
    problems = []
    items = _package_items(text)
    for package, modules in _packages(root).items():
        if package not in items:
            problems.append(f"no item lists the package {package}")
            continue
        problems += [f"{package}{m} is not named in its package's item" for m in modules
                     if f"`{m}`" not in items[package]]
    for path in sorted(set(re.findall(r"(?<![\w/.])((?:pydtnn|scripts|tests|docs|datasets|models)/[\w./-]*[\w/])",
                                      text))):
        if not os.path.exists(os.path.join(root, path)):
            problems.append(f"the path {path} does not exist")
    for dotted in sorted(set(re.findall(r"(?<![\w.])pydtnn(?:\.\w+)+", text))):
        parts = dotted.split(".")
        found = next((k for k in range(len(parts), 0, -1) if _module_file(root, ".".join(parts[:k]))), 0)
        rest = parts[found:]
        if not found or len(rest) > 2 or (rest and not _defines(_module_file(root, ".".join(parts[:found])), rest[0])):
            problems.append(f"the name {dotted} does not exist")
    return problems


def test_the_map_is_true_to_the_tree():
    """docs/architecture.md lists every module of every package in its package's item, and every path and
    `pydtnn.` name it names exists: a moved or new file fails here until the map follows."""
    problems = map_problems(open(ARCHITECTURE).read(), REPO)
    assert not problems, "\n".join(problems)


def test_the_map_check_finds_a_planted_wrong_path():
    text = open(ARCHITECTURE).read()
    planted = (text.replace("`epoch.py`", "`epochs.py`", 1)
               + "\nSee `pydtnn/training/nowhere.py`, `pydtnn.parallel.balance.NoSuchPolicy` and "
                 "`pydtnn.parallel.nothing`.\n")
    problems = map_problems(planted, REPO)
    assert "pydtnn/training/epoch.py is not named in its package's item" in problems, problems
    assert "the path pydtnn/training/nowhere.py does not exist" in problems, problems
    assert "the name pydtnn.parallel.balance.NoSuchPolicy does not exist" in problems, problems
    assert "the name pydtnn.parallel.nothing does not exist" in problems, problems
    assert map_problems(text.replace("- `pydtnn/observe/`", "- observe/"), REPO)[0] == \
        "no item lists the package pydtnn/observe/"


def test_the_stack_places_every_module_of_pydtnn():
    """Every top-level package and module of pydtnn stands on a level of the `stack` contract, so that every
    import between them is held to the stack's order."""
    tomllib = pytest.importorskip("tomllib")              # Python 3.11+
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    stack = next(c for c in contracts if c["id"] == "stack")["layers"]
    placed = set(re.findall(r"pydtnn\.(\w+)", " ".join(stack)))
    root = os.path.join(REPO, "pydtnn")
    real = {e[:-3] if e.endswith(".py") else e for e in os.listdir(root)
            if (e.endswith(".py") and e != "__init__.py")
            or os.path.exists(os.path.join(root, e, "__init__.py"))}
    assert real == placed, (sorted(real - placed), sorted(placed - real))
