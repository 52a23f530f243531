"""MiniMax H3's heads reordered at load so that the GPU block fuses the head norm and rotary into QKV's product:
the reordering's math, and that the GPU form takes the fused path (gpu/block.py _fused_heads, _turns_v)."""
from __future__ import annotations

import pytest
import torch
from conftest import rel_err
from safetensors.torch import save_file
from tiny_models import minimax_h3_comfy_layout, random_minimax_h3

from dit_core.families.minimax_h3 import MiniMaxH3, head_order, packed_layout, padded_rotary, row_times, unrotated
from dit_core.gpu.block import _fused_heads, _turns_v
from dit_core.sequence import rotate_halves
from dit_core.weights import Linear

GPU_SIZES = dict(num_attention_heads=6, attention_head_dim=128, hidden_size=512, num_layers=1, num_refiner_layers=1,
                 ffn_dim=1024, in_channels=24, audio_in_channels=32, text_dim=256, freq_dim=256,
                 time_embed_hidden_dim=512, time_embed_dim=256, rope_freq_dim=16)


@pytest.mark.parametrize("head, rotary", [(128, 48), (32, 12), (128, 64), (128, 0), (16, 3)])
def test_head_order_turns_the_whole_head_alike(head, rotary):
    """q and k in head_order, turned over the whole head by padded_rotary's angles, are q and k turned over their
    first 2 rotary values, reordered: their dot products (and RMS norms) are the same."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 5, 3, head, generator=g, dtype=torch.float64)
    angles = torch.randn(5, rotary, generator=g, dtype=torch.float64)
    order = head_order(head, rotary)
    assert sorted(order.tolist()) == list(range(head))
    want_q, want_k = (rotate_halves(t, angles.cos(), angles.sin()) for t in (q, k))
    cos, sin = padded_rotary(angles.cos(), angles.sin(), head)
    got_q, got_k = (rotate_halves(t[..., order], cos, sin) for t in (q, k))
    torch.testing.assert_close(got_q, want_q[..., order], rtol=0, atol=1e-12)
    torch.testing.assert_close(got_q @ got_k.transpose(-1, -2), want_q @ want_k.transpose(-1, -2))


def test_unrotated_is_the_identity():
    x = torch.randn(4, 2, 32)
    s = unrotated(4, 32)
    assert s.cos.shape == (4, 16) and torch.equal(rotate_halves(x, s.cos, s.sin), x)


def test_gpu_form_fuses_the_heads(tmp_path):
    """The layers (rotary on 96 of 128) and the token refiner (none) take QKV's fused head norm and rotary, v turned
    for OUT, at H3's head of 128 (on the CPU the kernels' references)."""
    path = tmp_path / "h3.safetensors"
    save_file(minimax_h3_comfy_layout(random_minimax_h3(seed=7, **GPU_SIZES)), path)
    model = MiniMaxH3.load(path, linears="int8")
    gpu = model.gpu_form(torch.device("cpu"), model.default_options())
    a = model.arch
    layout = packed_layout(3, 2, 4, 4, 2)
    seq = model.sequence(layout, row_times(layout, 0.4, 0.5)[1])
    for block, s in ((gpu.blocks[0].block, seq), (gpu.refiners[0], unrotated(3, a.head))):
        assert _fused_heads(a, block.w[0], s) and _turns_v(a, block.w[0], block.w[1], s)


def test_curve_form_stays_near_and_keeps_its_modulation_f32(tmp_path):
    """A full model reduced to the pruned files' curve form (rank 8 of the time embedding's curve): near the full
    model's output; on the GPU path its 8-column modulation linears stay f32 linears (Layer.on), and the GPU form
    stays near the host's."""
    path = tmp_path / "h3.safetensors"
    save_file(minimax_h3_comfy_layout(random_minimax_h3(seed=7, **GPU_SIZES)), path)
    full = MiniMaxH3.load(path)
    curve = full.curve_form(8)
    assert curve.time_table.shape == (1025, 8) and curve.blocks[0].modulation.weight.shape == (18 * 512, 8)
    g = torch.Generator().manual_seed(8)
    layout = packed_layout(5, 2, 4, 4, 3)
    times, index = row_times(layout, 0.4, 0.55)
    video, audio = torch.randn(layout.video, 96, generator=g), torch.randn(layout.audio, 32, generator=g)
    text = torch.randn(layout.text, 256, generator=g)
    want = full.output(video, audio, text, layout, times, index)
    got = curve.output(video, audio, text, layout, times, index)
    for w, c in zip(want, got):
        assert rel_err(c, w) <= 1e-3
    gpu = curve.gpu_form(torch.device("cpu"), curve.default_options())
    assert isinstance(gpu.blocks[0].modulation, Linear) and gpu.blocks[0].modulation.weight.dtype == torch.float32
    for w, c in zip(got, gpu.output(video, audio, text, layout, times, index)):
        assert rel_err(c, w) <= 2e-2
