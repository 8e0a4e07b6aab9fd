"""README.md stays true: every flag, model and layer is in it, and its commands are the ones CI runs."""
import os

from pydtnn.cli import build_parser
from pydtnn.models import list_models

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    assert len(names) == 15 and not missing, missing


def test_ci_runs_the_readme_test_command():
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    assert "python -m pytest -q" in README and ci.strip().endswith("python -m pytest -q")
    assert 'pip install -e ".[test]"' in README and '-e ".[test]"' in ci
