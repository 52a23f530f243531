"""LTX-2.5's guide attention bias by query group (ltx25_positions.guide_bias, block.GroupBias): the same attention as
the dense [rows, rows] bias on the host (f32), in the sequence-parallel ranks' row order, and on the GPU piece; and
a step of ~20k rows makes no [rows, rows] tensor."""
import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file
from torch.utils._python_dispatch import TorchDispatchMode

from dit_core.arch import Arch
from dit_core.block import Attention, GroupBias, attend, attention
from dit_core.families.ltx25_positions import Grid, Guide, guide_attention_bias, guide_bias
from dit_core.parallel.shards import Ranks, SequenceShards
from dit_core.sequence import Sequence
from dit_core.weights import Linear

# two guides of different strengths, one at strength 1 (its group needs no mask), one at 0 (float32's lowest)
GRID = Grid(3, 2, 3, 24.0, (Guide(0, 1, 0.5), Guide(8, 9, 0.25), Guide(16, 17, 1.0), Guide(24, 25, 0.0)))


def qkv(rows: int, heads: int = 2, head: int = 8, seed: int = 0):
    return torch.randn(3, rows, heads, head, generator=torch.Generator().manual_seed(seed))


def test_groups_hold_the_dense_bias():
    bias, dense = guide_bias(GRID), guide_attention_bias(GRID)
    assert isinstance(bias, GroupBias) and dense.shape == (GRID.rows, GRID.rows)
    assert bias.keys.shape == (5, GRID.rows) and bias.plain == (False, False, False, True, False)
    assert bias.numel() == 5 * GRID.rows and torch.equal(bias.dense(), dense)
    assert guide_bias(Grid(2, 1, 2, 24.0, (Guide(0, 1, 1.0), Guide(8, 9, 1.0)))) is None
    assert guide_bias(Grid(2, 1, 2, 24.0)) is None


@pytest.mark.parametrize("grid", [GRID, Grid(4, 5, 5, 24.0, (Guide(0, 1, 0.5), Guide(24, 25, 0.25)))],
                         ids=["tiny", "100"])
def test_host_attention_equals_the_dense_bias(grid):
    """block.attention with the GroupBias against the dense bias, f32: <= 1e-6 relative (bit for bit at 100 rows
    and up: each group's SDPA sees the rows and mask layout the dense one does)."""
    q, k, v = qkv(grid.rows)
    bias, dense = guide_bias(grid), guide_attention_bias(grid)
    want, got = attention(q, k, v, 0, dense), attention(q, k, v, 0, bias)
    assert rel_err(got, want) <= 1e-6
    if grid.rows >= 100:
        assert torch.equal(got, want)
    # a whole Attention (q/k norms, rotary, per-head gate, OUT) with each form of the bias
    a = Arch(family="ltx25", hidden=16, layers=1, refiner=0, heads=2, head=8, ffn=32, latents=4, patch=(1,),
             text_dim=16, freq_dim=16, time_hidden=16, time_dim=16, eps=1e-6, qk_eps=1e-6, final_eps=1e-6,
             rope_axes=(8,), rope_theta=1e4, mlp="gelu_tanh", qk_norm="across")
    g = torch.Generator().manual_seed(1)
    lin = lambda n: Linear(torch.randn(n, 16, generator=g) * 0.25, 0.1 * torch.randn(n, generator=g))  # noqa: E731
    w = Attention(lin(16), lin(16), lin(16), lin(16), 1 + 0.1 * torch.randn(16, generator=g),
                  1 + 0.1 * torch.randn(16, generator=g), lin(2))
    angles = torch.randn(grid.rows, 2, 2, generator=g)
    s = Sequence(torch.zeros(grid.rows, dtype=torch.long), angles.cos(), angles.sin())
    h = torch.randn(grid.rows, 16, generator=g)
    assert rel_err(attend(a, w, h, h, s, s, bias), attend(a, w, h, h, s, s, dense)) <= 1e-6


def test_ranks_order_keeps_the_bias():
    """The sequence-parallel ranks attend in packed order (SequenceShards.to_packed over 4 ranks): rows gathered in
    rank order go back where one process lays them out, so the GroupBias applies as given, and to_rank_order
    returns them."""
    rows = GRID.rows
    map_ = (torch.arange(rows) >= 6).long()
    shards = SequenceShards.split(Ranks(0, 4), map_)
    order = shards.order
    q, k, v = qkv(rows, seed=2)
    want = attention(q, k, v, 0, guide_attention_bias(GRID))
    got = attention(*(shards.to_packed(t[order]) for t in (q, k, v)), 0, guide_bias(GRID))
    assert rel_err(got, want) <= 1e-6
    assert torch.equal(shards.to_rank_order(got), got[order])


