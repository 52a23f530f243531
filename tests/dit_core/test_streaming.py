"""Block streaming's memory (issue 5): the host holds only what the device does not, in one buffer per batch
of blocks; re-planning for a new budget; the placement generation a CUDA graph is captured at; FLUX.3 Klein's
joint blocks streamed under the step cache and reference slots; the bytes a pass needs; and the streamed runs on
a GPU (pytest -m gpu)."""
import pytest
import torch
from safetensors.torch import save_file
from test_staging import A, gpu_blocks, inputs, run
from tiny_models import FLUX3_TINY, flux3_bfl_layout, random_flux3, random_z_image, z_image_comfy_layout

from dit_core.gpu.block import GpuBlock
from dit_core.families.flux3_klein import Flux3Klein
from dit_core.families.z_image import ZImage
from dit_core.sampling.klein import sample_klein
from dit_core.sampling.schedules import klein_sigmas
from dit_core.gpu.staging import Carrier, host_buffer, staged_bytes, to_card
from dit_core.sampling.step_cache import StepCache
from dit_core.gpu.streaming import StreamedBlocks, pass_bytes, resident_generation, spread
from dit_core.weights import TensorSource


def storages(streamed: StreamedBlocks) -> dict[int, int]:
    """The host buffers the staged copies view: storage address -> bytes."""
    return {s.host.untyped_storage().data_ptr(): s.host.untyped_storage().nbytes()
            for s in streamed._staged if s is not None}


def test_host_holds_only_what_streams_in_one_buffer():
    blocks = gpu_blocks("int8", same=True, n=8)
    size = staged_bytes(blocks[0])
    streamed = StreamedBlocks(blocks, "cpu", 4 * size + 2 * size)  # 4 resident, 4 streamed
    assert streamed.resident == spread(8, 4)
    assert list(storages(streamed).values()) == [4 * size] == [streamed.host_bytes()]
    # blocks that leave are staged together in one more buffer; their copies stay when they come back
    assert streamed.free(2 * size) == 2 * size
    assert sorted(storages(streamed).values()) == [2 * size, 4 * size] and streamed.host_bytes() == 6 * size
    assert streamed.refill() == 2 * size and streamed.host_bytes() == 6 * size


def test_budget_from_a_function_of_the_total():
    blocks = gpu_blocks("bf16", same=True)
    size, asked = staged_bytes(blocks[0]), []
    streamed = StreamedBlocks(blocks, "cpu", lambda total: asked.append(total) or total // 2)
    assert asked == [len(blocks) * size] and streamed.budget == len(blocks) * size // 2
    assert streamed.device_bytes() <= streamed.budget


def test_refill_replans_for_a_new_budget_with_the_same_output():
    blocks = gpu_blocks("int8")
    x, mods, seq = inputs()
    resident = run(blocks, x, mods, seq)
    sizes = [staged_bytes(b) for b in blocks]
    streamed = StreamedBlocks(blocks, "cpu", sum(sizes))
    assert all(streamed.resident) and streamed.device_bytes() == sum(sizes)  # all fit: no slots
    for budget in (2 * max(sizes), 4 * max(sizes), sum(sizes), 3 * max(sizes)):
        streamed.refill(budget)
        assert streamed.device_bytes() <= budget and streamed.resident == streamed.wanted
        assert torch.equal(run(streamed, x, mods, seq), resident)
    with pytest.raises(ValueError, match="cannot stream"):
        streamed.refill(max(sizes))


def test_generation_counts_every_move_of_the_device_buffers():
    blocks = gpu_blocks("int8", same=True, n=4)
    size = staged_bytes(blocks[0])
    streamed = StreamedBlocks(blocks, "cpu", 4 * size)
    assert all(streamed.resident) and streamed.generation == 0 == resident_generation(streamed)
    assert streamed.refill() == 0 and streamed.generation == 0  # nothing moved
    streamed.free(size)  # one block leaves: the others stay, but a graph over all of them is stale
    assert streamed.generation == 1 and resident_generation(streamed) is None
    streamed.refill()
    assert all(streamed.resident) and resident_generation(streamed) == streamed.generation == 2
    streamed.refill(3 * size)  # room for one block besides the two slots: three leave
    assert streamed.generation == 3 and sum(streamed.resident) == 1 and resident_generation(streamed) is None
    streamed.free(10 * size)  # every block leaves, then the slots go
    assert streamed.generation == 5 and not any(streamed.resident)
    streamed.refill(4 * size)  # all come back
    assert streamed.generation == 6 == resident_generation(streamed)
    assert resident_generation(tuple(blocks)) == 0 == resident_generation(list(blocks))  # they never move


def test_layouts_from_meta_equal_the_converted_blocks():
    blocks = [b.quantized() if i % 2 else b for i, b in enumerate(ZImage.load(
        TensorSource(z_image_comfy_layout(random_z_image(n_layers=4).state_dict()))).blocks)]
    streamed = StreamedBlocks(blocks, "cpu", 3 * staged_bytes(GpuBlock.of(blocks[0], torch.device("cpu"))),
                              form=GpuBlock.of)
    assert streamed._bytes == [staged_bytes(GpuBlock.of(b, torch.device("cpu"))) for b in blocks]


@pytest.mark.parametrize("cache,refresh", [(0.0, 0), (0.5, 2)])
def test_flux3_klein_streams_its_joint_blocks(tmp_path, cache, refresh):
    pytest.importorskip("diffusers")
    save_file(flux3_bfl_layout(random_flux3(seed=5, num_single_layers=5).state_dict()), tmp_path / "k.safetensors")
    model = Flux3Klein.load(tmp_path / "k.safetensors")
    size = staged_bytes(model.blocks[0])
    streamed = model.to("cpu", budget_bytes=2 * size + 2 * size)
    assert isinstance(streamed.blocks, StreamedBlocks) and sum(streamed.blocks.resident) == 2
    g = torch.Generator().manual_seed(6)
    c, text = FLUX3_TINY["in_channels"], FLUX3_TINY["joint_attention_dim"]
    noise, rows = torch.randn(c, 4, 6, generator=g), torch.randn(9, text, generator=g)
    refs = [torch.randn(c, 4, 4, generator=g)]
    on_use = Flux3Klein.load(tmp_path / "k.safetensors", blocks_on_use=True).to("cpu", budget_bytes=4 * size)
    outs = [sample_klein(m, noise, klein_sigmas(6), rows, refs, StepCache(cache), refresh)
            for m in (model, streamed, on_use)]
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])


