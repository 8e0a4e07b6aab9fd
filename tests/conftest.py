# pytest puts this folder (tests/) on sys.path, for tests/gpu_standin, tests/mpi_helpers and tests/paths in
# every test folder; pydtnn itself comes from the install or the checkout (`python -m pytest` adds the
# current folder), never from a path set here.
import pytest

from pydtnn.backends import available_backends


@pytest.fixture(params=available_backends() + ["gpu-standin"])
def backend_name(request):
    """Conformance tests run on every backend this machine has ("gpu" only where CuPy sees a device), and
    on "gpu-standin": the real GPU backend over the host stand-in of CuPy/cuDNN (tests/gpu_standin), a
    test of our GPU glue that runs anywhere, NOT a GPU verification. For it the fixture gives a float64
    GPUBackend object (Model accepts a backend object as well as a name)."""
    if request.param != "gpu-standin":
        yield request.param
        return
    import gpu_standin
    with gpu_standin.active():
        from pydtnn.backends.gpu.backend import GPUBackend
        yield GPUBackend(dtype="float64", seed=0)



_LAUNCHES = ("run_mpi(", "run_mpmd(", "mpi_command(")


def _launching_functions(module) -> set[str]:
    """Names of the module's functions whose source starts `mpiexec` (directly)."""
    import inspect
    names = set()
    for name, obj in vars(module).items():
        if inspect.isfunction(obj) and obj.__module__ == module.__name__:
            try:
                if any(l in inspect.getsource(obj) for l in _LAUNCHES):
                    names.add(name)
            except (OSError, TypeError):
                pass
    return names


def pytest_collection_modifyitems(config, items):
    """Every test that starts `mpiexec` (itself, or through a helper of its module) is an `mpi` test, so
    that CI's Open MPI pass (`-m mpi`) runs all of them, marked by hand or not."""
    import inspect
    launching = {}
    for item in items:
        fn, module = getattr(item, "function", None), getattr(item, "module", None)
        if fn is None or module is None or item.get_closest_marker("mpi"):
            continue
        if module.__name__ not in launching:
            launching[module.__name__] = _launching_functions(module)
        names = launching[module.__name__]
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):
            continue
        if fn.__name__ in names or any(f"{h}(" in source for h in names):
            item.add_marker(pytest.mark.mpi)


# --------------------------------------------------------------------------- the PyTorch oracle (optional)

# Tests marked `oracle` compare with PyTorch (torch==2.13.0, the `bench` extra: optional for users). Without
# torch they are skipped; where it must be there (CI sets this variable) its absence fails them instead, so
# that a "checked against PyTorch" claim is never a skipped test counted as passing.
REQUIRE_ORACLE_VAR = "PYDTNN_REQUIRE_TORCH_ORACLE"


_TORCH = []


def _torch_missing() -> bool:
    if not _TORCH:
        try:
            import torch  # noqa: F401
            _TORCH.append(False)
        except ImportError:
            _TORCH.append(True)
    return _TORCH[0]


def pytest_runtest_setup(item):
    if item.get_closest_marker("oracle") is not None and _torch_missing():
        import os
        if os.environ.get(REQUIRE_ORACLE_VAR) == "1":
            pytest.fail(f"PyTorch oracle test, and torch is not installed ({REQUIRE_ORACLE_VAR}=1): "
                        f"pip install torch==2.13.0", pytrace=False)
        pytest.skip("PyTorch oracle: pip install torch==2.13.0")


def pytest_terminal_summary(terminalreporter):
    """One line counting the PyTorch oracle tests of the run by outcome (CI reports it)."""
    counts = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            if "oracle" in getattr(report, "keywords", {}) and (report.when == "call" or outcome != "passed"):
                counts[outcome] = counts.get(outcome, 0) + 1
    if counts:
        terminalreporter.write_line("PyTorch oracle tests: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
