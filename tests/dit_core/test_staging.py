"""Block streaming (issue 5): the resident-set plan and its budget arithmetic, byte-exact staging of every dtype,
reads from the file straight into host memory, and a streamed forward equal bit for bit to the resident one
(CPU here; test_streaming.py has host memory, re-planning and the runs on a GPU)."""
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import save_file
from tiny_models import random_z_image, z_image_comfy_layout

from dit_core.arch import Arch
from dit_core.block import Block
from dit_core.gpu.block import GpuBlock
from dit_core.families.z_image import ZImage
from dit_core.modulation import Modulation
from dit_core.sequence import sequence_of
from dit_core.gpu.staging import ALIGN, stage, stage_all, staged_bytes, tensor_paths
from dit_core.gpu.streaming import StreamedBlocks, keep_order, plan, spread
from dit_core.weights import Checkpoint, Linear, checkpoint, quantize_convrot
from dit_core.weights.checkpoint import TensorSource

DTYPES = [torch.int8, torch.uint8, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn]
A = Arch(family="test", hidden=256, layers=6, refiner=0, heads=4, head=64, ffn=512, latents=16, patch=(2, 2),
         text_dim=64, freq_dim=256, time_hidden=256, time_dim=256, eps=1e-5, qk_eps=1e-5, final_eps=1e-6,
         rope_axes=(16, 24, 24), rope_theta=256.0)


# --- the plan ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,k", [(8, 4), (30, 7), (50, 13), (5, 5), (5, 0), (1, 1)])
def test_spread_keeps_k_evenly_and_the_first(n, k):
    keep = spread(n, k)
    kept = [i for i, x in enumerate(keep) if x]
    assert len(kept) == k
    if k:
        assert kept[0] == 0
        gaps = [b - a for a, b in zip(kept, kept[1:] + [kept[0] + n])]
        assert max(gaps) - min(gaps) <= 1


@pytest.mark.parametrize("percent,expected", [(100, 8), (50, 4), (25, 2), (0, 0)])
def test_plan_at_fractions_of_the_model(percent, expected):
    size, n = 1000, 8
    budget = n * size if percent == 100 else n * size * percent // 100 + 2 * size  # residents + two slots
    keep = plan([size] * n, budget)
    assert sum(keep) == expected
    assert keep == ([True] * n if percent == 100 else spread(n, expected))


def test_plan_respects_the_budget_with_the_two_slots():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        sizes = (torch.randint(100, 1000, (int(torch.randint(1, 40, (), generator=g)),), generator=g)).tolist()
        budget = int(torch.randint(2 * max(sizes), sum(sizes) + 1000, (), generator=g))
        keep = plan(sizes, budget)
        used = sum(s for s, k in zip(sizes, keep) if k)
        # Every block resident exactly when the whole model fits; else the residents leave room for two slots.
        assert all(keep) == (sum(sizes) <= budget)
        assert all(keep) or used + 2 * max(sizes) <= budget


def test_plan_names_the_budget_and_the_bytes_it_needs():
    with pytest.raises(ValueError, match=r"budget of 1999 bytes.*need 2000 bytes"):
        plan([1000, 1000, 1000], 1999)


def test_free_order_keeps_the_rest_spread():
    order = keep_order(16)
    assert sorted(order) == list(range(16))
    assert order[:4] == [0, 8, 4, 12]
    assert sorted(keep_order(5)) == list(range(5))


# --- staging -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tree:
    parts: tuple
    name: str = "kept"


def random_bytes(shape, dtype, g):
    n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_staging_round_trip_is_byte_exact(dtype):
    g = torch.Generator().manual_seed(1)
    tensors = [random_bytes(s, dtype, g) for s in [(3, 5), (7,), (), (0, 4), (129, 3)]]
    tensors.append(random_bytes((6, 4), dtype, g).t())  # not contiguous
    tree = Tree((tensors[0], None, 3, (tensors[1], tensors[2]), *tensors[3:]))
    staged = stage(tree)
    assert staged.nbytes == staged_bytes(tree) and staged.nbytes % ALIGN == 0
    assert staged.host.numel() == staged.nbytes
    slot = torch.zeros(staged.nbytes + 512, dtype=torch.uint8)
    staged.copy_to(slot)
    back = staged.on(slot)
    assert back.name == "kept" and back.parts[1] is None and back.parts[2] == 3
    for a, b in zip(tensors, [back.parts[0], *back.parts[3], *back.parts[4:]]):
        assert same_bytes(b, a)
    offsets = [p.offset for p in [staged.template.parts[0], *staged.template.parts[3], *staged.template.parts[4:]]]
    assert all(o % ALIGN == 0 for o in offsets) and offsets == sorted(offsets)


