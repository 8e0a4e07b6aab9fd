"""Where the tests find the repository and their own shared files (tests/ is on sys.path: its conftest.py)."""
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
REPO_DIR, TESTS_DIR = str(REPO), str(TESTS)


def sibling(folder: str, name: str):
    """A test module of another test folder, for the cases and helpers it shares, imported under its own
    name (as pytest imports it: its folder on sys.path), so both see the same module object."""
    import importlib
    import sys
    where = str(TESTS / folder)
    if where not in sys.path:
        sys.path.insert(0, where)
    return importlib.import_module(name)
