"""Sequence parallelism of the shared block (dit_core/parallel) on the CPU with gloo, f32: a tiny MiniMax H3 step on
2 and 4 spawned ranks against the same step in one process; balanced shares; a failing rank; heads that do not
divide by the world."""
import multiprocessing
import time

import pytest
import torch
import torch.distributed as dist
from conftest import rel_err
from tiny_models import MINIMAX_H3_TINY, minimax_h3_file

from dit_core.families.minimax_h3 import MiniMaxH3, packed_layout, row_times
from dit_core.parallel import RankFailed, RankPool, Ranks, SequenceShards, run_ranks, shares
from dit_core.parallel.steps import load_placed, method_call
from dit_core.sequence import runs_of

C, CA, TEXT = MINIMAX_H3_TINY["in_channels"], MINIMAX_H3_TINY["audio_in_channels"], MINIMAX_H3_TINY["text_dim"]


@pytest.fixture(scope="module")
def h3_file(tmp_path_factory):
    pytest.importorskip("diffusers")
    return minimax_h3_file(tmp_path_factory.mktemp("h3_parallel"))


def h3_step(model):
    """A fl2va pass: 5 text rows, a keyframe, stereo audio, 3 target frames (37 rows: shares of 2 and 4 ranks
    uneven); rows of three times."""
    torch.manual_seed(3)
    layout = packed_layout(5, 3, 4, 6, 4, ("first",))
    video = torch.randn(layout.video_rows.numel(), 4 * C)
    audio, text = torch.randn(layout.audio, CA), torch.randn(layout.text, TEXT)
    txt = model.text_rows(text)
    return txt, video, audio, layout, *row_times(layout, 0.4, 0.55)


@pytest.fixture(scope="module")
def pools():
    """A pool of 2 and one of 4 ranks, shared by the steps below (a rank's start is most of a test's time)."""
    with RankPool(2) as two, RankPool(4) as four:
        yield {2: two, 4: four}


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_give_the_single_process_step(h3_file, pools, world):
    """velocity on `world` ranks (each loads the file once, holds its share of the rows) = one process, f32
    rounding, for two steps at different times on the same loaded ranks."""
    model = MiniMaxH3.load(h3_file)
    txt, video, audio, layout, *_ = h3_step(model)
    pool = pools[world]
    pool(load_placed, MiniMaxH3.load, str(h3_file))
    for t in (0.4, 0.9):
        times, index = row_times(layout, t, 0.55)
        want_v, want_a = model.velocity(video, audio, txt, layout, times, index)
        blocks = []
        v, a = pool(method_call, "velocity", (video, audio, txt, layout, times, index), {}, progress=blocks.append)
        assert rel_err(v, want_v) <= 1e-5 and rel_err(a, want_a) <= 1e-5
        assert blocks == [1, 2]  # rank 0's progress, a block at a time
    assert pool.alive == list(range(world))


def test_one_rank_is_the_single_process_step_bit_for_bit(h3_file):
    model = MiniMaxH3.load(h3_file)
    txt, video, audio, layout, times, index = h3_step(model)
    want = model.velocity(video, audio, txt, layout, times, index)
    got = model.velocity(video, audio, txt, layout, times, index, ranks=Ranks(0, 1))
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_shares_are_balanced_by_kind(world):
    """Every rank holds every kind of row (text, keyframe, audio, video) within one row of its even share, and the
    shares cover each row once."""
    layout = packed_layout(5, 3, 4, 6, 4, ("first",))
    _, index = row_times(layout, 0.4, 0.55)
    map_ = index * 3 + layout.tags
    runs = [(first, end) for first, end, _ in runs_of(map_)]
    parts = shares(runs, world)
    assert torch.equal(torch.cat(parts).sort().values, torch.arange(layout.rows))
    counts = [p.numel() for p in parts]
    assert max(counts) - min(counts) <= 1
    for first, end in runs:
        held = [int(((p >= first) & (p < end)).sum()) for p in parts]
        assert max(held) - min(held) <= 1, (first, end, held)
    assert all(int((p < layout.text).sum()) >= 1 for p in parts)  # text on every rank, not all on rank 0