class Largest(TorchDispatchMode):
    """The most elements of any tensor an op makes while active."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.most = max(self.most, t.numel())
        return out


def test_a_step_of_20k_rows_makes_no_rows_by_rows_tensor(tmp_path):
    """LTX25.steps for 15 frames of 32 x 40 and two guides (21 760 rows; the dense bias: 473 M values, 1.9 GB): the
    video step's bias holds 3 x rows values, and no op of the step makes a tensor of more than 64 x rows."""
    pytest.importorskip("diffusers")
    from tiny_models import ltx25_comfy_layout, random_ltx25

    from dit_core.families.ltx25 import LTX25
    save_file(ltx25_comfy_layout(random_ltx25()), tmp_path / "tiny.safetensors")
    model = LTX25.load(tmp_path / "tiny.safetensors")
    grid = Grid(15, 32, 40, 24.0, (Guide(0, 1, 0.7), Guide(112, 113, 0.4)))
    rows = grid.rows
    largest = Largest()
    with largest:
        sv, _ = model.steps(7, torch.randn(5, 32), torch.randn(5, 16), grid, 0.7, 0.45)
    assert rows == 21760 and isinstance(sv.self_bias, GroupBias)
    assert sv.self_bias.numel() == 3 * rows and sv.self_bias.keys.shape == (3, rows)
    assert largest.most <= 64 * rows, largest.most


PIECES = Arch(family="ltx25", hidden=256, layers=1, refiner=0, heads=4, head=64, ffn=1024, latents=16, patch=(1,),
              text_dim=128, freq_dim=256, time_hidden=256, time_dim=256, eps=1e-6, qk_eps=1e-6, final_eps=1e-6,
              rope_axes=(64,), rope_theta=1e4, mlp="gelu_tanh", qk_norm="across")


def pieces_inputs(grid: Grid, seed: int = 0):
    a, g = PIECES, torch.Generator().manual_seed(seed)
    lin = lambda n: Linear(torch.randn(n, 256, generator=g) / 16, 0.1 * torch.randn(n, generator=g))  # noqa: E731
    gain = lambda: 1 + 0.2 * torch.randn(a.width, generator=g)  # noqa: E731
    w = Attention(lin(256), lin(256), lin(256), lin(256), gain(), gain(), lin(4))
    angles = torch.randn(grid.rows, a.heads, 16, generator=g) * 3
    seq = Sequence(torch.zeros(grid.rows, dtype=torch.long), angles.cos(), angles.sin())
    return w, seq, torch.randn(grid.rows, 256, generator=g)


@pytest.mark.parametrize("path", ["spans", "masked"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_gpu_piece_equals_the_host_dense_bias(device, path, monkeypatch):
    """pieces.attention_rows with the GroupBias and OUT, BF16 linears, against the host's f32 attend with the dense
    bias, within 1e-2 (the LTX GPU tests' bound): spans, the flash kernel a key span (the generated keys, each
    guide's) mixed by log-sum-exp (6.3e-3 on the CPU); masked, a [keys] mask a query group, none for the strength-1
    guide's (6.2e-3 on the CPU)."""
    from dit_core.gpu import pieces
    from dit_core.gpu.options import Options
    from dit_core.gpu.pieces import GpuAttention, attention_rows, into
    if path == "masked":
        monkeypatch.setattr(pieces, "MAX_KEY_SPANS", 0)
    dev, a = torch.device(device), PIECES
    w, seq, h = pieces_inputs(GRID)
    want = attend(a, w, h, h, seq, seq, guide_attention_bias(GRID))
    o, m = Options(), torch.zeros(GRID.rows, dtype=torch.int32 if dev.type == "cuda" else torch.long, device=dev)
    gw, s, hd = GpuAttention.of(w, dev), seq.to(dev), h.to(dev)
    got = torch.zeros(GRID.rows, 256, device=dev)
    into(got, attention_rows(a, gw, hd, hd, s, s, guide_bias(GRID).to(dev), o), gw, torch.ones(1, 256, device=dev),
         m, o)
    assert rel_err(got.cpu(), want) <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", ["spans", "masked"])
def test_gpu_piece_memory_is_linear_in_rows(path, monkeypatch):
    """16 384 rows with two guides: attention_rows' peak beyond its inputs and output stays under a quarter of the
    dense bf16 mask (512 MB): flash kernels on key spans, or SDPA's masked kernel on a [keys] mask a query group;
    outputs O(rows), no scores kept."""
    from dit_core.gpu import pieces
    from dit_core.gpu.options import Options
    from dit_core.gpu.pieces import GpuAttention, attention_rows
    if path == "masked":
        monkeypatch.setattr(pieces, "MAX_KEY_SPANS", 0)
    grid = Grid(14, 32, 32, 24.0, (Guide(0, 1, 0.5), Guide(104, 105, 0.25)))
    rows, dev = grid.rows, torch.device("cuda")
    w, seq, h = pieces_inputs(grid)
    gw, s, hd, bias = GpuAttention.of(w, dev), seq.to(dev), h.to(dev), guide_bias(grid).to(dev)
    attention_rows(PIECES, gw, hd, hd, s, s, bias, Options())  # warm: kernels chosen and loaded
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = attention_rows(PIECES, gw, hd, hd, s, s, bias, Options())
    torch.cuda.synchronize()
    assert out.shape == (rows, 256) and out.isfinite().all()
    assert torch.cuda.max_memory_allocated() - base <= rows * rows * 2 // 4
