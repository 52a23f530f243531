"""kernels/gluon_builds.py: a build error becomes the reason a caller falls back; a launch's own error raises."""
import pytest

triton = pytest.importorskip("triton")
from kernels.gluon_builds import build_failure  # noqa: E402


def raising(error):
    def launch():
        raise error
    return launch


def test_a_launch_that_ran_has_no_failure():
    ran = []
    assert build_failure(lambda: ran.append(1)) is None and ran == [1]


@pytest.mark.parametrize("error, name", [
    (triton.runtime.errors.OutOfResources(300000, 232448, "shared memory"), "OutOfResources"),
    (AttributeError("module has no attribute 'async_load'"), "AttributeError"),
    (RuntimeError("PassManager::run failed"), "RuntimeError"),
])
def test_build_errors_become_the_reason(error, name):
    why = build_failure(raising(error))
    assert why.startswith(f"Triton {triton.__version__}: {name}: ") and why.endswith(str(error).splitlines()[-1])


def test_a_launch_s_own_runtime_error_raises():
    with pytest.raises(RuntimeError, match="CUDA error"):
        build_failure(raising(RuntimeError("CUDA error: an illegal memory access was encountered")))
