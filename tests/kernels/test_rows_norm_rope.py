"""kernels/rows_norm_rope.py against its reference (within one bf16 step: the kernel sums the squares in another
order) and the reference against dit_core's head_norm_rotary (the host block's math) bit for bit."""
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from conftest import assert_within_one_bf16_step

from dit_core.arch import Arch
from dit_core.block import head_norm_rotary
from dit_core.sequence import AxisAngles, Sequence
from kernels import Choices
from kernels.rows_norm_rope import reference, rows_norm_rope

# (M, heads, head, r, angles): odd M; every column turned, part, none; a head not a power of 2; angles shared ("row"),
# per head ("head"), or no rotary (None: cos/sin not given)
CASES = [(7, 2, 32, 16, "head"), (37, 3, 64, 8, "head"), (19, 4, 16, 8, "row"), (12, 3, 24, 12, "head"),
         (5, 2, 32, 0, None)]
NORMS = ["across", "head", None]
# the kernel's launches: rows walking the heads by whole heads, by rotary pairs, a row at once, its default (here a row
# at once: under Choices.rows_at_once_below rows)
LAUNCHES = {"blocked": {"choices": Choices(rows_in_pairs_from=None, rows_at_once_below=None)},
            "pairs": {"choices": Choices(rows_in_pairs_from=0, rows_at_once_below=None)},
            "row at once": {"row_at_once": True}, "default": {}}


def inputs(m, heads, head, r, angles, norm, seed, device, row_stride=0):
    """x [M, heads head] bf16 (row_stride: a view of wider rows), the gain for the norm, cos and sin."""
    g = torch.Generator().manual_seed(seed)
    wide = 3 * torch.randn(m, heads * head + row_stride, generator=g) * torch.exp(torch.randn(m, 1, generator=g))
    x = wide.to(device, torch.bfloat16)[:, :heads * head]
    gain = None if norm is None else (1 + 0.2 * torch.randn(heads * head if norm == "across" else head, generator=g))
    shape = (m, heads, r) if angles == "head" else (m, r)
    theta = 100 * torch.rand(shape, generator=g)
    cos, sin = (None, None) if angles is None else (theta.cos(), theta.sin())
    return x, *(None if t is None else t.to(device) for t in (gain, cos, sin))


@pytest.mark.parametrize("launch", LAUNCHES)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("m,heads,head,r,angles", CASES)
def test_kernel_matches_reference(m, heads, head, r, angles, norm, launch, device):
    """Rows in blocks walking the heads by rotary pairs or whole heads, or a row at once with its heads in one
    tile."""
    x, gain, cos, sin = inputs(m, heads, head, r, angles, norm, seed=m + head, device=device, row_stride=head)
    out = torch.full((m, heads, head), float("nan"), dtype=torch.bfloat16, device=device)
    got = rows_norm_rope(x, heads, head, gain, cos, sin, 1e-6, across=norm == "across", out=out, block_m=8,
                         **LAUNCHES[launch])
    assert got.data_ptr() == out.data_ptr() and not out.isnan().any()
    assert_within_one_bf16_step(got, reference(x, heads, head, gain, cos, sin, 1e-6, across=norm == "across"))


@pytest.mark.parametrize("norm", ["across", "head"])
@pytest.mark.parametrize("m,heads,head,r,angles", CASES)
def test_reference_is_the_host_block(m, heads, head, r, angles, norm):
    x, gain, cos, sin = inputs(m, heads, head, r, angles, norm, seed=m * head, device="cpu")
    seq = None if cos is None else Sequence(torch.zeros(m, dtype=torch.long), cos, sin)
    host = head_norm_rotary(x.float().view(m, heads, head), gain, SimpleNamespace(qk_eps=1e-6, qk_norm=norm), seq)
    assert torch.equal(reference(x, heads, head, gain, cos, sin, 1e-6, across=norm == "across"),
                       host.to(torch.bfloat16))


def by_axis(m, heads, r, shared, seed, device):
    """Angles by axis for m rows: tables of 3 axes (+ the zero row), each row's index on each axis, columns [heads, r]
    (shared: [r]); with the [M, heads, r] or [M, r] tables they stand for."""
    g = torch.Generator().manual_seed(seed)
    sizes, freqs = (3, 5, 2), 7
    theta = torch.cat([torch.zeros(1, freqs), 100 * torch.rand(sum(sizes), freqs, generator=g)])
    starts = torch.tensor([1, 1 + sizes[0], 1 + sizes[0] + sizes[1]])
    index = torch.cat([torch.stack([starts[d] + torch.randint(0, n, (m,), generator=g) for d, n in enumerate(sizes)],
                                   1), torch.zeros(m, 1, dtype=torch.long)], 1).to(torch.int32)
    shape = (r,) if shared else (heads, r)
    axis = torch.randint(0, 4, shape, generator=g).to(torch.int32)
    freq = torch.randint(0, freqs, shape, generator=g).to(torch.int32)
    tables = (theta.cos(), theta.sin())
    rows = [t[index.long()[:, axis.long()], freq.long()] for t in tables]
    return [t.to(device) for t in (*tables, index, axis, freq, *rows)]


