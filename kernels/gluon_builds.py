"""Gluon launches whose build this Triton may refuse: Gluon's API moves between releases, so a Hopper kernel's build
error is reported for its caller to fall back on (its Triton or PyTorch kernel), while a launch's own error raises."""
from __future__ import annotations

from collections.abc import Callable

try:
    import triton
    BUILD_ERRORS = (triton.compiler.errors.CompilationError, triton.runtime.errors.OutOfResources, TypeError,
                    AttributeError, RuntimeError)
except ImportError:  # torch without Triton: no Gluon kernel is ever launched
    triton, BUILD_ERRORS = None, ()


def build_failure(launch: Callable[[], object]) -> str | None:
    """None once launch() ran; else why its kernel could not be built ("Triton <version>: <error>: <its last line>"),
    nothing having run. A RuntimeError counts only from the compiler's pass manager."""
    try:
        launch()
    except BUILD_ERRORS as e:
        if isinstance(e, RuntimeError) and "PassManager" not in str(e):
            raise  # a launch's own error, not a build's
        return f"Triton {triton.__version__}: {type(e).__name__}: {(str(e).strip() or '-').splitlines()[-1]}"
    return None