def test_heads_the_ranks_cannot_share_are_refused():
    """Heads are padded to a multiple of the world (below); fewer heads than ranks, and grouped key heads that do
    not divide, are refused before any work."""
    rows = torch.zeros(10, dtype=torch.long)
    assert SequenceShards.split(Ranks(0, 3), rows, (4, 4)).padded(4) == 6
    with pytest.raises(ValueError, match=r"4 heads are fewer than the ranks; use 4 GPUs or fewer"):
        SequenceShards.split(Ranks(0, 5), rows, (4, 4))
    with pytest.raises(ValueError, match=r"4 heads sharing 2 key/value heads do not divide by 3"):
        SequenceShards.split(Ranks(0, 3), rows, (4, 2))


def h3_once(ranks: Ranks, path: str, txt, video, audio, layout, times, index):
    """run_ranks' fn: a fresh rank loads H3 and runs one step."""
    return MiniMaxH3.load(path).velocity(video, audio, txt, layout, times, index, ranks=ranks)


def test_heads_not_dividing_by_the_world_are_padded(h3_file):
    """H3's 4 heads on 3 ranks (run_ranks: one call on fresh ranks, torn down after): padded to 6 with copies of the
    first two, whose attention is dropped; the step is one process's within f32 rounding."""
    model = MiniMaxH3.load(h3_file)
    txt, video, audio, layout, times, index = h3_step(model)
    want = model.velocity(video, audio, txt, layout, times, index)
    before = set(multiprocessing.active_children())
    got = run_ranks(3, h3_once, (str(h3_file), txt, video, audio, layout, times, index))
    assert all(rel_err(g, w) <= 1e-5 for g, w in zip(got, want)), [rel_err(g, w) for g, w in zip(got, want)]
    assert set(multiprocessing.active_children()) <= before  # its ranks reaped


def fail_on(ranks: Ranks, state: dict, bad: int) -> int:
    """Rank `bad` raises; the others wait for it in a collective (which would hang without the launcher)."""
    if ranks.rank == bad:
        raise RuntimeError(f"rank {bad} gave up on purpose")
    t = torch.ones(1)
    dist.all_reduce(t)
    return int(t)


def test_a_failing_rank_stops_the_others():
    pool = RankPool(2, timeout_s=60)
    assert pool(fail_on, 5) == 2  # healthy
    start = time.monotonic()
    with pytest.raises(RankFailed, match="rank 1 of 2 failed: RuntimeError: rank 1 gave up on purpose") as e:
        pool(fail_on, 1)
    assert e.value.rank == 1 and "fail_on" in e.value.trace
    assert time.monotonic() - start < 10
    assert not pool.open and pool.alive == []  # every rank reaped


def twice(ranks: Ranks, state: dict, x: torch.Tensor) -> torch.Tensor:
    return 2 * x


def stall_on(ranks: Ranks, state: dict, bad: int) -> None:
    if ranks.rank == bad:
        time.sleep(60)


def test_pool_call_that_overstays_stops_the_ranks():
    with RankPool(2) as pool:
        assert torch.equal(pool(twice, torch.ones(2)), torch.full((2,), 2.0))
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"ranks \[1\] of 2 had not answered after 1 s"):
            pool(stall_on, 1, timeout_s=1.0)
        assert time.monotonic() - start < 10
        assert not pool.open and pool.alive == []  # every rank reaped
        with pytest.raises(RuntimeError, match="closed"):
            pool(twice, torch.ones(2))


@pytest.fixture(scope="module")
def ltx25_files(tmp_path_factory):
    """LTX-2.5's tiny instance (2 heads a stream) and one of 4 heads (4 ranks: Ulysses splits by heads)."""
    pytest.importorskip("diffusers")
    from safetensors.torch import save_file
    from tiny_models import ltx25_comfy_layout, random_ltx25
    d = tmp_path_factory.mktemp("ltx25_parallel")
    save_file(ltx25_comfy_layout(random_ltx25()), d / "heads2.safetensors")
    save_file(ltx25_comfy_layout(random_ltx25(num_attention_heads=4, attention_head_dim=8,
                                              audio_num_attention_heads=4, audio_attention_head_dim=4)),
              d / "heads4.safetensors")
    return d