def test_pass_bytes_grow_with_the_rows():
    small, large = pass_bytes(A, 1000), pass_bytes(A, 9000)
    assert (256 << 20) < small < large
    assert large - small >= 8000 * 4 * A.hidden * 4  # at least the f32 residual streams


# --- on the device (pytest -m gpu) -----------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_host_buffers_are_pinned_at_their_exact_size():
    # registered with cudaHostRegister, not torch's pinned allocator, which rounds up to a power of two
    nbytes = (3 << 20) + 768
    buffer = host_buffer(nbytes)
    assert buffer.is_pinned() and buffer.numel() == nbytes
    device = torch.arange(nbytes, device="cuda").to(torch.uint8)
    buffer.copy_(device)
    back = torch.empty_like(device)
    back.copy_(buffer, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, device)

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["int8", "bf16"])
@pytest.mark.parametrize("percent", [50, 25, 0])
def test_streamed_forward_equals_resident_on_gpu(fmt, percent):
    blocks = gpu_blocks(fmt, "cuda", n=8)
    x, mods, seq = inputs(rows=1000, device="cuda")
    resident = run(blocks, x, mods, seq)
    size = staged_bytes(blocks[0])
    streamed = StreamedBlocks(blocks, "cuda", 8 * size * percent // 100 + 2 * size)
    for _ in range(3):
        assert torch.equal(run(streamed, x, mods, seq), resident)
    streamed.free(10 ** 12)
    assert torch.equal(run(streamed, x, mods, seq), resident)
    streamed.refill()
    assert torch.equal(run(streamed, x, mods, seq), resident)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_z_image_streamed_on_gpu_equals_resident():
    state = z_image_comfy_layout(random_z_image(n_layers=6, dim=768, n_heads=6, axes_dims=[32, 48, 48]).state_dict())
    host = ZImage.load(TensorSource(state), linears="int8")
    latent, caption = torch.randn(4, 32, 24, device="cuda"), torch.randn(77, 32, device="cuda")
    resident = host.to("cuda").output(latent, 0.5, caption)
    size = staged_bytes(GpuBlock.of(host.blocks[0], torch.device("cpu")))
    on_use = ZImage.load(TensorSource(state), linears="int8", blocks_on_use=True)  # blocks read as they are placed
    for budget in (4 * size, 2 * size):
        assert torch.equal(host.to("cuda", budget_bytes=budget).output(latent, 0.5, caption), resident)
        assert torch.equal(on_use.to("cuda", budget_bytes=budget).output(latent, 0.5, caption), resident)
    assert torch.equal(on_use.to("cuda").output(latent, 0.5, caption), resident)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_carrier_takes_host_bytes_to_the_card_in_turns():
    carrier, g = Carrier(chunk=4096), torch.Generator().manual_seed(6)
    for n in (1, 4096, 4097, 3 * 4096 + 5):  # within a chunk, one whole, over one, several and a part
        src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        dest = torch.empty(n, dtype=torch.uint8, device="cuda")
        carrier.carry(src, dest)
        assert torch.equal(dest.cpu(), src)
    t = torch.randn(1000, 700, generator=g).to(torch.bfloat16)  # over CARRIED: through the loads' carrier
    assert torch.equal(to_card(t, "cuda").cpu(), t) and torch.equal(to_card(t[:3], "cuda").cpu(), t[:3])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_carrier_reads_a_file_tensor_from_the_file(tmp_path, monkeypatch):
    """A tensor that is still its file's stored bytes (Checkpoint.views) is read from the file in chunks by the
    carrier's readers, not copied through the map; anything else (converted at load) is copied as before."""
    from safetensors.torch import save_file
    from dit_core.gpu import staging
    from dit_core.weights import Checkpoint
    g = torch.Generator().manual_seed(7)
    t = torch.randn(3 * 1000 + 1, 700, generator=g).to(torch.bfloat16)
    save_file({"t": t}, tmp_path / "t.safetensors")
    ckpt, ranges = Checkpoint(tmp_path / "t.safetensors"), []
    monkeypatch.setattr(staging, "CARRIER", staging.Carrier(chunk=1 << 20))
    monkeypatch.setattr(ckpt, "read_into", lambda name, out, readers=None, offset=None, f=ckpt.read_into: (
        ranges.append((offset, out.numel())), f(name, out, readers, offset)))
    stored = ckpt.get("t")
    assert torch.equal(to_card(stored, "cuda", (ckpt, "t")).cpu(), t)
    assert len(ranges) == 5 and ranges[-1] == (4 << 20, t.numel() * 2 - (4 << 20))
    converted = stored.float()
    assert torch.equal(to_card(converted, "cuda", (ckpt, "t")).cpu(), converted) and len(ranges) == 5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_carrier_first_used_in_inference_mode_serves_a_thread_outside_it():
    """ComfyUI loads in inference mode while a stand-in's builds run beside the load on a thread outside it: the
    carrier's buffers, made by whichever comes first, take both (in the H100 server, buffers made as inference
    tensors refused the builder thread's writes)."""
    import threading
    carrier, src = Carrier(chunk=4096), torch.arange(10000, dtype=torch.int32).view(torch.uint8)
    first, beside = torch.empty_like(src, device="cuda"), torch.empty_like(src, device="cuda")
    with torch.inference_mode():
        carrier.carry(src, first)
    thread = threading.Thread(target=carrier.carry, args=(src, beside))
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    assert torch.equal(first.cpu(), src) and torch.equal(beside.cpu(), src)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_free_gives_the_device_memory_back_and_refill_takes_it_again():
    blocks = gpu_blocks("int8", n=8, same=True)  # host GpuBlocks: copied to the device as StreamedBlocks load
    x, mods, seq = inputs(rows=1000, device="cuda")
    streamed = StreamedBlocks(blocks, "cuda", 10**12)
    resident = run(streamed, x, mods, seq)
    assert all(streamed.resident) and streamed.host_bytes() == 0
    before = torch.cuda.memory_allocated()
    freed = streamed.free(10**12)
    assert freed == streamed.total_bytes() and before - torch.cuda.memory_allocated() >= freed
    assert all(s.host.is_pinned() for s in streamed._staged)
    assert torch.equal(run(streamed, x, mods, seq), resident)  # streams through the slots meanwhile
    streamed.refill()
    assert all(streamed.resident) and torch.equal(run(streamed, x, mods, seq), resident)


def test_blocks_read_on_use_stop_with_a_failed_read():
    """A read that fails while blocks are read in turn (a Cancel: the file's check raises in the read-ahead thread)
    reaches the caller as raised, no later block is read, and the read-ahead thread is gone with the iteration."""
    import gc
    import threading

    from dit_core.weights import BlocksOnUse

    class Cancelled(Exception):
        pass

    reads = []

    def read(i):
        reads.append(i)
        if i == 2:
            raise Cancelled
        return torch.full((2,), float(i))
    blocks = BlocksOnUse(read, shapes=(None,) * 5)
    with pytest.raises(Cancelled):
        [b.sum() for b in blocks]
    gc.collect()
    assert reads == [0, 1, 2]
    assert not [t for t in threading.enumerate() if t.name.startswith("SwiftDiT block read")]
    assert [float(b[0]) for b in blocks.reading([4, 0])] == [4.0, 0.0] and blocks[-1][0] == 4.0
