"""kernels/jit.py: every kernel of the package that takes a count of rows is keyed the same at any count, so a prompt
of another length launches the kernels built for the last one. On the CPU: the key Triton's CUDA back end would
give each argument; on a GPU, tests/dit_core/test_builds.py counts the builds of a block at new row counts."""
from __future__ import annotations

import importlib
import pkgutil

import pytest

import kernels
from kernels.jit import ROW_COUNTS

triton = pytest.importorskip("triton")


def jitted_functions():
    for info in pkgutil.walk_packages(kernels.__path__, "kernels."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if hasattr(value, "run") and getattr(getattr(value, "fn", None), "__module__", None) == info.name:
                yield f"{info.name}.{name}", value


def unspecialized(fn) -> set[str]:
    """The arguments Triton leaves unspecialized: JITFunction's params, or the interpreter's recorded keywords."""
    if hasattr(fn, "params"):
        return {p.name for p in fn.params if p.do_not_specialize}
    return set(fn.kwargs.get("do_not_specialize") or ())


def test_every_row_count_argument_is_unspecialized():
    seen = 0
    for name, fn in jitted_functions():
        rows = {p for p in fn.arg_names if p in ROW_COUNTS}
        assert rows <= unspecialized(fn), f"{name}: {sorted(rows - unspecialized(fn))} specialized"
        seen += bool(rows)
    assert seen >= 25  # kernels and the device functions they hand M to


def test_two_row_counts_get_the_same_key():
    """What the CUDA back end keys an int on: divisible by 16 or not, 1 or not; unspecialized, the same."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    key = lambda value, specialize: native_specialize_impl(CUDABackend, value, False, specialize, True)  # noqa: E731
    assert key(4173, True) != key(4176, True) != key(1, True)
    assert key(4173, False) == key(4176, False) == key(1, False)