def ltx25_step(guided: bool):
    """LTX-2.5's step inputs: 3 latent frames of 2x3 (the first conditioned, a keyframe), 7 audio rows, a prompt of 5
    with its last row masked; guided: a guide frame at strength 0.5 (the self-attention's [rows, rows] bias)."""
    from dit_core.families.ltx25_positions import Grid, Guide
    torch.manual_seed(3)
    grid = Grid(3, 2, 3, guides=(Guide(16, 17, 0.5),) if guided else ())
    video, audio = torch.randn(grid.rows, 8), torch.randn(7, 8)
    mask, first = torch.ones(5), torch.zeros(grid.rows)
    mask[-1], first[:6] = 0, 1
    args = (video, audio, torch.randn(5, 32), torch.randn(5, 16), grid, 0.7, 0.45, first, mask, first.bool())
    return args, {"av_times": "comfyui", "rope_dtype": torch.float32}


# 4 ranks guided: the bias rows and columns must follow the ranks' row order (2 ranks leave this grid's blocks in place)
@pytest.mark.parametrize("world, heads, guided", [(2, 2, False), (4, 4, True)])
def test_ltx25_ranks_give_the_single_process_step(ltx25_files, pools, world, heads, guided):
    """Both streams split across the ranks; self, A2V and V2A attention across them, the prompt's local."""
    from dit_core.families.ltx25 import LTX25
    path = ltx25_files / f"heads{heads}.safetensors"
    args, options = ltx25_step(guided)
    want_v, want_a = LTX25.load(path).forward(*args, **options)
    pools[world](load_placed, LTX25.load, str(path))
    v, a = pools[world](method_call, "forward", args, options)
    assert rel_err(v, want_v) <= 1e-5 and rel_err(a, want_a) <= 1e-5


def ltx25_once(ranks: Ranks, path: str, args: tuple, options: dict):
    """run_ranks' fn: a fresh rank loads LTX-2.5 and runs one step."""
    from dit_core.families.ltx25 import LTX25
    return LTX25.load(path).forward(*args, **options, ranks=ranks)


def test_ltx25_heads_not_dividing_by_the_world_are_padded(ltx25_files):
    """4 heads a stream on 3 ranks, guided (self, A2V and V2A attention with padded heads, the guide's bias on
    every head): one process's step within f32 rounding."""
    from dit_core.families.ltx25 import LTX25
    path = ltx25_files / "heads4.safetensors"
    args, options = ltx25_step(True)
    want_v, want_a = LTX25.load(path).forward(*args, **options)
    v, a = run_ranks(3, ltx25_once, (str(path), args, options))
    assert rel_err(v, want_v) <= 1e-5 and rel_err(a, want_a) <= 1e-5


def test_ltx25_one_rank_is_the_single_process_step_bit_for_bit(ltx25_files):
    from dit_core.families.ltx25 import LTX25
    model = LTX25.load(ltx25_files / "heads2.safetensors")
    args, options = ltx25_step(True)
    want = model.forward(*args, **options)
    got = model.forward(*args, **options, ranks=Ranks(0, 1))
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def blocks_of(ranks: Ranks, state: dict, n: int) -> int:
    """n blocks of 20 ms each, state["check"]() after each (as a family's step calls it)."""
    for _ in range(n):
        time.sleep(0.02)
        state["check"]()
    return n


class Interrupted(Exception):
    """The host's interrupt (ComfyUI's InterruptProcessingException)."""


def test_cancel_stops_every_rank_at_one_block_and_keeps_the_pool(pools):
    seen = []

    def check():
        if len(seen) >= 3:
            raise Interrupted

    pool = pools[2]
    start = time.monotonic()
    with pytest.raises(Interrupted):
        pool(blocks_of, 1000, check=check, progress=seen.append)
    assert time.monotonic() - start < 10 and seen[:3] == [1, 2, 3] and len(seen) < 1000
    assert pool.open and pool.alive == [0, 1]
    assert pool(blocks_of, 2) == 2  # the ranks go on


# LTX-2.5's GPU form: sizes its kernels take (heads of 128 video, 64 audio; widths in ConvRot groups of 64), as
# tests/families/test_ltx25_gpu.py
LTX25_GPU_SIZES = dict(in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=128,
                       cross_attention_dim=256, audio_in_channels=16, audio_out_channels=16,
                       audio_num_attention_heads=2, audio_attention_head_dim=64, audio_cross_attention_dim=128,
                       num_layers=2)


