"""triton.jit and gluon.jit for this package's kernels: their row counts not specialized, and a stand-in where Triton
is missing (the modules still import, and their references run).

Triton builds a kernel once per specialization of its int arguments: divisible by 16 or not, equal to 1 or not. A
count of rows follows the request (Krea 2's text rows join the image's), so a prompt of another length would build
the step's kernels again, one after another inside the sampler (seconds). The arguments named in ROW_COUNTS are not
specialized, so one build serves every length; kernels only compare rows with them (masks, tile counts) or step over
them once, where the hint bought nothing."""
from __future__ import annotations

import inspect

try:
    import triton
except ImportError:
    triton = None
try:
    from triton.experimental import gluon
except ImportError:
    gluon = None

# rows, padded rows, the work counts derived from them, and the stride of the norms' [2, M] stats
ROW_COUNTS = ("M", "MP", "ITEMS", "whole", "parts", "stride_stats")


def _rows_unspecialized(jit):
    def decorate(fn):
        rows = [name for name in inspect.signature(fn).parameters if name in ROW_COUNTS]
        return jit(do_not_specialize=rows)(fn) if rows else jit(fn)
    return decorate


triton_jit = _rows_unspecialized(triton.jit) if triton is not None else (lambda fn: fn)
gluon_jit = _rows_unspecialized(gluon.jit) if gluon is not None else None


def triton_jit_unspecialized(*names: str):
    """triton_jit with the named int arguments not specialized either: sizes that follow the input (a decoder's
    resolution), where one build should serve every size."""
    if triton is None:
        return lambda fn: fn

    def decorate(fn):
        return triton.jit(do_not_specialize=[n for n in inspect.signature(fn).parameters
                                             if n in ROW_COUNTS or n in names])(fn)
    return decorate