def test_blocks_stage_into_one_buffer_of_their_aligned_sizes():
    # torch's pinned allocator rounds each allocation up to a power of two: one buffer for all the blocks, each
    # a view at its offset, holds exactly the sum of their aligned sizes
    g = torch.Generator().manual_seed(5)
    blocks = [Tree((random_bytes((n, 3), torch.bfloat16, g), random_bytes((n + 1,), torch.int8, g)))
              for n in (1, 100, 333, 1000)]
    staged = stage_all(blocks)
    sizes = [staged_bytes(b) for b in blocks]
    assert [s.nbytes for s in staged] == sizes and all(n % ALIGN == 0 for n in sizes)
    storages = {s.host.untyped_storage().data_ptr() for s in staged}
    assert len(storages) == 1 and staged[0].host.untyped_storage().nbytes() == sum(sizes)
    assert [s.host.data_ptr() - staged[0].host.data_ptr() for s in staged] == [sum(sizes[:i]) for i in range(4)]
    for block, s in zip(blocks, staged):
        assert all(same_bytes(b, a) for a, b in zip(block.parts, s.on(s.host.clone()).parts))


def test_a_slot_too_small_is_refused():
    staged = stage(Tree((torch.ones(100),)))
    with pytest.raises(ValueError, match="at least"):
        staged.on(torch.empty(10, dtype=torch.uint8))


def random_block(seed: int, sandwich: bool = True, bias: bool = False) -> Block:
    g = torch.Generator().manual_seed(seed)
    b = lambda n: 0.1 * torch.randn(n, generator=g) if bias else None  # noqa: E731
    lin = lambda n, k: Linear(torch.randn(n, k, generator=g) * k ** -0.5, b(n))  # noqa: E731
    gain = lambda n: 1 + 0.2 * torch.randn(n, generator=g)  # noqa: E731
    post = (gain(A.hidden), gain(A.hidden)) if sandwich else (None, None)
    return Block((lin(3 * A.width, A.hidden), lin(A.hidden, A.width), lin(2 * A.ffn, A.hidden),
                  lin(A.hidden, A.ffn), gain(A.hidden), gain(A.hidden), gain(A.head), gain(A.head), *post))


def gpu_blocks(fmt: str, device="cpu", n: int = A.layers, same: bool = False) -> list[GpuBlock]:
    """n GpuBlocks of random weights; unless same, some with biases and some without sandwich norms."""
    convert = {"int8": Block.quantized, "bf16": lambda b: b.dequantized(torch.bfloat16)}[fmt]
    return [GpuBlock.of(convert(random_block(i, sandwich=same or i % 2 == 0, bias=not same and i % 3 == 0)),
                        torch.device(device)) for i in range(n)]


@pytest.mark.parametrize("fmt", ["int8", "bf16"])
def test_gpu_blocks_stage_byte_exact(fmt):
    for block in gpu_blocks(fmt, n=3):
        staged = stage(block)
        back = staged.on(staged.host.clone())
        for i, (a, b) in enumerate(zip(block.w, back.w)):
            if i <= 3:
                assert a.group == b.group and same_bytes(b.weight, a.weight)
                for x, y in ((a.scale, b.scale), (a.bias, b.bias)):
                    assert (x is None and y is None) or same_bytes(y, x)
            else:
                assert (a is None and b is None) or same_bytes(b, a)


def test_checkpoint_reads_straight_into_host_bytes(tmp_path):
    g = torch.Generator().manual_seed(2)
    tensors = {f"t{i}": random_bytes((5, 7), d, g) for i, d in enumerate(DTYPES)}
    save_file(tensors, tmp_path / "t.safetensors")
    ckpt = Checkpoint(tmp_path / "t.safetensors")
    for name, t in tensors.items():
        out = torch.empty(t.numel() * t.element_size(), dtype=torch.uint8)
        ckpt.read_into(name, out)
        assert same_bytes(out.view(t.dtype).reshape(t.shape), t)
    with pytest.raises(ValueError, match="holds 35 bytes"):
        ckpt.read_into("t0", torch.empty(3, dtype=torch.uint8))
    # stage() takes the file where its dtype and size match the block's tensor, else copies (converted at load)
    block = Tree((tensors["t3"].clone(), tensors["t2"].to(torch.float16), tensors["t0"].clone()))
    files = {p: (ckpt, n) for p, n in zip(tensor_paths(block), ["t3", "t2", "t0"])}
    read = []
    ckpt.read_into = lambda name, out, readers, f=ckpt.read_into: (read.append(name), f(name, out, readers))
    staged = stage(block, files)
    assert read == ["t3", "t0"]
    assert all(same_bytes(b, a) for a, b in zip(block.parts, staged.on(staged.host).parts))