@pytest.fixture(scope="module")
def ltx25_gpu_files(tmp_path_factory):
    """The GPU-size tiny LTX-2.5 with BF16 linears and with INT8 ConvRot block linears."""
    pytest.importorskip("diffusers")
    from safetensors.torch import save_file
    from tiny_models import int8_convrot_state, ltx25_comfy_layout, random_ltx25
    d = tmp_path_factory.mktemp("ltx25_gpu_parallel")
    config = '{"transformer": {"num_attention_heads": 2, "audio_num_attention_heads": 2}}'
    state = ltx25_comfy_layout(random_ltx25(seed=4, **LTX25_GPU_SIZES))
    save_file(state, d / "bf16.safetensors", metadata={"config": config})
    save_file(int8_convrot_state(state, lambda key: ".transformer_blocks." in key, group=64),
              d / "int8.safetensors", metadata={"config": config})
    return d


def ltx25_gpu_form(path: str):
    """The model as the GPU path runs it, on the CPU (the kernels' references)."""
    from dit_core.families.ltx25 import LTX25
    host = LTX25.load(path)
    return host.gpu_form(torch.device("cpu"), host.default_options())


def load_gpu_form(ranks: Ranks, state: dict, path: str) -> None:
    state["model"] = ltx25_gpu_form(path)


def ltx25_gpu_step(guided: bool):
    """forward's arguments at the GPU sizes: 3 latent frames of 2x3 (the first conditioned, a keyframe; guided: one
    more frame as a guide at strength 0.5), 7 audio rows, a prompt of 6 with its last row masked."""
    from dit_core.families.ltx25_positions import Grid, Guide
    grid = Grid(3, 2, 3, guides=(Guide(16, 17, 0.5),) if guided else ())
    g = torch.Generator().manual_seed(5)
    video, audio = torch.randn(grid.rows, 16, generator=g), torch.randn(7, 16, generator=g)
    text_video, text_audio = torch.randn(6, 256, generator=g), torch.randn(6, 128, generator=g)
    mask, first = torch.ones(6), torch.zeros(grid.rows)
    mask[-1], first[:6] = 0, 1
    return video, audio, text_video, text_audio, grid, 0.7, 0.45, first, mask, first.bool()


@pytest.mark.parametrize("name, guided", [("bf16", True), ("bf16", False), ("int8", True)])
def test_ltx25_gpu_form_ranks_give_the_single_process_step(ltx25_gpu_files, pools, name, guided):
    """The GPU form's layers (dit_core/gpu/pieces.py) on 2 ranks: each rank's rows through the linears, attention
    across the ranks by heads in packed order (the bias as one process has it: the guide's through span_attention),
    against the same GPU form in one process on one thread, as a rank runs: the same arithmetic, bit for bit on this
    CPU (0.0); the bound leaves room for products that round by their row count elsewhere."""
    path = str(ltx25_gpu_files / f"{name}.safetensors")
    args = ltx25_gpu_step(guided)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs: MKL's f32 products round by their thread count
    try:
        want_v, want_a = ltx25_gpu_form(path).forward(*args)
    finally:
        torch.set_num_threads(threads)
    pools[2](load_gpu_form, path)
    v, a = pools[2](method_call, "forward", args, {})
    assert rel_err(v, want_v) <= 1e-6 and rel_err(a, want_a) <= 1e-6


