"""A wheel and a bare checkout both import `pydtnn.models` and `pydtnn.datasets`.

models/ and datasets/ live at the top of the repository and pydtnn/models, pydtnn/datasets are links to them
(see pyproject.toml): a wheel must hold the files themselves, and neither way of running may need an install
of the checkout or leave a bare `models` or `datasets` package beside `pydtnn`."""
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import zipfile

from paths import REPO_DIR as REPO

# Imported in a fresh interpreter, from another folder; prints where each package came from.
PROBE = ("import pydtnn, pydtnn.models, pydtnn.datasets, pydtnn.layers; "
         "print(pydtnn.__file__); print(pydtnn.models.__file__); print(pydtnn.datasets.__file__); "
         "print(len(pydtnn.models.list_models())); print(pydtnn.datasets.load_dataset.__module__)")


def _probe(cwd, env, *flags):
    r = subprocess.run([sys.executable, *flags, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    pydtnn_file, models_file, datasets_file, nmodels, loader = r.stdout.split()
    return pydtnn_file, models_file, datasets_file, int(nmodels), loader


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(extra)
    return env


def _source_copy(dest):
    """What a clone holds for the build: the package (its links kept as links), the linked folders, the
    project file and the README it names; no build/ or egg-info left by an earlier build."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(os.path.join(REPO, "pydtnn"), dest / "pydtnn", symlinks=True, ignore=skip)
    for folder in ("models", "datasets"):
        shutil.copytree(os.path.join(REPO, folder), dest / folder, symlinks=True, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), dest / name)
    assert os.path.islink(dest / "pydtnn" / "models") and os.path.islink(dest / "pydtnn" / "datasets")


def test_a_wheel_holds_models_and_datasets_and_imports_them_from_its_install(tmp_path):
    src, wheels, target, elsewhere = (tmp_path / d for d in ("src", "wheels", "target", "elsewhere"))
    _source_copy(src)
    elsewhere.mkdir()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(src)],
                       capture_output=True, text=True, timeout=600)     # with build isolation, as a user builds
    assert r.returncode == 0, r.stdout + r.stderr
    [wheel] = list(wheels.glob("pydtnn-*.whl"))

    with zipfile.ZipFile(wheel) as z:
        infos = {i.filename: i for i in z.infolist()}
        links = [n for n, i in infos.items() if stat.S_ISLNK(i.external_attr >> 16)]
        assert not links, links
        for folder in ("models", "datasets"):
            expected = sorted(os.path.relpath(os.path.join(d, f), REPO).replace(os.sep, "/")
                              for d, _, fs in os.walk(os.path.join(REPO, folder)) if "__pycache__" not in d
                              for f in fs if f.endswith(".py"))
            held = sorted(n[len("pydtnn/"):] for n in infos if n.startswith(f"pydtnn/{folder}/") and n.endswith(".py"))
            assert held == expected, (folder, held, expected)
            for name in expected:                                # the files themselves, byte for byte
                assert z.read(f"pydtnn/{name}") == open(os.path.join(REPO, name), "rb").read(), name
        assert any(n.startswith("pydtnn/datasets/data/") and n.endswith(".txt") for n in infos)
        tops = {n.split("/")[0] for n in infos}
        assert not tops & {"models", "datasets"}, tops          # nothing bare beside pydtnn

    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target),
                        str(wheel)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not os.path.islink(target / "pydtnn" / "models") and not (target / "models").exists()
    # PYTHONPATH names only the install; numpy and the rest come from this interpreter's own site-packages
    pydtnn_file, models_file, datasets_file, nmodels, loader = _probe(elsewhere, _clean_env(PYTHONPATH=str(target)))
    for f in (pydtnn_file, models_file, datasets_file):
        assert f.startswith(str(target) + os.sep), f
    assert nmodels >= 40 and loader == "pydtnn.datasets"


def test_a_bare_checkout_on_pythonpath_imports_models_and_datasets(tmp_path):
    """No install of pydtnn is visible (`python -S`: no site-packages, so no editable install's finder); the
    checkout and the interpreter's site-packages (numpy and the rest, where pydtnn itself is not) are on
    PYTHONPATH, the checkout first; run from another folder."""
    purelib, platlib = sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]
    path = os.pathsep.join(dict.fromkeys([REPO, purelib, platlib]))
    pydtnn_file, models_file, datasets_file, nmodels, loader = _probe(tmp_path, _clean_env(PYTHONPATH=path), "-S")
    assert pydtnn_file == os.path.join(REPO, "pydtnn", "__init__.py")
    assert models_file == os.path.join(REPO, "pydtnn", "models", "__init__.py")
    assert datasets_file == os.path.join(REPO, "pydtnn", "datasets", "__init__.py")
    assert nmodels >= 40 and loader == "pydtnn.datasets"