@pytest.mark.parametrize("launch", LAUNCHES)
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("norm", ["across", None])
def test_angles_by_axis_are_the_tables_they_stand_for(norm, shared, launch, device):
    """cos/sin by axis (tables, each row's index, each column's axis and frequency: LTX-2.5's split rotary) give the
    kernel's output of the full tables bit for bit, and the reference's."""
    m, heads, head, r = 37, 3, 32, 16
    x, gain, _, _ = inputs(m, heads, head, r, "head", norm, seed=11, device=device)
    cos, sin, index, axis, freq, cos_rows, sin_rows = by_axis(m, heads, r, shared, seed=12, device=device)
    across, launch = norm == "across", {"block_m": 8, **LAUNCHES[launch]}
    got = rows_norm_rope(x, heads, head, gain, cos, sin, 1e-6, across=across, index=index, columns=(axis, freq),
                         **launch)
    assert torch.equal(got, rows_norm_rope(x, heads, head, gain, cos_rows, sin_rows, 1e-6, across=across, **launch))
    by_axis_reference = reference(x, heads, head, gain, cos, sin, 1e-6, across=across, index=index,
                                  columns=(axis, freq))
    assert torch.equal(by_axis_reference, reference(x, heads, head, gain, cos_rows, sin_rows, 1e-6, across=across))


def test_bad_arguments_raise():
    x, gain, cos, sin = inputs(4, 2, 32, 8, "head", "across", seed=0, device="cpu")
    for args, kw in (((x, 4, 32, gain, cos, sin), {}), ((x, 2, 32, gain, cos, sin), {"across": False}),
                     ((x, 2, 32, gain, cos[:, :1], sin[:, :1]), {"across": True}),
                     ((x, 2, 32, gain, cos.repeat(1, 1, 3), sin.repeat(1, 1, 3)), {"across": True}),
                     ((x, 2, 32, gain, cos, sin), {"across": True, "out": torch.empty(4, 2, 32)})):
        with pytest.raises(ValueError, match="rows_norm_rope"):
            rows_norm_rope(*args, **kw)
    cos, sin, index, axis, freq, _, _ = by_axis(4, 2, 8, False, seed=1, device="cpu")
    for kw in ({"index": index[:3], "columns": (axis, freq)}, {"index": index, "columns": (axis[:1], freq[:1])},
               {"index": index, "columns": (axis.repeat(1, 3), freq.repeat(1, 3))}):
        with pytest.raises(ValueError, match="rows_norm_rope: angles by axis"):
            rows_norm_rope(x, 2, 32, gain, cos, sin, across=True, **kw)
    assert rows_norm_rope(x[:0], 2, 32, gain, cos[:0], sin[:0], across=True).shape == (0, 2, 32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("launch", LAUNCHES)
@pytest.mark.parametrize("heads,head,r", [(32, 128, 64), (32, 64, 32), (32, 128, 32)])
def test_ltx25_shapes(heads, head, r, launch):
    """LTX-2.5's q/k rows at 1024^2-like row counts: video self-attention (32 x 128, every column turned), audio
    (32 x 64), the A<->V time rotary on the video heads (32 of 64 pairs): across-heads norm, per-head angles."""
    x, gain, cos, sin = inputs(6144, heads, head, r, "head", "across", seed=head + r, device="cuda")
    got = rows_norm_rope(x, heads, head, gain, cos, sin, 1e-6, across=True, **LAUNCHES[launch])
    assert_within_one_bf16_step(got, reference(x, heads, head, gain, cos, sin, 1e-6, across=True))


@pytest.mark.parametrize("angles", ["rows", "by axis"])
def test_ltx25_pieces_take_the_kernel(angles, monkeypatch):
    """dit_core/gpu/pieces.py's q/k rows through this kernel (the op table's capability check opened to the CPU: the
    interpreter runs it) against the reference a CPU runs otherwise: across-heads norm, per-head angles (every row's
    tables, or by axis as LTX-2.5's sequences hold them)."""
    import kernels
    from dit_core.gpu import pieces
    from dit_core.gpu.options import Options
    options = Options()
    a = Arch(family="ltx25", hidden=256, layers=1, refiner=0, heads=4, head=64, ffn=1024, latents=16, patch=(1,),
             text_dim=128, freq_dim=256, time_hidden=256, time_dim=256, eps=1e-6, qk_eps=1e-6, final_eps=1e-6,
             rope_axes=(64,), rope_theta=1e4, mlp="gelu_tanh", qk_norm="across")
    x, gain, cos, sin = inputs(21, 4, 64, 32, "head", "across", seed=5, device="cpu")
    seq = Sequence(torch.zeros(21, dtype=torch.long), cos, sin)
    if angles == "by axis":
        cos, sin, index, axis, freq, _, _ = by_axis(21, 4, 32, False, seed=6, device="cpu")
        seq = Sequence(seq.map, None, None, by_axis=AxisAngles(cos, sin, index, axis, freq))
    want = pieces._heads(a, x, gain, seq, options)
    monkeypatch.setitem(kernels.OPS, "rows_norm_rope", replace(kernels.OPS["rows_norm_rope"], capable=lambda d: None))
    got = pieces._heads(a, x, gain, seq, options)
    assert got.shape == want.shape == (1, 4, 21, 64) and got.transpose(1, 2).is_contiguous()
    assert_within_one_bf16_step(got, want)