def test_ltx25_gpu_form_one_rank_is_the_single_process_step_bit_for_bit(ltx25_gpu_files):
    model = ltx25_gpu_form(str(ltx25_gpu_files / "bf16.safetensors"))
    args = ltx25_gpu_step(True)
    want = model.forward(*args)
    got = model.forward(*args, ranks=Ranks(0, 1))
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def load_on_gpu(ranks: Ranks, state: dict, path: str) -> None:
    """LTX-2.5 on this rank's GPU (the pool's NCCL ranks: device = rank)."""
    from dit_core.families.ltx25 import LTX25
    state["model"] = LTX25.load(path).to("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("name", ["bf16", "int8"])
def test_ltx25_two_gpus_give_the_one_gpu_step(ltx25_gpu_files, name):
    """LTX25.to('cuda') on 2 NCCL ranks (a GPU each, the kernels) against one GPU: within 1e-2 (the rows' products
    may take other tiles on fewer rows)."""
    from dit_core.families.ltx25 import LTX25
    path = str(ltx25_gpu_files / f"{name}.safetensors")
    args = ltx25_gpu_step(True)
    want_v, want_a = LTX25.load(path).to("cuda").forward(*args)
    with RankPool(2, backend="nccl") as pool:
        pool(load_on_gpu, path)
        v, a = pool(method_call, "forward", args, {})
    assert v.device.type == "cpu" and rel_err(v, want_v) <= 1e-2 and rel_err(a, want_a) <= 1e-2


def h3_gpu_blocks(ranks: Ranks, state: dict, path: str, linears: str, x, layout, times, index):
    """H3's GPU-form blocks (dit_core/gpu/block.py GpuBlock, on the CPU) over x [rows, hidden], this rank's share
    of the rows across the ranks, gathered: the loop of MiniMaxH3.velocity."""
    from dit_core.families.minimax_h3 import GATE1, GATE2, SCALE1, SCALE2, SHIFT1, SHIFT2
    from dit_core.modulation import Modulation
    host = MiniMaxH3.load(path, linears=linears)
    model = host.gpu_form(torch.device("cpu"), host.default_options())
    a = model.arch
    temb, seq = model.time_rows(times), model.sequence(layout, index)
    shards = SequenceShards.split(ranks, seq.map, (a.heads, a.kv_heads or a.heads))
    x, seq = shards.take(x), shards.sequence(seq)
    for layer in model.blocks:
        rows = layer.modulation_rows(temb, model.options).reshape(-1, 6, a.hidden).transpose(0, 1).contiguous()
        m = Modulation(attn_scale=rows[SCALE1], attn_gate=rows[GATE1], mlp_scale=rows[SCALE2], mlp_gate=rows[GATE2],
                       attn_shift=rows[SHIFT1], mlp_shift=rows[SHIFT2])
        x = layer.block.forward(a, x, m, seq, None, model.options, shards=shards)
    return shards.gather(x)


@pytest.mark.parametrize("world, linears", [(2, "stored"), (4, "int8")])
def test_h3_gpu_blocks_on_ranks_give_the_single_process_blocks(h3_file, pools, world, linears):
    """H3's GpuBlock.forward with shards (attention across the ranks by heads, in packed order) on `world` ranks
    against one process on one thread (as a rank runs): bit for bit on this CPU (0.0)."""
    torch.manual_seed(4)
    layout = packed_layout(5, 3, 4, 6, 4, ("first",))
    times, index = row_times(layout, 0.4, 0.55)
    x = torch.randn(layout.rows, MiniMaxH3.load(h3_file).arch.hidden)
    args = (str(h3_file), linears, x, layout, times, index)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs: MKL's f32 products round by their thread count
    try:
        want = h3_gpu_blocks(Ranks(0, 1), {}, *args)
    finally:
        torch.set_num_threads(threads)
    got = pools[world](h3_gpu_blocks, *args)
    assert rel_err(got, want) <= 1e-6


def h3_gpu_velocity(ranks: Ranks, state: dict, path: str, text, video, audio, layout, times, index):
    """MiniMaxH3.velocity of the GPU-form model (GpuBlocks, on the CPU) across the ranks."""
    host = MiniMaxH3.load(path, linears="int8")
    model = host.gpu_form(torch.device("cpu"), host.default_options())
    return model.velocity(video, audio, model.text_rows(text), layout, times, index, ranks=ranks)


def test_h3_gpu_form_velocity_on_ranks_gives_the_single_process_step(h3_file, pools):
    """The whole GPU-form velocity (INT8 linears) on 2 ranks against one process on one thread: within 1e-6."""
    torch.manual_seed(3)
    layout = packed_layout(5, 3, 4, 6, 4, ("first",))
    args = (str(h3_file), torch.randn(layout.text, TEXT), torch.randn(layout.video_rows.numel(), 4 * C),
            torch.randn(layout.audio, CA), layout, *row_times(layout, 0.4, 0.55))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs
    try:
        want = h3_gpu_velocity(Ranks(0, 1), {}, *args)
    finally:
        torch.set_num_threads(threads)
    got = pools[2](h3_gpu_velocity, *args)
    assert all(rel_err(g, w) <= 1e-6 for g, w in zip(got, want))