def test_readers_read_a_tensor_in_pieces_side_by_side(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(4)
    tensors = {"a": random_bytes((3,), torch.int8, g), "b": random_bytes((1000, 7), torch.bfloat16, g)}
    save_file(tensors, tmp_path / "t.safetensors")
    ckpt = Checkpoint(tmp_path / "t.safetensors")
    monkeypatch.setattr(checkpoint, "READ_PIECE", 1024)  # "b": 14 pieces, the last one short
    with ThreadPoolExecutor(3) as readers:
        for name, t in tensors.items():
            out = torch.empty(t.numel() * t.element_size(), dtype=torch.uint8)
            ckpt.read_into(name, out, readers)
            assert same_bytes(out.view(t.dtype).reshape(t.shape), t)


def test_a_tensors_range_is_read_from_its_file_and_a_view_of_its_map_is_known(tmp_path):
    """What the loads' carrier reads for a card from the file in a tensor's place: a range of its stored bytes
    (read_into's offset: each page-locked chunk), and only for a tensor that is still get()'s view of the map."""
    g = torch.Generator().manual_seed(5)
    tensors = {"a": random_bytes((300, 7), torch.bfloat16, g), "b": random_bytes((9,), torch.float32, g)}
    save_file(tensors, tmp_path / "t.safetensors")
    ckpt, counted = Checkpoint(tmp_path / "t.safetensors"), []
    ckpt.read = counted.append
    a = ckpt.get("a")
    whole = a.reshape(-1).view(torch.uint8)
    for offset, n in ((0, 1000), (1000, 3200), (4199, 1), (0, 4200)):
        out = torch.empty(n, dtype=torch.uint8)
        ckpt.read_into("a", out, offset=offset)
        assert torch.equal(out, whole[offset:offset + n])
    assert counted == [4200]  # get() counted it; its ranges are not counted again
    for offset, n in ((4000, 201), (-1, 10)):
        with pytest.raises(ValueError, match="holds 4200 bytes"):
            ckpt.read_into("a", torch.empty(n, dtype=torch.uint8), offset=offset)
    assert ckpt.views("a", a) and ckpt.views("a", ckpt.get("a"))
    assert not ckpt.views("a", a.clone()) and not ckpt.views("a", a[:10]) and not ckpt.views("b", a)
    assert not ckpt.views("b", ckpt.get("b").to(torch.bfloat16))  # converted at load: copied, not read again
    ckpt.release()
    assert not ckpt.views("a", a)  # (a map of its own again at the next get(): another place)
    source = TensorSource(tensors)
    assert source.views("a", tensors["a"]) and not source.views("a", tensors["a"].clone())
    out = torch.empty(100, dtype=torch.uint8)
    source.read_into("a", out, offset=50)
    assert torch.equal(out, tensors["a"].reshape(-1).view(torch.uint8)[50:150])


def test_a_lora_merged_into_an_f32_file_leaves_its_map_as_stored(tmp_path):
    """An f32 weight is its own dequantized form: the merge adds into a copy, not into the file's map (which a
    second read, or the carrier reading the file in its place, would then disagree with)."""
    from dit_core.weights.lora import LoraSet, Update
    save_file({"w": torch.ones(4, 3)}, tmp_path / "t.safetensors")
    ckpt = Checkpoint(tmp_path / "t.safetensors")
    lin = Linear(ckpt.get("w"), None)
    update = Update(up=torch.ones(4, 1), down=torch.ones(1, 3), factor=0.5, first=0)
    merged = LoraSet("lora.safetensors", {"x": [update]}).merged("x", lin)
    assert torch.equal(merged.weight, torch.full((4, 3), 1.5)) and torch.equal(ckpt.get("w"), torch.ones(4, 3))


# --- streamed forward --------------------------------------------------------------------------------------

def inputs(rows: int = 96, device="cpu"):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows, A.hidden, generator=g)
    mods = Modulation(*(0.3 * torch.randn(2, A.hidden, generator=g) for _ in range(4)),
                      attn_shift=0.1 * torch.randn(2, A.hidden, generator=g))
    seq = sequence_of(torch.randint(0, 16, (rows, 3), generator=g), (torch.arange(rows) >= rows // 3).long(),
                      A.rope_axes, A.rope_theta)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return x.to(device), Modulation(*(to(getattr(mods, f)) for f in mods.__dataclass_fields__)), seq.to(device)


def run(blocks, x, mods, seq) -> torch.Tensor:
    x = x.clone()  # GpuBlock.forward updates x in place
    for block in blocks:
        x = block.forward(A, x, mods, seq)
    return x


@pytest.mark.parametrize("fmt", ["int8", "bf16"])
@pytest.mark.parametrize("percent", [100, 50, 25, 0])
def test_streamed_forward_equals_resident_on_cpu(fmt, percent):
    blocks = gpu_blocks(fmt)
    x, mods, seq = inputs()
    resident = run(blocks, x, mods, seq)
    sizes = [staged_bytes(b) for b in blocks]  # blocks with and without biases and sandwich norms
    n, size = len(blocks), max(sizes)
    budget = sum(sizes) if percent == 100 else n * size * percent // 100 + 2 * size
    streamed = StreamedBlocks(blocks, "cpu", budget)
    assert sum(streamed.resident) >= n * percent // 100
    assert streamed.device_bytes() <= budget
    # the host holds only what streams
    assert streamed.host_bytes() == sum(s for s, r in zip(sizes, streamed.resident) if not r)
    for _ in range(2):  # a second pass reuses the slots
        assert torch.equal(run(streamed, x, mods, seq), resident)


def test_free_and_refill_keep_the_output():
    blocks = gpu_blocks("int8", same=True)
    x, mods, seq = inputs()
    resident = run(blocks, x, mods, seq)
    size = staged_bytes(blocks[0])
    streamed = StreamedBlocks(blocks, "cpu", 3 * size + 2 * size)
    assert streamed.resident == [True, False, True, False, True, False]
    before = streamed.device_bytes()
    assert streamed.free(size + 1) == 2 * size  # whole blocks only
    assert streamed.resident == [True] + [False] * 5 and streamed.device_bytes() == before - 2 * size
    assert streamed.host_bytes() == 5 * size  # freed blocks are staged again
    assert torch.equal(run(streamed, x, mods, seq), resident)
    assert streamed.free(10 ** 12) == size + 2 * size  # the rest, then the slots
    assert streamed.device_bytes() == 0
    assert torch.equal(run(streamed, x, mods, seq), resident)  # the slots come back for the pass
    assert streamed.refill() == 3 * size and sum(streamed.resident) == 3
    assert streamed.refill() == 0  # no copy for a block already resident
    assert torch.equal(run(streamed, x, mods, seq), resident)


def test_a_cancelled_pass_leaves_the_next_one_exact():
    blocks = gpu_blocks("bf16")
    x, mods, seq = inputs()
    streamed = StreamedBlocks(blocks, "cpu", 2 * staged_bytes(blocks[0]))
    h = x.clone()
    for i, block in enumerate(streamed):
        h = block.forward(A, h, mods, seq)
        if i == 2:
            break  # as check() raising mid-pass
    assert torch.equal(run(streamed, x, mods, seq), run(blocks, x, mods, seq))


def test_z_image_streams_its_blocks_with_the_same_output(tmp_path):
    state = z_image_comfy_layout(random_z_image(n_layers=4).state_dict())
    int8 = {}
    for key, value in state.items():
        if key.endswith(".weight") and (".attention." in key or ".feed_forward." in key) and value.dim() == 2:
            q, s = quantize_convrot(value, 64)
            marker = json.dumps({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 64})
            int8.update({key: q, key[:-len("weight")] + "weight_scale": s[:, 0].contiguous(),
                         key[:-len(".weight")] + ".comfy_quant": torch.tensor(list(marker.encode()), dtype=torch.uint8)})
        else:
            int8[key] = value
    save_file(int8, tmp_path / "z.safetensors")
    model = ZImage.load(tmp_path / "z.safetensors")
    g = torch.Generator().manual_seed(4)
    latent, caption = torch.randn(4, 8, 8, generator=g), torch.randn(20, 32, generator=g)
    reads = []
    Checkpoint.read_into, original = (lambda self, n, out, readers=None:
                                                 (reads.append(n), original(self, n, out, readers))), \
        Checkpoint.read_into
    try:
        streamed = model.to("cpu", budget_bytes=3 * staged_bytes(model.blocks[0]))
    finally:
        Checkpoint.read_into = original
    assert isinstance(streamed.blocks, StreamedBlocks) and sum(streamed.blocks.resident) == 1
    # each streamed block is staged once: out and down (weights and scales; no biases) and its four norms from
    # the file; the resident one's go from the file straight to the device (the host holds only what the device
    # does not)
    assert len(reads) == 4 * 8 and any(r.endswith("feed_forward.w2.weight_scale") for r in reads)
    assert torch.equal(streamed.output(latent, 0.5, caption), model.output(latent, 0.5, caption))
