"""The shared block's host reference: grouped attention, split-half rotary vs adjacent pairs, runs, INT8 round trip."""
import pytest
import torch
from conftest import rel_err

from dit_core.arch import Arch
from dit_core.block import Block, attention
from dit_core.modulation import Modulation
from dit_core.sequence import (angle_factors, concat, halves_permutation, rotary_angles, rotate_halves, runs_of,
                               sequence_of)
from dit_core.weights import Linear

ARCH = Arch(family="test", hidden=64, layers=1, refiner=0, heads=2, head=32, ffn=128, latents=4, patch=(2, 2),
            text_dim=16, freq_dim=256, time_hidden=64, time_dim=64, eps=1e-5, qk_eps=1e-5, final_eps=1e-6,
            rope_axes=(8, 12, 12), rope_theta=256.0)


def random_block(seed: int = 0, sandwich: bool = True) -> Block:
    g = torch.Generator().manual_seed(seed)
    lin = lambda n, k: Linear(torch.randn(n, k, generator=g, dtype=torch.float64) * k ** -0.5)  # noqa: E731
    gain = lambda n: 1 + 0.2 * torch.randn(n, generator=g, dtype=torch.float64)  # noqa: E731
    a = ARCH
    post = (gain(a.hidden), gain(a.hidden)) if sandwich else (None, None)
    return Block((lin(3 * a.width, a.hidden), lin(a.hidden, a.width), lin(2 * a.ffn, a.hidden), lin(a.hidden, a.ffn),
                  gain(a.hidden), gain(a.hidden), gain(a.head), gain(a.head), *post))


def modulation(rows: int) -> Modulation:
    g = torch.Generator().manual_seed(9)
    return Modulation(*(0.3 * torch.randn(rows, ARCH.hidden, generator=g, dtype=torch.float64) for _ in range(4)),
                      attn_shift=0.1 * torch.randn(rows, ARCH.hidden, generator=g, dtype=torch.float64))


def test_grouped_attention_is_block_diagonal():
    q, k, v = (torch.randn(12, 2, 8, dtype=torch.float64) for _ in range(3))
    grouped = attention(q, k, v, group=4)
    for i in range(3):
        rows = slice(4 * i, 4 * i + 4)
        assert torch.allclose(grouped[rows], attention(q[rows], k[rows], v[rows], 0))
    assert not torch.allclose(grouped, attention(q, k, v, 0))


def test_block_in_groups_equals_each_group_alone():
    block, m = random_block(), modulation(2)
    pos = torch.randint(0, 20, (24, 3))
    row_map = torch.tensor([0] * 10 + [1] * 14)
    x = torch.randn(24, ARCH.hidden, dtype=torch.float64)
    whole = block.forward(ARCH, x, m, sequence_of(pos, row_map, ARCH.rope_axes, ARCH.rope_theta, torch.float64, 8))
    for i in range(3):
        r = slice(8 * i, 8 * i + 8)
        part = sequence_of(pos[r], row_map[r], ARCH.rope_axes, ARCH.rope_theta, torch.float64)
        assert torch.allclose(whole[r], block.forward(ARCH, x[r], m, part), atol=1e-12)


def test_halves_permutation_turns_adjacent_pairs_into_split_halves():
    """Permuting each head's q/k rows at load makes split-half rotary give the scores adjacent pairs give."""
    rows, head, r = 7, 32, 16
    angles = torch.rand(rows, r, dtype=torch.float64) * 6
    q, k = torch.randn(rows, 1, head, dtype=torch.float64), torch.randn(rows, 1, head, dtype=torch.float64)

    def adjacent(t):  # the checkpoint's convention: pair (2j, 2j + 1) turns by angle j
        c, s = angles.cos()[:, None], angles.sin()[:, None]
        a, b = t[..., 0::2], t[..., 1::2]
        return torch.stack([a * c - b * s, b * c + a * s], dim=-1).reshape(t.shape)

    perm = halves_permutation(2 * r, head)
    ours = (rotate_halves(q[..., perm], angles.cos(), angles.sin()) *
            rotate_halves(k[..., perm], angles.cos(), angles.sin())).sum(-1)
    assert torch.allclose(ours, (adjacent(q) * adjacent(k)).sum(-1), atol=1e-12)


@pytest.mark.parametrize("axes,theta,scale", [((32, 48, 48), 256.0, 1.0), ((32, 32, 32, 32), 10000.0, 0.5)])
def test_angle_factors_remake_the_tables_angles(axes, theta, scale):
    """The factors the Hopper QKV epilogue makes its angles from (positions x frequencies as two f32, kernels/
    int8_hopper_epilogues.angles_reference) give the tables' float32 angles exactly; concat keeps them where the parts
    agree; positions float32 cannot hold, or more than 4 axes, give none."""
    from kernels.int8.hopper_epilogues import angles_reference
    positions = torch.randint(0, 1024, (50, len(axes))) * scale
    seq = sequence_of(positions, torch.zeros(50, dtype=torch.long), axes, theta)
    tables = rotary_angles(positions, axes, theta).float()
    made = angles_reference(*seq.angles.as_args())
    assert made.dtype == torch.float32 and torch.equal(made, tables)
    # hi + lo carries what one f32 frequency drops: with hi alone the angles would be off by up to an ulp.
    one = (seq.angles.positions.double()[:, torch.bucketize(torch.arange(tables.shape[1]), torch.tensor(
        seq.angles.ends), right=True)] * seq.angles.freqs[0].double()).float()
    assert not torch.equal(one, tables)
    joined = concat([seq, seq])
    assert torch.equal(joined.angles.positions, torch.cat([seq.angles.positions] * 2))
    other = sequence_of(positions, torch.zeros(50, dtype=torch.long), axes, theta * 2)
    assert concat([seq, other]).angles is None
    assert angle_factors(positions.double() + 1 / 3, axes, theta) is None
    assert angle_factors(torch.zeros(5, 5), (8,) * 5, theta) is None


def test_runs_of_rows_sharing_a_modulation_row():
    assert runs_of(torch.tensor([0, 0, 1, 1, 1, 0])) == [(0, 2, 0), (2, 5, 1), (5, 6, 0)]
    # Sequence.starts: each run's first row, from a map made on the host; kept on the way to a device, shifted by
    # concat (the quantizer's hint: kernels/int8/quant.py row_starts).
    seq = sequence_of(torch.zeros(6, 2), torch.tensor([0, 0, 1, 1, 1, 0]), (4, 4), 100.0)
    assert seq.starts == (0, 2, 5) and seq.to("cpu").starts == (0, 2, 5)
    assert concat([seq, seq]).starts == (0, 2, 5, 6, 8, 11)


def test_quantized_block_is_int8_and_dequantizes_close():
    block = random_block(sandwich=False)
    q = block.quantized()
    assert all(q.w[i].quantized for i in range(4)) and q.quantized() == q
    back = q.dequantized(torch.float64)
    x, m = torch.randn(10, ARCH.hidden, dtype=torch.float64), modulation(1)
    seq = sequence_of(torch.randint(0, 9, (10, 3)), torch.zeros(10, dtype=torch.long), ARCH.rope_axes,
                      ARCH.rope_theta, torch.float64)
    ref = block.forward(ARCH, x, m, seq)
    assert 1e-4 < rel_err(back.forward(ARCH, x, m, seq), ref) < 2e-2
    assert 1e-4 < rel_err(q.forward(ARCH, x, m, seq), ref) < 3e-2
